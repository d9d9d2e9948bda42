"""The governor's decisions, with no broker: may this domain's held task be released now?

`Core` holds every per-domain fact the governor acts on, all rebuilt from events after a
restart: the token bucket and adaptive rate of each domain key, its pause, its in-flight
leases, the robots.txt cache, the fetchers' capacity, and for each domain whether
this governor may release from it yet (takeover). `check` answers for one held task;
`commit` records a release the caller is about to publish; the `on_*` methods take the
events every governor hears. The clock is injected (wall-clock seconds, as in permits and
events), so every rule is tested with a fake one.

Takeover rule. A governor that starts releasing a domain (its first task since it last
forgot the domain) waits until no permit another governor issued for it can still be used:
one permit lifetime after the last release by another governor that it heard of. It hears
of them live, and at start it reads the releases of the last permit lifetimes from the
`released.log` stream before it releases anything, so a restart or a new standby knows
what the fleet has in flight and never bursts; a domain no one released lately is released
at once.

A little over the house's 400 lines: every rule that decides a release is here, on purpose,
so the order in which `check` applies them reads top to bottom in one place.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Literal

from hutch.models import Event, FetcherHeartbeat, Permit, RobotsFetched, Task
from hutch.services.governor.aimd import AdaptiveRate
from hutch.services.governor.buckets import TokenBucket
from hutch.services.governor.capacity import FleetCapacity
from hutch.services.governor.leases import Leases
from hutch.services.governor.limits import DomainLimit, Limits
from hutch.services.governor.robots import RobotsCache, origin_of, robots_url

Clock = Callable[[], float]
NEVER = -math.inf
ROBOTS_JOB = "_robots"


@dataclass
class KeyState:
    """Everything about one domain key (a host, or a registrable domain)."""

    limit: DomainLimit
    bucket: TokenBucket
    aimd: AdaptiveRate
    paused_until: float = 0.0
    pause_why: str = ""
    robots_cap: float | None = None
    released: int = 0
    throttled: int = 0
    queues: set[str] = field(default_factory=set)
    fetch_time: float | None = None  # mean seconds a fetch takes (moving average of outcomes)


@dataclass
class QueueState:
    """This governor's view of one domain."""

    last_foreign_release: float = NEVER
    active: bool = False
    cold_until: float = 0.0


Action = Literal["release", "wait", "dead", "drop"]
# Why a domain waits: a takeover's first permit lifetime, a pause (429/503 or a job control's),
# its robots.txt, its concurrency cap, its rate, or the fleet's capacity.
WaitReason = Literal["takeover", "pause", "robots", "concurrency", "rate", "capacity"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    until: float = 0.0
    why: str = ""  # in words, for the log and a dead letter's detail
    robots: str | None = None  # release: fetch this origin's robots.txt instead of the task
    reason: WaitReason | None = None  # wait: why
    # wait: for a fetch in flight to end; `until` is the worst case (the first lease's
    # expiry), and an outcome usually ends it long before
    in_flight: bool = False

    @property
    def gate(self) -> bool:
        """A wait for the fleet's capacity: served in arrival order when it comes back."""
        return self.reason == "capacity"


RELEASE = Verdict("release")
DROP = Verdict("drop")


def robots_task_id(origin: str) -> str:
    return "robots-" + hashlib.sha256(origin.encode()).hexdigest()[:24]


@dataclass
class CoreConfig:
    permit_ttl: float = 30.0
    fetch_deadline: float = 40.0  # after a permit expires, longest its fetch may still run
    default_pause: float = 30.0
    max_pause: float = 600.0
    aimd_decrease: float = 0.5
    aimd_increase: float = 0.05
    aimd_streak: int = 2
    min_rate: float = 0.05
    max_ready: int = 200
    permit_lateness: float = 0.05
    permit_lead: float = 0.25  # seconds before its token is due a permit may be issued


MIN_LATE_AFTER = 0.01  # seconds: a tighter bound on a permit's lateness is not given


DEFAULT_FETCH_TIME = 1.0  # seconds a fetch is assumed to take in a domain before one is measured


def late_after(rate: float, burst: int, lateness: float) -> float | None:
    """How late a permit may be fetched, in seconds, without any 1-second window at the site
    holding more than `rate + burst` requests.

    Releases a bucket lets out are at most `rate + burst` in any second. A fetch that comes
    up to `L` seconds after its release widens the window the releases can come from to
    `1 + L` seconds: `floor(rate x (1 + L) + burst)` requests, which stays `floor(rate +
    burst)` while `rate x L` is below what `rate + burst` lacks of the next whole number.
    Hence at most 0.9 of that, and at most `lateness`. None (no bound) where that is below
    `MIN_LATE_AFTER`: at such a rate (above about 90 a second) the pipeline's own jitter is
    larger, and most permits would go back unused."""
    room = 1.0 - (rate + burst) % 1.0
    bound = min(lateness, 0.9 * room / rate)
    return bound if bound >= MIN_LATE_AFTER else None


class Core:
    def __init__(
        self,
        governor_id: str,
        limits: Limits,
        *,
        clock: Clock,
        config: CoreConfig | None = None,
        key_of: Callable[[str], str] = lambda domain: domain,
        robots: RobotsCache | None = None,
        capacity: FleetCapacity | None = None,
    ) -> None:
        self.id = governor_id
        self.limits = limits
        self.clock = clock
        self.config = config or CoreConfig()
        self.key_of = key_of
        self.robots = robots
        self.capacity = capacity or FleetCapacity()
        self.leases = Leases()
        self.keys: dict[str, KeyState] = {}
        self.queues: dict[str, QueueState] = {}
        self.started = clock()
        self.ready_depth = 0  # messages waiting in fetch.ready at the last look
        self.released_since_look = 0
        self._serial = itertools.count(1)

    # -- state -------------------------------------------------------------------------

    def key_state(self, key: str) -> KeyState:
        state = self.keys.get(key)
        if state is None:
            limit = self.limits.for_key(key)
            c = self.config
            aimd = AdaptiveRate(
                limit.rate,
                decrease=c.aimd_decrease,
                increase=c.aimd_increase,
                streak_limit=c.aimd_streak,
                floor=c.min_rate,
            )
            state = self.keys[key] = KeyState(limit, TokenBucket(limit.rate, limit.burst, self.clock), aimd)
        return state

    def queue(self, domain: str) -> QueueState:
        state = self.queues.get(domain)
        if state is None:
            state = self.queues[domain] = QueueState()
            self.key_state(self.key_of(domain)).queues.add(domain)
        return state

    @property
    def lease_extra(self) -> float:
        return self.config.fetch_deadline

    # -- takeover ----------------------------------------------------------------------

    def takeover_until(self, domain: str) -> float:
        q = self.queue(domain)
        return q.last_foreign_release + self.config.permit_ttl

    def activate(self, domain: str) -> float:
        """A message of this queue reached us: if we were not releasing it, this is a takeover."""
        q = self.queue(domain)
        if not q.active:
            q.active = True
            q.cold_until = self.takeover_until(domain)
            if q.cold_until > self.clock():
                self.key_state(self.key_of(domain)).bucket.empty()
        return q.cold_until

    def idle(self, domain: str) -> bool:
        """Nothing of this domain's key is in flight or paused: forgetting it loses nothing
        but its adaptive rate (which starts again from the limit)."""
        key = self.key_of(domain)
        ks = self.keys.get(key)
        if ks is None:
            return True
        return self.leases.count(key) == 0 and ks.paused_until <= self.clock()

    def forget(self, domain: str) -> None:
        """Drop this domain's state (an idle domain costs nothing); its key's when it was the last."""
        self.queues.pop(domain, None)
        if self.robots is not None:
            for scheme in ("http", "https"):  # fetched again when the domain comes back
                state = self.robots.origins.get(f"{scheme}://{domain}")
                if state is not None and state.phase != "fetching":
                    del self.robots.origins[f"{scheme}://{domain}"]
        key = self.key_of(domain)
        ks = self.keys.get(key)
        if ks is not None:
            ks.queues.discard(domain)
            if not ks.queues and self.leases.count(key) == 0 and ks.paused_until <= self.clock():
                del self.keys[key]

    def deactivate(self, domain: str) -> None:
        """We stopped consuming this queue (a pause); another governor may release it meanwhile."""
        self.queue(domain).active = False

    # -- the decision ------------------------------------------------------------------

    def check(self, task: Task, domain: str) -> Verdict:
        now = self.clock()
        q = self.queue(domain)
        if now < q.cold_until:
            return Verdict("wait", q.cold_until, "takeover: waiting one permit lifetime", reason="takeover")
        key = self.key_of(domain)
        ks = self.key_state(key)
        if now < ks.paused_until:
            return Verdict("wait", ks.paused_until, ks.pause_why, reason="pause")
        fetch_robots: str | None = None
        if task.purpose == "robots":
            if not self._robots_needed(task):
                return DROP
        elif self.robots is not None:
            url = task.fetch_url or task.url
            verdict, until, why = self.robots.check(url, now)
            if verdict == "deny":
                return Verdict("dead", why=why)
            if verdict == "wait":
                # Held, not parked for the fetch's deadline: its answer wakes the domain.
                return Verdict("wait", until, why, reason="robots", in_flight=self.robots.in_flight(url))
            if verdict == "fetch":
                fetch_robots = origin_of(url)
        if self.leases.count(key) >= ks.limit.concurrency:
            until = self.leases.next_expiry(key) or now + 1.0
            return Verdict(
                "wait", until, f"{ks.limit.concurrency} fetches in flight", reason="concurrency", in_flight=True
            )
        wait = ks.bucket.wait_time()
        if wait > self.config.permit_lead:
            # Issued up to `permit_lead` ahead, with the time its token is due: the pipeline's
            # delay is then spent before that time rather than after it.
            return Verdict("wait", now + wait - self.config.permit_lead, "rate", reason="rate")
        if not self.capacity_free(now):
            return Verdict("wait", now + 1.0, "fetchers busy", reason="capacity")
        return Verdict("release", robots=fetch_robots) if fetch_robots else RELEASE

    def _robots_needed(self, task: Task) -> bool:
        if self.robots is None:
            return False
        state = self.robots.origins.get(origin_of(task.url))
        if state is None or state.phase in ("unknown", "failing"):
            return True
        if state.phase == "fetching":
            return state.task_id == task.id and state.until <= self.clock()
        return state.until <= self.clock()  # known, but the cached rules ran out

    def capacity_free(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        if self.leases.total >= self.capacity.total(now):
            return False
        return self.ready_depth + self.released_since_look < self.config.max_ready

    def saw_ready_depth(self, depth: int) -> None:
        """A look at `fetch.ready`: `depth` tasks wait there now, counting every release so far."""
        self.ready_depth = depth
        self.released_since_look = 0

    def fleet(self, now: float) -> tuple[int, int, int]:
        """(fetch slots the live fetchers offer, live fetchers, fetches in flight)."""
        return self.capacity.total(now), self.capacity.live(now), self.leases.total

    def rate_of(self, domain: str) -> float:
        """The domain's current rate (its key's, after AIMD), tasks per second."""
        return self.key_state(self.key_of(domain)).aimd.rate

    def domains_of(self, key: str) -> tuple[str, ...]:
        """The domains known under a limit key (a registrable domain may have several)."""
        ks = self.keys.get(key)
        return tuple(ks.queues) if ks is not None else ()

    def forget_idle(self, keep: Container[str], idle_after: float, now: float) -> None:
        """Forget every domain not in `keep` that no governor released for `idle_after` seconds
        and that holds nothing (its bucket and limits come back fresh when it returns)."""
        for domain in [d for d in self.queues if d not in keep]:
            if now - self.queues[domain].last_foreign_release > idle_after and self.idle(domain):
                self.forget(domain)

    def robots_task(self, origin: str, domain: str) -> Task:
        return Task(id=robots_task_id(origin), job=ROBOTS_JOB, url=robots_url(origin), domain=domain, purpose="robots")

    def commit(self, task: Task, domain: str) -> Task:
        """Take the token and record the lease of a release; the task with its permit, which
        says when its token is due if that is still to come (`check` allows `permit_lead`)."""
        now = self.clock()
        key = self.key_of(domain)
        ks = self.key_state(key)
        due_in = ks.bucket.reserve()
        ks.released += 1
        self.released_since_look += 1
        permit = Permit(
            id=f"{self.id}.{next(self._serial)}",
            issued=now,
            expires=now + self.config.permit_ttl,
            late_after=late_after(ks.aimd.rate, ks.bucket.burst, self.config.permit_lateness),
            not_before=now + due_in if due_in > 0 else None,
        )
        self.leases.add(permit.id, task.id, key, permit.expires + self.lease_extra, own=True)
        if task.purpose == "robots" and self.robots is not None:
            self.robots.fetching(origin_of(task.url), task.id, now)
        return task.model_copy(update={"permit": permit})

    def rollback(self, task: Task) -> None:
        """A release that could not be published: its lease ends (the token stays spent)."""
        if task.permit is not None:
            self.leases.end(task.permit.id)

    # -- events ------------------------------------------------------------------------

    def on_released(self, event: Event) -> str | None:
        """Another governor released a task: it is in flight and spent a token of its key."""
        if event.permit_id is None or event.permit_id.startswith(self.id + "."):
            return None
        now = self.clock()
        key = self.key_of(event.domain)
        ks = self.key_state(key)
        if self.leases.add(
            event.permit_id, event.task_id, key, event.at + self.config.permit_ttl + self.lease_extra, own=False
        ):
            ks.bucket.debit(1.0)
        q = self.queue(event.domain)
        q.last_foreign_release = max(q.last_foreign_release, min(event.at, now))
        return key

    def on_outcome(self, event: Event) -> str | None:
        """A fetcher finished an attempt: its lease ends; 429/503 pause, successes recover."""
        self.leases.end(event.permit_id, event.task_id)
        if event.next == "frontier" and self.robots is not None and event.task_id.startswith("robots-"):
            self.robots.returned(event.task_id, self.clock())
        key = self.key_of(event.domain)
        ks = self.key_state(key)
        if event.outcome == "throttled":
            now = self.clock()
            ks.throttled += 1
            wait = event.retry_after if event.retry_after is not None else self.config.default_pause
            wait = min(max(wait, 0.0), self.config.max_pause)
            until = max(event.at, now - 1.0) + wait
            if until > ks.paused_until:
                ks.paused_until = until
                ks.pause_why = f"paused: HTTP {event.status or '429/503'}" + (
                    f", Retry-After {event.retry_after:g}s" if event.retry_after is not None else ""
                )
            if ks.aimd.throttled(now):
                ks.bucket.set_limits(ks.aimd.rate)
        if event.elapsed is not None and event.elapsed > 0:
            ks.fetch_time = event.elapsed if ks.fetch_time is None else 0.9 * ks.fetch_time + 0.1 * event.elapsed
        if event.outcome == "ok":
            before = ks.aimd.rate
            ks.aimd.succeeded()
            if ks.aimd.rate != before:
                ks.bucket.set_limits(ks.aimd.rate)
        return key

    def on_robots(self, result: RobotsFetched) -> str | None:
        origin = origin_of(result.url)
        self.leases.end(task_id=robots_task_id(origin))
        if self.robots is None:
            return None
        rules = self.robots.result(origin, result.status, result.text, self.clock(), result.outcome)
        key = self.key_of(result.domain)
        ks = self.key_state(key)
        cap = rules.rate_cap if rules is not None else None
        if cap != ks.robots_cap:
            ks.robots_cap = cap
            ceiling = min(ks.limit.rate, cap) if cap else ks.limit.rate
            ks.aimd.set_ceiling(ceiling)
            ks.bucket.set_limits(ks.aimd.rate)
        return key

    def on_heartbeat(self, beat: FetcherHeartbeat) -> None:
        self.capacity.heartbeat(beat.fetcher, beat.concurrency, beat.busy, self.clock())

    def expire(self) -> set[str]:
        """End overdue leases; the keys that got room."""
        return {lease.key for lease in self.leases.expire(self.clock())}

    # -- status ------------------------------------------------------------------------

    def demand(self, backlog: Mapping[str, int]) -> tuple[float, int]:
        """(fetch slots the limits would fill now, fetches in flight for those domains).

        For each domain key not paused with tasks waiting (`backlog`, by domain: what this
        governor holds and has parked), the slots its limits keep busy: min(its concurrency
        cap, its rate x its mean fetch time, its backlog). A domain with no fetch measured yet
        counts `DEFAULT_FETCH_TIME`. Slots wanted minus fetches in flight is the autoscaler's
        demand signal: above zero, the fleet is what holds the limits back, not the limits.
        """
        now = self.clock()
        by_key: dict[str, int] = {}
        for domain, waiting in backlog.items():
            if waiting > 0:
                key = self.key_of(domain)
                by_key[key] = by_key.get(key, 0) + waiting
        wanted = 0.0
        in_flight = 0
        for key, waiting in by_key.items():
            ks = self.key_state(key)
            if ks.paused_until > now:
                continue
            fetch_time = ks.fetch_time if ks.fetch_time is not None else DEFAULT_FETCH_TIME
            wanted += min(float(ks.limit.concurrency), ks.aimd.rate * fetch_time, float(waiting))
            in_flight += self.leases.count(key)
        return wanted, in_flight

    def snapshot(self) -> list[dict[str, object]]:
        now = self.clock()
        rows = []
        for domain, q in self.queues.items():
            key = self.key_of(domain)
            ks = self.key_state(key)
            rows.append(
                {
                    "domain": domain,
                    "key": key,
                    "rate": round(ks.aimd.rate, 4),
                    "ceiling": round(ks.aimd.ceiling, 4),
                    "burst": ks.limit.burst,
                    "concurrency": ks.limit.concurrency,
                    "in_flight": self.leases.count(key),
                    "paused_for": round(max(0.0, ks.paused_until - now), 3),
                    "pause_reason": ks.pause_why if ks.paused_until > now else "",
                    "takeover_wait": round(max(0.0, q.cold_until - now), 3) if q.active else 0.0,
                    "active": q.active,
                    "released": ks.released,
                    "throttled": ks.throttled,
                    "robots_cap": ks.robots_cap,
                }
            )
        return rows
