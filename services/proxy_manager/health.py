"""Proxy health from outcome reports: per proxy, and per (proxy, domain).

Two different things go wrong with a proxy, and they call for different answers:

- the proxy itself fails (refuses, errors, times out: outcome `proxy_failure`). That may be
  the proxy's problem on every site, or one site's doing (a hostile site can make a proxy
  choke), so it counts per (proxy, domain) first: `dead_after` of them in a row on one domain
  ban the proxy for that domain (the same growing cooldown as a block). The proxy is dead for
  everyone only when `dead_after` failures in a row came from at least `dead_domains`
  different domains (or from one, when `dead_after` is below `dead_domains`), or from domains
  that answered other proxies meanwhile (the site is up; this proxy is not): one hostile
  domain, which fails every proxy alike, cannot empty the pool for every other job. A dead
  proxy is leased to nobody until a probe (a real request through it) succeeds, or, with no probe URL configured, until
  `probe_interval` has passed and one trial lease goes well.
  A proxy that resets connections looks to a fetcher like a site that does (a proxy passes
  a site's reset on as a reset), so a fetcher reports `reset`. The manager sees the fleet:
  `2 x dead_after` attempts in a row through one proxy that got no HTTP answer at all
  (reset, timeout, proxy failure), while other proxies did get answers from those domains
  meanwhile, mark the proxy dead too: the sites are up, this proxy is not.
- a site blocks it (outcome `blocked`: a 403 or a block page): that is about this proxy's
  address on this site only. The proxy is banned for that domain; the ban lasts
  `ban_seconds` and doubles with each repeat (a block after the previous ban ended), up to
  `ban_max`. A block reported while the proxy is still banned came from a request sent
  before the ban and changes nothing. Repeats are forgotten after `ban_max` without a block.

Both levels also keep an EWMA of success (1.0 = every recent attempt went well), which the
selection uses to prefer healthy proxies. Times come from the caller's clock (wall-clock
seconds), so the state means the same after a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from hutch.models import Outcome

ALPHA = 0.2  # weight of the newest outcome in the EWMAs

# Outcome -> (sample for the proxy, sample for the (proxy, domain) pair); None = no update.
# Any HTTP answer relayed by the proxy shows that the proxy works; what the site answered
# says how this proxy fares on this site.
SAMPLES: dict[Outcome, tuple[float | None, float | None]] = {
    "ok": (1.0, 1.0),
    "not_found": (1.0, 1.0),
    "client_error": (1.0, 1.0),
    "too_large": (1.0, 1.0),
    "bad_encoding": (1.0, 1.0),
    "redirect": (1.0, 1.0),
    "redirects": (1.0, 1.0),
    "blocked": (1.0, 0.0),
    "throttled": (1.0, 0.5),
    "server_error": (1.0, None),
    "timeout": (0.5, 0.5),
    "reset": (0.5, 0.5),
    "proxy_failure": (0.0, None),
}
NO_ANSWER: tuple[Outcome, ...] = ("proxy_failure", "reset", "timeout")


@dataclass
class ProxyState:
    health: float = 1.0
    failures: int = 0  # proxy failures in a row
    failure_domains: list[str] = field(default_factory=list)  # the domains of that streak (8 at most)
    silent: int = 0  # attempts in a row with no HTTP answer (proxy failures, resets, timeouts)
    silent_since: float = 0.0
    silent_domains: list[str] = field(default_factory=list)
    dead_since: float | None = None
    next_probe: float = 0.0  # dead: when to probe (or, with no probe URL, to try one lease)
    last_used: float = 0.0


@dataclass
class PairState:
    health: float = 1.0
    banned_until: float = 0.0
    bans: int = 0
    last_block: float = 0.0
    next_free: float = 0.0  # the rate cap: no lease for this pair before then
    failures: int = 0  # proxy failures in a row on this domain


@dataclass(frozen=True)
class HealthConfig:
    ban_seconds: float = 60.0
    ban_max: float = 3600.0
    dead_after: int = 3
    dead_domains: int = 2  # distinct domains a streak of proxy failures must span to kill a proxy
    probe_interval: float = 30.0
    active_probe: bool = False  # a probe URL is configured: only a probe revives a dead proxy


@dataclass(frozen=True)
class Change:
    """What a report changed, for the log and for persistence."""

    kind: str  # "banned", "dead", "alive"
    proxy_id: str
    domain: str | None = None
    seconds: float | None = None


class Health:
    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.proxies: dict[str, ProxyState] = {}
        self.pairs: dict[tuple[str, str], PairState] = {}
        self.answered: dict[str, float] = {}  # per domain: when some proxy last got an HTTP answer
        self._pruned = 0.0

    def proxy(self, proxy_id: str) -> ProxyState:
        state = self.proxies.get(proxy_id)
        if state is None:
            state = self.proxies[proxy_id] = ProxyState()
        return state

    def pair(self, proxy_id: str, domain: str) -> PairState:
        key = (proxy_id, domain)
        state = self.pairs.get(key)
        if state is None:
            state = self.pairs[key] = PairState()
        return state

    # -- questions the selection asks -------------------------------------------------------

    def score(self, proxy_id: str, domain: str) -> float:
        proxy = self.proxies.get(proxy_id)
        pair = self.pairs.get((proxy_id, domain))
        return (proxy.health if proxy else 1.0) * (pair.health if pair else 1.0)

    def usable(self, proxy_id: str, now: float) -> bool:
        """Alive, or dead but due for its trial lease (no probe URL configured)."""
        state = self.proxies.get(proxy_id)
        if state is None or state.dead_since is None:
            return True
        return not self.config.active_probe and now >= state.next_probe

    def is_dead(self, proxy_id: str) -> bool:
        state = self.proxies.get(proxy_id)
        return state is not None and state.dead_since is not None

    def banned_until(self, proxy_id: str, domain: str, now: float) -> float | None:
        pair = self.pairs.get((proxy_id, domain))
        if pair is not None and pair.banned_until > now:
            return pair.banned_until
        return None

    def free_at(self, proxy_id: str, domain: str) -> float:
        pair = self.pairs.get((proxy_id, domain))
        return pair.next_free if pair is not None else 0.0

    # -- what a lease and a report change ----------------------------------------------------

    def leased(self, proxy_id: str, domain: str, now: float, interval: float) -> None:
        self.proxy(proxy_id).last_used = now
        pair = self.pair(proxy_id, domain)
        pair.next_free = max(now, pair.next_free) + interval
        state = self.proxies[proxy_id]
        if state.dead_since is not None:
            # The one trial lease of a dead proxy: the next one waits for its outcome or the interval.
            state.next_probe = now + self.config.probe_interval

    def report(self, proxy_id: str, domain: str, outcome: Outcome, now: float) -> list[Change]:
        changes: list[Change] = []
        proxy_sample, pair_sample = SAMPLES.get(outcome, (None, None))
        state = self.proxy(proxy_id)
        if proxy_sample is not None:
            state.health += ALPHA * (proxy_sample - state.health)
        if outcome in NO_ANSWER:
            changes.extend(self._no_answer(proxy_id, state, domain, outcome, now))
        elif proxy_sample == 1.0:
            state.failures = 0
            state.failure_domains = []
            state.silent = 0
            self.answered[domain] = now
            if state.dead_since is not None:
                changes.extend(self.revive(proxy_id))
        if pair_sample is not None:
            pair = self.pair(proxy_id, domain)
            pair.health += ALPHA * (pair_sample - pair.health)
            if outcome not in NO_ANSWER:
                pair.failures = 0
        if outcome == "blocked":
            seconds = self._ban(proxy_id, domain, now)
            if seconds is not None:
                changes.append(Change("banned", proxy_id, domain, seconds))
        return changes

    def _no_answer(self, proxy_id: str, state: ProxyState, domain: str, outcome: Outcome, now: float) -> list[Change]:
        """A proxy that gave no answer: counted silent, then dead everywhere or banned here."""
        if outcome == "proxy_failure":
            self._count_failure(proxy_id, state, domain)
        if state.silent == 0:
            state.silent_since = now
            state.silent_domains = []
        state.silent += 1
        if domain not in state.silent_domains and len(state.silent_domains) < 8:
            state.silent_domains.append(domain)
        if state.dead_since is not None:
            state.next_probe = now + self.config.probe_interval  # its trial lease failed too
        elif self._failing_everywhere(state) or self._failing_alone(state) or self._silent_alone(state):
            state.dead_since = now
            state.next_probe = now + self.config.probe_interval
            return [Change("dead", proxy_id)]
        elif outcome == "proxy_failure" and self.pair(proxy_id, domain).failures >= self.config.dead_after:
            # Failing on this domain only, so far: out of its pool, not everyone's.
            seconds = self._ban(proxy_id, domain, now)
            if seconds is not None:
                return [Change("banned", proxy_id, domain, seconds)]
        return []

    def _count_failure(self, proxy_id: str, state: ProxyState, domain: str) -> None:
        """A proxy failure counts in the proxy's streak (with its domain) and in the pair's."""
        state.failures += 1
        if state.failures == 1:
            state.failure_domains = []
        if domain not in state.failure_domains and len(state.failure_domains) < 8:
            state.failure_domains.append(domain)
        self.pair(proxy_id, domain).failures += 1

    def _failing_everywhere(self, state: ProxyState) -> bool:
        """Proxy failures in a row, from enough different domains that it is not one site's doing."""
        spread = min(self.config.dead_domains, self.config.dead_after)
        return state.failures >= self.config.dead_after and len(state.failure_domains) >= spread

    def _failing_alone(self, state: ProxyState) -> bool:
        """Proxy failures in a row on sites that answered other proxies meanwhile: the sites are
        up and reachable through a proxy, so it is this proxy that fails, not one site's doing."""
        if state.failures < self.config.dead_after:
            return False
        return any(self.answered.get(domain, 0.0) > state.silent_since for domain in state.failure_domains)

    def _silent_alone(self, state: ProxyState) -> bool:
        """No answer through this proxy for a while, though those sites answered other proxies."""
        if state.silent < 2 * self.config.dead_after:
            return False
        return any(self.answered.get(domain, 0.0) > state.silent_since for domain in state.silent_domains)

    def _ban(self, proxy_id: str, domain: str, now: float) -> float | None:
        pair = self.pair(proxy_id, domain)
        if pair.banned_until > now:
            return None  # sent before the ban began: not a repeat
        if now - pair.last_block > self.config.ban_max:
            pair.bans = 0
        pair.bans += 1
        pair.last_block = now
        seconds: float = min(self.config.ban_seconds * 2.0 ** (pair.bans - 1), self.config.ban_max)
        pair.banned_until = now + seconds
        return seconds

    def revive(self, proxy_id: str) -> list[Change]:
        state = self.proxy(proxy_id)
        if state.dead_since is None:
            return []
        state.dead_since = None
        state.failures = 0
        state.failure_domains = []
        state.silent = 0
        state.health = max(state.health, 0.5)
        return [Change("alive", proxy_id)]

    def probe_failed(self, proxy_id: str, now: float) -> None:
        self.proxy(proxy_id).next_probe = now + self.config.probe_interval

    def due_for_probe(self, now: float) -> Iterator[str]:
        for proxy_id, state in self.proxies.items():
            if state.dead_since is not None and now >= state.next_probe:
                yield proxy_id

    # -- persistence --------------------------------------------------------------------------

    def prune(self, now: float) -> None:
        """Forget pairs idle and unblocked for `ban_max` (the dict grows with proxies x domains)."""
        idle = self.config.ban_max
        stale = [
            key
            for key, pair in self.pairs.items()
            if pair.banned_until <= now and now - pair.next_free > idle and now - pair.last_block > idle
        ]
        for key in stale:
            del self.pairs[key]

    def snapshot(self, now: float) -> dict[str, Any]:
        """What is worth a restart: every proxy, and the pairs with a ban (or one to remember
        for the next cooldown) or a poor record; a healthy pair is no different from a new one."""
        if now - self._pruned > 60:
            self.prune(now)
            self._pruned = now
        return {
            "proxies": {pid: asdict(state) for pid, state in self.proxies.items()},
            "pairs": [
                {
                    "proxy": pid,
                    "domain": domain,
                    "health": round(pair.health, 4),
                    "banned_until": pair.banned_until,
                    "bans": pair.bans,
                    "last_block": pair.last_block,
                    "failures": pair.failures,
                }
                for (pid, domain), pair in self.pairs.items()
                if pair.bans > 0 or pair.health < 0.9 or pair.failures > 0
            ],
        }

    def restore(self, data: dict[str, Any]) -> None:
        for pid, fields in (data.get("proxies") or {}).items():
            self.proxies[str(pid)] = ProxyState(**{k: v for k, v in fields.items() if k in ProxyState.__annotations__})
        for entry in data.get("pairs") or []:
            fields = {k: v for k, v in entry.items() if k in PairState.__annotations__}
            self.pairs[(str(entry["proxy"]), str(entry["domain"]))] = PairState(**fields)
