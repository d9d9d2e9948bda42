"""What to do after an attempt: parse, retry after a delay, or give up — by failure type.

Each outcome of a fetch has a rule: whether it is worth retrying, how long to back off,
whether the attempt counts against the task's budget (`HUTCH_MAX_ATTEMPTS`), and whether
the next attempt must avoid the proxy just used. Pure functions of the result and the
task's history: no broker, no clock (the jitter source is injected).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["parse", "retry", "dead"]


@dataclass(frozen=True)
class FetchResult:
    """What one attempt produced; `outcome` is one of the keys of RULES."""

    outcome: str
    elapsed: float
    status: int | None = None
    final_url: str | None = None
    content_type: str | None = None
    body: bytes | None = None
    retry_after: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Rule:
    retry: bool
    backoff: Literal["exponential", "site", "none"] = "exponential"
    first_tier: int = 0  # index of the delay tier the first backoff starts from
    spend: bool = True
    avoid_proxy: bool = False


RULES: dict[str, Rule] = {
    "ok": Rule(retry=False),
    "timeout": Rule(retry=True),
    "connection": Rule(retry=True),
    "proxy": Rule(retry=True, avoid_proxy=True),
    "blocked": Rule(retry=True, first_tier=1, avoid_proxy=True),
    "throttled": Rule(retry=True, backoff="site", first_tier=1),
    "server_error": Rule(retry=True),
    "not_found": Rule(retry=False),
    "client_error": Rule(retry=False),
    "too_large": Rule(retry=False),
    "invalid_url": Rule(retry=False),
    "redirects": Rule(retry=False),
}


def outcome_of_status(status: int) -> str:
    if 200 <= status < 300:
        return "ok"
    if status in (429, 503):
        return "throttled"
    if status == 403:
        return "blocked"
    if status in (404, 410):
        return "not_found"
    if status >= 500:
        return "server_error"
    return "client_error"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    spend: bool
    delay: float | None = None
    avoid_proxy: bool = False
    detail: str = ""


def decide(
    result: FetchResult,
    attempts_spent: int,
    max_attempts: int,
    tiers: Sequence[float],
    jitter: Callable[[], float] = random.random,
) -> Decision:
    """Decide the next step for a task that has spent `attempts_spent` attempts before this one."""
    if result.outcome == "ok":
        return Decision("parse", "ok", spend=True)
    rule = RULES[result.outcome]
    if not rule.retry:
        return Decision("dead", result.outcome, spend=True, detail=result.detail)
    spent = attempts_spent + (1 if rule.spend else 0)
    if spent >= max_attempts:
        detail = f"gave up after {spent} attempts: {result.detail}".rstrip(": ")
        return Decision("dead", result.outcome, spend=rule.spend, detail=detail)
    first = tiers[min(rule.first_tier, len(tiers) - 1)]
    if rule.backoff == "site" and result.retry_after is not None:
        wanted = max(result.retry_after, tiers[0])
    else:
        # Exponential with full-range jitter: 0.5x to 1.5x of first * 2^(n-1).
        wanted = first * (2 ** max(spent - 1, 0)) * (0.5 + jitter())
    delay = next((tier for tier in tiers if tier >= wanted), tiers[-1])
    return Decision(
        "retry",
        result.outcome,
        spend=rule.spend,
        delay=delay,
        avoid_proxy=rule.avoid_proxy,
        detail=result.detail,
    )
