"""Choosing a proxy for one attempt: the proxy-manager's logic, with no broker and an injected clock.

For a lease request on a domain:

1. The tier: the domain's learned tier (see tiers.py), at least the domain's configured
   floor and the job's `tier_floor`; now and then one trial lease on a cheaper tier.
2. In that tier, the proxies that are not dead; of those, the ones that have not failed
   this task (`exclude`). None left: the next costlier tier (a task blocked by every
   datacenter proxy needs a residential one, whatever the domain's tier says).
3. Of those, the ones neither banned for this domain nor at their per-(proxy, domain) rate
   cap. None left: no lease now, `retry_in` says when one frees up. A cap never pushes a
   request to a costlier tier; blocks do, through the domain's tier (step 1): K of them in
   the window, or bans on every proxy of the tier.
4. Of those, the healthy ones (score >= 0.5) first, then the least recently used.

When every proxy of every allowed tier failed this task, the exclusion is dropped rather
than stall the task for good. The rate cap spaces leases of one proxy on one domain at least
`1 / cap` apart, with a margin so that the spacing also holds where the requests arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hutch.models import Event, Lease, LeaseRequest, attempt_outcome
from hutch.services.proxy_manager.health import Change, Health, HealthConfig
from hutch.services.proxy_manager.pool import TIERS, PoolConfig, Proxy
from hutch.services.proxy_manager.tiers import DomainTiers, TierChange, TierConfig

log = logging.getLogger(__name__)

HEALTHY = 0.5
CAP_MARGIN = 1.1  # leases of one pair are 10% further apart than the cap, for arrival jitter
MIN_RETRY = 0.05
MAX_RETRY = 60.0


@dataclass(frozen=True)
class SelectorConfig:
    rate_cap: float = 1.0  # leases per second of one proxy on one domain
    tier_floors: dict[str, str] | None = None  # per domain (settings); the pool file's add to these
    health: HealthConfig = field(default_factory=HealthConfig)
    tiers: TierConfig = field(default_factory=TierConfig)


@dataclass
class _Pick:
    proxy: Proxy | None = None
    wait: float | None = None  # a proxy frees up then
    exhausted: bool = False  # every live proxy of the tier failed this task


class Selector:
    def __init__(self, config: SelectorConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.health = Health(config.health)
        self.tiers = DomainTiers(config.tiers)
        self.proxies: dict[str, Proxy] = {}
        self.by_level: dict[int, list[Proxy]] = {}
        self.pool_floors: dict[str, str] = {}
        self.interval = CAP_MARGIN / config.rate_cap
        self.version = 0  # bumped on every change worth persisting (bans, dead, tiers)
        self.leases = 0
        self._warned: set[str] = set()

    # -- the pool ---------------------------------------------------------------------------

    def set_pool(self, pool: PoolConfig) -> None:
        """Use this pool from now on; health, bans and tiers of proxies kept are kept."""
        self.proxies = {p.id: p for p in pool.proxies}
        self.by_level = {}
        for proxy in pool.proxies:
            self.by_level.setdefault(proxy.level, []).append(proxy)
        self.pool_floors = dict(pool.tier_floors)
        self.tiers.set_levels(sorted(self.by_level))

    def floor(self, domain: str, job_floor: str | None) -> int:
        levels = [0]
        for floors in (self.config.tier_floors or {}, self.pool_floors):
            if domain in floors:
                levels.append(TIERS.index(floors[domain]))
        if job_floor in TIERS:
            levels.append(TIERS.index(job_floor))
        return max(levels)

    # -- leasing ----------------------------------------------------------------------------

    def lease(self, request: LeaseRequest) -> Lease:
        now = self.clock()
        domain = request.domain
        if not self.proxies:
            return Lease(retry_in=MAX_RETRY)
        floor = self.floor(domain, request.tier_floor)
        plan = self.tiers.plan(domain, floor, now)
        if self._banned_out(plan.level, domain, now):
            change = self.tiers.exhausted(domain, plan.level, now)
            if change is not None:
                self.version += 1
                log.info("domain %s", change)
                plan = self.tiers.plan(domain, floor, now)
        exclude = set(request.exclude)
        if plan.trial is not None:
            pick = self._pick(plan.trial, domain, exclude, now)
            if pick.proxy is not None:
                self.tiers.trial_leased(domain, request.task_id, now)
                return self._lease(pick.proxy, domain, now)
        levels = self._levels_from(plan.level, floor)
        if not levels and domain not in self._warned:
            self._warned.add(domain)
            log.warning("no proxy in the pool has tier %s or costlier, which %s needs", TIERS[floor], domain)
        waits: list[float] = []
        for skip_excluded in (True, False):
            pick = self._first_pick(levels, domain, exclude if skip_excluded else set(), now)
            if pick.proxy is not None:
                return self._lease(pick.proxy, domain, now)
            if pick.wait is not None:
                waits.append(pick.wait)
                break
        if not waits:
            # Every proxy that may serve this domain is dead: ask again when the first is probed.
            dead = [self.health.proxy(p.id).next_probe for lv in levels for p in self.by_level.get(lv, [])]
            waits.append(min(dead, default=now + MAX_RETRY))
        return Lease(retry_in=min(max(min(waits) - now, MIN_RETRY), MAX_RETRY))

    def _first_pick(self, levels: list[int], domain: str, exclude: set[str], now: float) -> _Pick:
        """The cheapest level's pick: a proxy, or the wait before one is free; levels where
        nothing will ever be free are passed over."""
        for level in levels:
            pick = self._pick(level, domain, exclude, now)
            if pick.proxy is not None or pick.wait is not None:
                return pick
        return _Pick()

    def _banned_out(self, level: int, domain: str, now: float) -> bool:
        live = [p for p in self.by_level.get(level, []) if self.health.usable(p.id, now)]
        return bool(live) and all(self.health.banned_until(p.id, domain, now) for p in live)

    def _levels_from(self, level: int, floor: int) -> list[int]:
        present = sorted(self.by_level)
        levels = [lv for lv in present if lv >= level]
        if not levels:
            # The learned tier is gone from the pool (a reload): the costliest tier the floor allows.
            levels = [lv for lv in present if lv >= floor][-1:]
        return levels

    def _pick(self, level: int, domain: str, exclude: set[str], now: float) -> _Pick:
        live = [p for p in self.by_level.get(level, []) if self.health.usable(p.id, now)]
        candidates = [p for p in live if p.id not in exclude]
        if not candidates:
            return _Pick(exhausted=True)
        ready: list[Proxy] = []
        wait = None
        for proxy in candidates:
            free = max(self.health.banned_until(proxy.id, domain, now) or 0.0, self.health.free_at(proxy.id, domain))
            if free <= now:
                ready.append(proxy)
            else:
                wait = free if wait is None else min(wait, free)
        if not ready:
            return _Pick(wait=wait)
        best = min(
            ready,
            key=lambda p: (
                self.health.score(p.id, domain) < HEALTHY,
                self.health.proxy(p.id).last_used,
                p.id,
            ),
        )
        return _Pick(proxy=best)

    def _lease(self, proxy: Proxy, domain: str, now: float) -> Lease:
        if self.health.is_dead(proxy.id):
            log.info("proxy %s: one trial lease after %.0fs dead", proxy.id, self.config.health.probe_interval)
            self.version += 1
        self.health.leased(proxy.id, domain, now, self.interval)
        self.leases += 1
        return Lease(proxy_id=proxy.id, url=proxy.url, tier=proxy.tier, cost=proxy.cost)

    # -- outcome reports ----------------------------------------------------------------------

    def report(self, event: Event) -> list[Change | TierChange]:
        """Learn from one attempt's outcome event; returns what changed, for the log."""
        outcome = attempt_outcome(event.outcome)
        if event.kind != "outcome" or outcome is None or event.proxy_id is None:
            return []
        # When it happened, not when it was heard: reports queued while the manager was down
        # (the events queue is durable) must not start bans or trials that would have ended.
        now = min(self.clock(), event.at)
        changes: list[Change | TierChange] = list(self.health.report(event.proxy_id, event.domain, outcome, now))
        level = TIERS.index(event.tier) if event.tier in TIERS else None
        if level is None and event.proxy_id in self.proxies:
            level = self.proxies[event.proxy_id].level
        tier_change = self.tiers.report(event.domain, level, event.task_id, outcome, now)
        if tier_change is not None:
            changes.append(tier_change)
        if changes:
            self.version += 1
        return changes

    # -- probes -------------------------------------------------------------------------------

    def due_for_probe(self) -> list[Proxy]:
        now = self.clock()
        return [self.proxies[pid] for pid in self.health.due_for_probe(now) if pid in self.proxies]

    def probed(self, proxy_id: str, ok: bool) -> list[Change]:
        changes: list[Change] = []
        if ok:
            changes = self.health.revive(proxy_id)
        else:
            self.health.probe_failed(proxy_id, self.clock())
        self.version += 1
        return changes

    # -- what is going on, by id only ------------------------------------------------------

    def summary(self) -> dict[str, object]:
        now = self.clock()
        dead = [pid for pid in self.proxies if self.health.is_dead(pid)]
        bans = sum(1 for pair in self.health.pairs.values() if pair.banned_until > now)
        cheapest = self.tiers.levels[0] if self.tiers.levels else 0
        escalated = {d: TIERS[s.level] for d, s in self.tiers.domains.items() if s.level > cheapest}
        return {"proxies": len(self.proxies), "dead": dead, "bans": bans, "escalated": escalated, "leases": self.leases}


def describe(changes: Iterable[Change | TierChange]) -> list[str]:
    """Log lines for changes: proxy ids and domains only, never a URL."""
    lines = []
    for change in changes:
        if isinstance(change, TierChange):
            lines.append(f"domain {change}")
        elif change.kind == "banned":
            lines.append(f"proxy {change.proxy_id} banned on {change.domain} for {change.seconds:.0f}s")
        else:
            lines.append(f"proxy {change.proxy_id} {change.kind}")
    return lines
