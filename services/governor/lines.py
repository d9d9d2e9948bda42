"""The governor's lines: what it holds and has parked, per domain and per job, and how long a
task may stay parked.

Pure bookkeeping (no broker, no clock of its own: every call is given `now`), kept apart from
the wiring in `app.py` so it is type-checked strictly and tested without a broker. A domain's
line holds, per job, the tasks taken from a shard and not yet released (`Held`, each with
the future its handler waits on) and an estimate of those parked in the delay tiers; the
dispatcher picks a job by stride scheduling over `JobLine.served`, and `park_delay` says how
long a parked task may stay away without leaving the domain idle.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from hutch.amqp import Delivery
from hutch.models import Task

PACE_SECONDS = 5  # whole seconds over which a busy domain's peak pace is measured
PACE_MARGIN = 2.0  # parked tasks come back in time for twice that pace...
RETURN_MARGIN = 1.5  # ...a task back from a park that finds its hold full, for 1.5 times it
PACED_PARK_MAX = 30.0  # seconds: the longest park of a domain its pace, not its rate, holds back...
PARK_BUDGET = 100.0  # ...or all it holds and parked over this: about this many such parks a second at most
EXACT_LEAD = 1.0  # seconds before its turn an exactly timed park comes back (`park_slot`)
RETURN_ROOM = 64  # tasks a paced domain may hold past its hold, when they come back from a park
RATE_BOUND = 0.9  # a domain that released this share of its rate in a recent second is held back by its rate


def park_delay(
    jl: JobLine,
    now: float,
    share: float,
    rate: float,
    pace: float | None,
    blocked_until: float,
    longest: float = PACED_PARK_MAX,
    margin: float = PACE_MARGIN,
) -> float:
    """How long a task of `jl` may stay parked: until the job's tasks held and parked before
    it would run out at its share of the domain's pace (a longer wait would leave the domain
    idle while work waits in a tier), or the domain's long wait, whichever is later.

    The pace is the rate unless the domain is measured to drain much slower: a domain with
    no binding limit, paced by its fetches, would otherwise have every parked task sent to
    the shortest tier, and back, and parked again, many times over. Taken with a margin
    (`PACE_MARGIN` times the measured pace): a domain speeds up when others sharing the
    fetchers finish, and a task parked too long leaves it idle, which costs more than a task
    parked once more. A task that came back from a park to a full hold is parked again with
    `margin` at `RETURN_MARGIN`: it came back early, and at twice the peak pace, rounded down
    to a tier, returns came 4-5 times as fast as the domain drained (docs/benchmarks.md,
    fifth round). And at most `longest`: the pace is a guess about the fleet (a busy
    machine made it look four times slower than it became), a rate is a fact. The governor
    gives `longest` as `PACED_PARK_MAX`, or everything it holds and has parked over
    `PARK_BUDGET` when that is longer: each such park costs a publish, and with a fixed cap
    a backlog of B tasks costs B / 30 parks a second (100,000 tasks: 3,300 a second, more
    than the governor and the broker can do), with this one about `PARK_BUDGET`."""
    if paced(rate, pace, margin):
        assert pace is not None
        share *= margin * pace / rate
        return max(min(jl.supply(now, share), longest), blocked_until - now)
    return max(jl.supply(now, max(share, 1e-6)), blocked_until - now)


def paced(rate: float, pace: float | None, margin: float) -> bool:
    """Whether a domain's parks are timed by its measured pace (with `margin`), not its rate."""
    return pace is not None and 0 < margin * pace < rate


def return_room(pace: float, horizon: float) -> int:
    """How many tasks back from a park a domain paced below its rate may hold past its hold
    limit (`RETURN_ROOM`, at most its pace over `horizon` seconds, so that they wait held no
    longer than the hold's own horizon).

    Its parks are timed by its busiest recent second, about a fifth above its mean, so its
    returns come early by design (the margins that keep it from idling): with a hold of
    about one second of its pace, most found it full and were parked again, 352-411 a second
    against 177-192 permits on small pages. Held a little longer instead, they are released
    in their turn: 204-243 parked again, 7.10-7.53 ms of CPU a page against 7.64-7.93
    (docs/benchmarks.md, seventh round). Not for a domain whose rate binds: its parks come
    back exactly in time, and at a slow rate the room would be minutes of the shard's
    window held by one domain."""
    return max(0, min(RETURN_ROOM, math.ceil(pace * horizon)))


def park_slot(
    delays: tuple[float, ...], heads: dict[float, float], now: float, wanted: float, exact: bool = True
) -> tuple[float, float]:
    """The park queue (by its tier's delay) and the delay for a task to be away about
    `wanted` seconds, and `heads` updated: when the last park put in each queue expires.

    Exact parks come back `EXACT_LEAD` early: `JobLine.supply` counts a return from the end
    of the whole second it is due in, so a task due back the moment the supply before it
    runs out looks a gap late, and every task parked after it was sent to come back at that
    same moment: on the rate-limited benchmark, 22-41 of the 58-71 tasks a second back from
    a park found their hold full and were parked again. A second early keeps each return inside
    the supply before it, and the hold (`HUTCH_HOLD_HORIZON` seconds of the rate) has room
    for a second of returns: none was parked again (docs/benchmarks.md, sixth round).

    A park may expire sooner than its queue's TTL, but the broker expires a message only at
    the head of its queue: it stays behind any message put in before it until that one
    expires. So a queue takes a park for exactly `wanted` only if every park in it expires
    by then (its `heads` entry), and of those the one whose last park expires latest (the
    others stay free for shorter parks; among empty ones, the shortest tier). Where none
    can, the longest tier not longer than `wanted`, for its whole TTL, which never waits
    behind another: the task comes back early and is parked again, as before the park
    queues (one tier below `wanted` at most 2.5 times shorter, `park_ladder`). Never
    shorter than the shortest tier: a task parked for a few milliseconds would be back,
    and parked again, at once.

    Not `exact` (a wait timed by a domain's measured pace, a guess): the longest tier not
    longer than `wanted`, always. Coming back early there is part of the margin: parked for
    exactly their pace's wait, with the same margins, the domains of a small-page run
    waited for their last parked tasks 2-4 s after the others had finished, against
    0.2-0.8 s (docs/benchmarks.md, sixth round)."""
    if exact:
        wanted -= EXACT_LEAD
    wanted = max(wanted, delays[0])
    until = now + wanted
    fits = [d for d in delays if exact and d >= wanted and heads.get(d, 0.0) <= until]
    if fits:
        tier = max(fits, key=lambda d: (heads.get(d, 0.0), -d))
        heads[tier] = until
        return tier, wanted
    tier = [d for d in delays if d <= wanted][-1]
    heads[tier] = max(heads.get(tier, 0.0), now + tier)
    return tier, tier


def back_by(now: float, delay: float) -> int:
    """The whole second a task parked at `now` for `delay` seconds is back by
    (`JobLine.returns`). Rounded up: `supply` counts a return from the start of its second,
    so a task parked at 12.9 s for 10 s counted as back at 22 s made a domain idle until
    22.9 s."""
    return math.ceil(now + delay)


def let_go(held: Held, action: Action, value: Any = None) -> None:
    """Tell a held task's handler what to do, once."""
    if not held.decided.done():
        held.decided.set_result((action, value))


Action = Literal["release", "park", "paused", "dead", "drop", "return"]
# What one turn of the dispatcher did for a domain (`gate`: waits for the fleet's capacity).
Decided = Literal["empty", "release", "dead", "drop", "gate", "wait", "parked"]


@dataclass
class Held:
    """A task taken from a shard, its message unacked, waiting for the dispatcher's word."""

    task: Task
    message: Delivery
    since: float
    decided: asyncio.Future[tuple[Action, Any]]


@dataclass(slots=True)
class Copies:
    """What a governor knows of the copies of a task out of a `Parked` that a governor died
    holding: when it first saw one, the message of the copy it holds now, and whether a copy
    has gone on (released, parked again, ended). Any other copy is let go."""

    first: float
    holder: Delivery | None = None
    passed: bool = False


@dataclass
class ParkBundle:
    """Parks being gathered into one message (`Parked`): one domain's, into one park queue
    (`tier`), due back in one whole second (`back`). It expires as its earliest park would
    (`away`); `sent` is done when the broker has it."""

    tier: float
    away: float
    back: int
    sent: asyncio.Future[None]
    tasks: list[Task] = field(default_factory=list)
    sending: bool = False

    def add(self, task: Task, away: float) -> None:
        self.tasks.append(task)
        self.away = min(self.away, away)


@dataclass
class JobLine:
    """One job's tasks in one domain: held here, and (an estimate) parked in the tiers."""

    held: collections.deque[Held] = field(default_factory=collections.deque)
    # When the tasks parked in the tiers come back: whole second -> how many (an estimate:
    # a governor that restarts starts again from none).
    returns: dict[int, int] = field(default_factory=dict)
    served: float = 0.0  # releases divided by the job's weight (stride scheduling)

    def came_back(self, second: int) -> None:
        """One task parked to come back in `second` is back: no longer to come."""
        left = self.returns.get(second, 0) - 1
        if left > 0:
            self.returns[second] = left
        elif left == 0:
            del self.returns[second]

    def parked(self, now: float) -> int:
        for second in [t for t in self.returns if t + 1 <= now]:
            del self.returns[second]  # back by now
        return sum(self.returns.values())

    def supply(self, now: float, share: float) -> float:
        """Seconds of this job's share of the rate that its tasks cover without a gap: those
        held, then those parked, as they come back, as long as each comes back in time."""
        tasks = float(len(self.held))
        for second in sorted(t for t in self.returns if t >= now):
            if tasks < share * (second - now):
                break  # a gap before these come back
            tasks += self.returns[second]
        return tasks / share


@dataclass
class DomainLine:
    jobs: dict[str, JobLine] = field(default_factory=dict)
    seq: int = 0  # the version of its heap entry; an entry with another is stale
    scheduled: bool = False
    blocked_until: float = 0.0  # a long wait (pause, robots.txt, takeover): new tasks park at once
    touched: float = 0.0
    busy_since: float | None = None  # since when it has always had a task held
    releases: dict[int, int] = field(default_factory=dict)  # whole second -> releases in it (the last few)
    # Park queue (by its delay) -> when this domain's last park put in it comes back.
    parked_in: dict[float, float] = field(default_factory=dict)

    def held_count(self) -> int:
        return sum(len(j.held) for j in self.jobs.values())

    def released(self, now: float) -> None:
        second = int(now)
        self.releases[second] = self.releases.get(second, 0) + 1
        if len(self.releases) > PACE_SECONDS + 1:
            for old in [t for t in self.releases if t < second - PACE_SECONDS]:
                del self.releases[old]

    def parked_at(self, tier: float, until: float) -> None:
        """One of its tasks is parked in `tier`'s queue until `until`."""
        self.parked_in[tier] = max(self.parked_in.get(tier, 0.0), until)

    def starved(self, now: float, rate: float) -> bool:
        """Whether it is idle for want of its own parked tasks: nothing held, no long wait,
        and not held back by its rate (no recent second near it), so a task here now would
        be released as soon as the fleet has room. Its parks were timed by a pace that has
        since risen (the other domains sharing the fetchers finished, or its first seconds
        were measured slow): they would leave it idle until they expire (`Governor._recall`)."""
        if self.held_count() or self.blocked_until > now:
            return False
        recent = [n for t, n in self.releases.items() if t >= int(now) - PACE_SECONDS]
        return max(recent, default=0) < RATE_BOUND * rate

    def parks_out(self, after: float) -> list[float]:
        """The park queues (by delay, longest first) holding its parks due back after `after`."""
        return sorted((tier for tier, until in self.parked_in.items() if until > after), reverse=True)

    def pace(self, now: float) -> float | None:
        """The most releases in one whole second of the last few, counting only seconds it
        was busy throughout (always a task held): the pace the fleet can drain it at when
        its concurrency cap, its fetch time or the fetchers' capacity keep it below its
        rate. The peak, not the mean: a moment the fleet was full must not make the domain
        look slow (its parked tasks would then come back too late). None until it has been
        busy for a whole second."""
        if self.busy_since is None:
            return None
        first, last = int(self.busy_since) + 1, int(now) - 1
        counts = [self.releases.get(t, 0) for t in range(max(first, last - PACE_SECONDS + 1), last + 1)]
        return float(max(counts)) if counts else None


RunState = Literal["running", "paused", "cancelled"]
STATE_AFTER: dict[str, RunState] = {"pause": "paused", "resume": "running", "cancel": "cancelled"}


@dataclass
class JobState:
    state: RunState = "running"
    state_at: float = 0.0
    weight: float = 1.0
    weight_at: float = 0.0
