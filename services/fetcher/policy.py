"""What to do after an attempt, by what went wrong: the failure policy as data.

Every attempt ends in one outcome. Each outcome has a rule: whether to retry, how to back
off, whether the attempt counts against the task's budget (`HUTCH_MAX_ATTEMPTS`), and
whether the next attempt must avoid the proxy just used. The defaults are `DEFAULT_RULES`;
a policy file (`HUTCH_POLICY_FILE`, YAML) may override any rule and add block patterns:

    outcomes:
      server_error: {retry: true, backoff: exponential, first_tier: 1}
    blocks:
      - {domains: ["shop.example"], status: [200], pattern: "Access denied"}

Outcomes and their default rules:
- ok: 2xx and not a block page -> parse.
- timeout (connect/read timeout, total deadline), reset (refused, reset or broken by the
  site), server_error (other 5xx): exponential backoff with jitter, on the delay tier
  nearest the wait; spend an attempt.
- proxy_failure (the proxy itself refused, failed or timed out): at once through the
  frontier with another proxy; spends only past `HUTCH_MAX_PROXY_FAILURES`.
- blocked (403, or a block or challenge page by status and body pattern): a longer
  backoff and another proxy; spends an attempt.
- throttled (429, 503): waits `Retry-After`, or `HUTCH_DEFAULT_PAUSE` without one; spends
  only past `HUTCH_MAX_PAUSE` or `HUTCH_MAX_THROTTLES`.
- redirect (3xx with a Location): a new attempt at the target through its domain's
  queue; spends nothing.
- not_found (404, 410), client_error (other 4xx), too_large, bad_encoding (a content
  encoding unknown, stacked too deep or corrupt), redirects (too many),
  invalid_url, forbidden_target (refused by the SSRF guard): dead at once.
- crashed (a fetcher died holding the task), error (an exception nothing foresaw):
  exponential backoff; spend an attempt.

Pure functions of the result and the task's history: no broker, no clock; the jitter
source is injected.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Literal

import yaml

from hutch.models import Attempt, Outcome, attempt_outcome
from hutch.urls import DEFAULT_MAX_URL_BYTES, InvalidURL, check_url

Action = Literal["parse", "retry", "frontier", "dead"]
Backoff = Literal["exponential", "site", "none"]


class PolicyError(ValueError):
    """A policy file that cannot be used."""


@dataclass(frozen=True)
class FetchResult:
    """What one attempt produced."""

    outcome: Outcome
    elapsed: float
    status: int | None = None
    final_url: str | None = None
    content_type: str | None = None
    body: bytes | None = None
    retry_after: float | None = None
    location: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Rule:
    retry: bool
    backoff: Backoff = "exponential"
    first_tier: int = 0  # index of the delay tier the first backoff starts from
    spend: bool = True
    avoid_proxy: bool = False


DEFAULT_RULES: dict[Outcome, Rule] = {
    "ok": Rule(retry=False),
    "timeout": Rule(retry=True),
    "reset": Rule(retry=True),
    "proxy_failure": Rule(retry=True, backoff="none", spend=False, avoid_proxy=True),
    "blocked": Rule(retry=True, first_tier=1, avoid_proxy=True),
    "throttled": Rule(retry=True, backoff="site", spend=False),
    "server_error": Rule(retry=True),
    "redirect": Rule(retry=True, backoff="none", spend=False),
    "not_found": Rule(retry=False),
    "client_error": Rule(retry=False),
    "too_large": Rule(retry=False),
    "bad_encoding": Rule(retry=False),
    "redirects": Rule(retry=False),
    "invalid_url": Rule(retry=False),
    "forbidden_target": Rule(retry=False),
    # Errors that belong to the task and that no rule above foresaw: a fetcher that died
    # holding it (out of memory, a crash), an exception in fetching or routing. They spend an
    # attempt each, so the budget bounds them and the task ends dead, never pending for ever.
    "crashed": Rule(retry=True, first_tier=1),
    "error": Rule(retry=True),
}


@dataclass(frozen=True)
class BlockRule:
    """A response that is really a block: its status is listed and its body matches.

    `needles`, when given, are plain strings of which every match of `pattern` contains one:
    a body with none of them is no match, found without running the pattern. Python's `re`
    tries an alternation at every position of the text: the default pattern took 0.26 ms
    on the first 64 KB of a page that is no block, its needles 0.01 ms (a tenth of the
    fetcher's CPU on ~100 KB pages)."""

    pattern: re.Pattern[str]
    status: frozenset[int] = frozenset({200, 403})
    domains: tuple[str, ...] = ("*",)
    needles: tuple[str, ...] = ()

    def matches(self, domain: str, status: int, text: str) -> bool:
        return (
            status in self.status
            and any(fnmatch(domain, glob) for glob in self.domains)
            and (not self.needles or any(needle in text for needle in self.needles))
            and self.pattern.search(text) is not None
        )


DEFAULT_BLOCKS = (
    BlockRule(
        re.compile(r"cf-challenge|<title>\s*Just a moment\.\.\.|Attention Required! \| Cloudflare|hutch-blocked"),
        needles=("cf-challenge", "Just a moment...", "Attention Required! | Cloudflare", "hutch-blocked"),
    ),
)


@dataclass(frozen=True)
class Policy:
    rules: dict[Outcome, Rule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    blocks: tuple[BlockRule, ...] = DEFAULT_BLOCKS
    max_attempts: int = 5
    max_pause: float = 600.0
    default_pause: float = 30.0
    max_throttles: int = 10
    max_proxy_failures: int = 5
    max_redirects: int = 10
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES

    def is_block(self, domain: str, status: int, body: bytes) -> bool:
        if status == 403:
            return True
        candidates = [b for b in self.blocks if status in b.status]
        if not candidates:
            return False
        text = body[:65536].decode("utf-8", "replace")
        return any(b.matches(domain, status, text) for b in candidates)


def load_policy(path: str | Path | None, **limits: Any) -> Policy:
    """The default policy with a policy file's overrides and the given limits."""
    policy = Policy(**limits)
    if path is None:
        return policy
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"outcomes", "blocks"}:
        raise PolicyError(f"{path}: expected a mapping with 'outcomes:' and/or 'blocks:'")
    rules = dict(policy.rules)
    for name, override in (data.get("outcomes") or {}).items():
        outcome = attempt_outcome(str(name))
        if outcome is None or not isinstance(override, dict):
            raise PolicyError(f"{path}: unknown outcome {name!r}; known: {', '.join(rules)}")
        try:
            rules[outcome] = replace(rules[outcome], **override)
        except TypeError as exc:
            raise PolicyError(f"{path}: outcome {name}: {exc}") from None
    blocks = list(policy.blocks)
    for entry in data.get("blocks") or []:
        try:
            blocks.append(
                BlockRule(
                    re.compile(entry["pattern"]),
                    frozenset(entry.get("status", [200, 403])),
                    tuple(entry.get("domains", ["*"])),
                )
            )
        except (KeyError, TypeError, re.error) as exc:
            raise PolicyError(f"{path}: bad block rule {entry!r}: {exc}") from None
    return replace(policy, rules=rules, blocks=tuple(blocks))


def _redirect(result: FetchResult, redirects: int, url: str, policy: Policy) -> Decision:
    """A redirect is followed through the frontier (the new domain's own limits), unspent, to
    the hop the URL validator makes of its Location; past `max_redirects`, or to a URL the
    validator refuses, the task is dead."""
    hop = redirects + 1
    try:
        target = check_url(result.location or "", policy.max_url_bytes)
    except InvalidURL as exc:
        decision = Decision("dead", "invalid_url", spend=False, detail=f"redirect {hop} from {url}: {exc}")
    else:
        decision = Decision(
            "frontier", "redirect", spend=False, detail=result.detail, next_url=target.url, next_domain=target.domain
        )
    if hop > policy.max_redirects:
        detail = f"more than {policy.max_redirects} redirects"
        return replace(decision, action="dead", reason="redirects", detail=detail)
    return decision


def outcome_of_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return "ok"
    if 300 <= status < 400:
        return "redirect"
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
    # A redirect to a valid URL: the next hop, as the URL validator normalised it (the form
    # the guard and the request both see), and its domain.
    next_url: str | None = None
    next_domain: str | None = None


def _unspent(history: Sequence[Attempt], outcome: str) -> int:
    return sum(1 for a in history if a.outcome == outcome and not a.spent)


def nearest_tier(wait: float, tiers: Sequence[float]) -> float:
    """The tier nearest `wait` by ratio: rounding a backoff up to the next tier would make the
    first retry after a 1.2 s wait a 5 s one, half the time, with the default tiers."""
    return min(tiers, key=lambda tier: abs(math.log(tier / wait)))


def decide(
    result: FetchResult,
    attempts_spent: int,
    history: Sequence[Attempt],
    policy: Policy,
    tiers: Sequence[float],
    jitter: Callable[[], float] = random.random,
    *,
    redirects: int = 0,
    url: str = "",
) -> Decision:
    """The next step for a task that has spent `attempts_spent` attempts before this one and
    followed `redirects` redirects to `url`, the one just fetched."""
    if result.outcome == "ok":
        return Decision("parse", "ok", spend=True)
    rule = policy.rules[result.outcome]
    if not rule.retry:
        return Decision("dead", result.outcome, spend=True, detail=result.detail)
    if result.outcome == "redirect":
        return _redirect(result, redirects, url, policy)
    spend = rule.spend
    wait: float | None = None
    if rule.backoff == "site":
        wait = result.retry_after if result.retry_after is not None else policy.default_pause
        # A site's own wait costs nothing, up to a point: a very long pause, or one pause too
        # many, counts as a failed attempt.
        if wait > policy.max_pause or _unspent(history, result.outcome) >= policy.max_throttles:
            spend = True
    elif result.outcome == "proxy_failure" and _unspent(history, "proxy_failure") >= policy.max_proxy_failures:
        spend = True
    spent = attempts_spent + (1 if spend else 0)
    if spent >= policy.max_attempts:
        detail = f"gave up after {spent} attempts: {result.detail}".rstrip(": ")
        return Decision("dead", result.outcome, spend=spend, detail=detail)
    if rule.backoff == "none":
        return Decision("frontier", result.outcome, spend=spend, avoid_proxy=rule.avoid_proxy, detail=result.detail)
    if wait is None:
        start = min(rule.first_tier, len(tiers) - 1)
        # Exponential with jitter: 0.5x to 1.5x of first * 2^(n-1), on the nearest tier from
        # the rule's first one up.
        delay = nearest_tier(tiers[start] * (2 ** max(spent - 1, 0)) * (0.5 + jitter()), tiers[start:])
    else:  # the site's own wait: never shorter than it asked
        delay = next((tier for tier in tiers if tier >= wait), tiers[-1])
    return Decision(
        "retry",
        result.outcome,
        spend=spend,
        delay=delay,
        avoid_proxy=rule.avoid_proxy,
        detail=result.detail,
    )
