"""Which proxy tier a domain needs, learned from its blocks.

Every domain starts on the cheapest tier in the pool (or its floor). `escalate_blocks`
blocks on one tier (the domain's, or a costlier one its floor or a job's floor put it on)
within `window` seconds move it to the next tier above that one that the pool has. Once
escalated, the cheaper tier is tried again only every `trial_interval` seconds, and
carefully: one trial lease at a time, so a trial ends after at
most `escalate_blocks` blocks (the cheaper tier still fails: wait another interval), or
after `deescalate_after` successes in a row (the site has stopped blocking: the domain moves
down). Blocks on a domain therefore grow by at most `escalate_blocks` per trial once it has
escalated, and costly proxies go back to the domains that need them.

Levels are indexes into `pool.TIERS` (0 = datacenter). Floors (a job's `tier_floor`, a
domain's configured floor) bound the level from below and are the caller's to pass in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hutch.models import Outcome
from hutch.services.proxy_manager.pool import TIERS

SUCCESS = {"ok", "not_found", "client_error", "too_large", "redirect", "redirects"}


@dataclass(frozen=True)
class TierConfig:
    escalate_blocks: int = 3
    window: float = 60.0
    trial_interval: float = 600.0
    deescalate_after: int = 10
    trial_timeout: float = 120.0  # a trial lease whose outcome never came is forgotten after this


@dataclass
class Trial:
    level: int
    task_id: str | None = None  # the trial lease in flight, if any
    leased_at: float = 0.0
    successes: int = 0
    blocks: int = 0


@dataclass
class DomainTier:
    level: int = 0
    blocks: dict[int, list[float]] = field(default_factory=dict)  # recent block times, by tier
    escalated_at: float | None = None
    next_trial: float | None = None
    trial: Trial | None = None


@dataclass(frozen=True)
class Plan:
    """The tier for one lease: `level`, or first `trial` (one lease on a cheaper tier)."""

    level: int
    trial: int | None = None


@dataclass(frozen=True)
class TierChange:
    domain: str
    old: int
    new: int
    why: str

    def __str__(self) -> str:
        return f"{self.domain}: {TIERS[self.old]} -> {TIERS[self.new]} ({self.why})"


class DomainTiers:
    def __init__(self, config: TierConfig, levels: Sequence[int] = (0,)) -> None:
        self.config = config
        self.levels = sorted(set(levels))  # the tiers the pool has
        self.domains: dict[str, DomainTier] = {}

    def set_levels(self, levels: Sequence[int]) -> None:
        self.levels = sorted(set(levels))

    def state(self, domain: str) -> DomainTier:
        found = self.domains.get(domain)
        if found is None:
            start = self.levels[0] if self.levels else 0
            found = self.domains[domain] = DomainTier(level=start)
        return found

    def level(self, domain: str) -> int:
        found = self.domains.get(domain)
        if found is not None:
            return found.level
        return self.levels[0] if self.levels else 0

    def _cheaper(self, level: int, floor: int) -> int | None:
        below = [lv for lv in self.levels if floor <= lv < level]
        return below[-1] if below else None

    def _costlier(self, level: int) -> int | None:
        above = [lv for lv in self.levels if lv > level]
        return above[0] if above else None

    # -- leasing ----------------------------------------------------------------------------

    def plan(self, domain: str, floor: int, now: float) -> Plan:
        state = self.state(domain)
        level = max(state.level, floor)
        if state.next_trial is None or now < state.next_trial:
            return Plan(level)
        cheaper = self._cheaper(state.level, floor)
        if cheaper is None:
            return Plan(level)
        trial = state.trial
        if trial is None or trial.level != cheaper:
            trial = state.trial = Trial(cheaper)
        if trial.task_id is not None and now - trial.leased_at < self.config.trial_timeout:
            return Plan(level)  # one trial lease at a time
        return Plan(level, cheaper)

    def trial_leased(self, domain: str, task_id: str, now: float) -> None:
        trial = self.state(domain).trial
        if trial is not None:
            trial.task_id = task_id
            trial.leased_at = now

    # -- reports ----------------------------------------------------------------------------

    def report(self, domain: str, level: int | None, task_id: str, outcome: Outcome, now: float) -> TierChange | None:
        if level is None:
            return None
        state = self.state(domain)
        trial = state.trial
        if trial is not None and trial.task_id == task_id and trial.level == level:
            return self._trial_report(domain, state, trial, outcome, now)
        if outcome != "blocked" or level < state.level:
            # Blocks on a cheaper tier than the domain's are late reports of leases made
            # before it escalated (or of a finished trial): counted already.
            return None
        # Blocks on a costlier tier than the domain's come from a floor (the domain's or a
        # job's): K of them mean the site blocks that tier too, so the domain needs the next.
        cutoff = now - self.config.window
        recent = [t for t in state.blocks.get(level, []) if t > cutoff]
        recent.append(now)
        state.blocks[level] = recent
        if len(recent) < self.config.escalate_blocks:
            return None
        costlier = self._costlier(level)
        if costlier is None:
            return None
        why = f"{self.config.escalate_blocks} blocks in {self.config.window:g}s"
        return self._escalate(domain, state, costlier, now, why)

    def exhausted(self, domain: str, level: int, now: float) -> TierChange | None:
        """Every proxy of `level` is banned on the domain: the site blocked them all, so the
        domain needs the next tier, however few blocks that took (a tier of fewer proxies than
        `escalate_blocks` would otherwise never collect them inside the window: each block
        bans a proxy for longer than that)."""
        state = self.state(domain)
        costlier = self._costlier(level)
        if level < state.level or costlier is None:
            return None
        return self._escalate(domain, state, costlier, now, f"every {TIERS[level]} proxy banned there")

    def _escalate(self, domain: str, state: DomainTier, costlier: int, now: float, why: str) -> TierChange:
        """Move the domain up to `costlier`; the cheaper tier is tried again only after a while."""
        old = state.level
        state.level = costlier
        state.blocks = {}
        state.escalated_at = now
        state.next_trial = now + self.config.trial_interval
        state.trial = None
        return TierChange(domain, old, costlier, why)

    def _trial_report(
        self, domain: str, state: DomainTier, trial: Trial, outcome: Outcome, now: float
    ) -> TierChange | None:
        trial.task_id = None
        if outcome == "blocked":
            trial.blocks += 1
            trial.successes = 0
            if trial.blocks >= self.config.escalate_blocks:
                state.trial = None  # the cheaper tier still fails: try again in an interval
                state.next_trial = now + self.config.trial_interval
            return None
        if outcome in SUCCESS:
            trial.successes += 1
            if trial.successes >= self.config.deescalate_after:
                old = state.level
                state.level = trial.level
                state.blocks = {}
                state.trial = None
                # Further down only after another interval, if there is a cheaper tier still.
                state.next_trial = now + self.config.trial_interval
                return TierChange(domain, old, trial.level, f"{trial.successes} successes in a row")
        return None

    # -- persistence --------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "domain": domain,
                "tier": TIERS[state.level],
                "escalated_at": state.escalated_at,
                "next_trial": state.next_trial,
            }
            for domain, state in self.domains.items()
            if state.escalated_at is not None or state.level > (self.levels[0] if self.levels else 0)
        ]

    def restore(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            tier = entry.get("tier")
            if tier not in TIERS:
                continue
            self.domains[str(entry["domain"])] = DomainTier(
                level=TIERS.index(tier),
                escalated_at=entry.get("escalated_at"),
                next_trial=entry.get("next_trial"),
            )
