"""The failure policy: one rule per outcome, budgets per failure type, delays on tiers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hutch.models import OUTCOMES, Attempt
from hutch.services.fetcher.policy import (
    DEFAULT_BLOCKS,
    DEFAULT_RULES,
    FetchResult,
    Policy,
    PolicyError,
    decide,
    load_policy,
    outcome_of_status,
)

TIERS = (1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
PERMANENT = ("not_found", "client_error", "too_large", "redirects", "invalid_url", "forbidden_target")
POLICY = Policy(max_attempts=5)


def result(outcome: str, **changes: object) -> FetchResult:
    return FetchResult(outcome=outcome, elapsed=0.1, **changes)  # type: ignore[arg-type]


def unspent(outcome: str, count: int) -> list[Attempt]:
    return [Attempt(n=0, at=float(i), outcome=outcome, spent=False) for i in range(count)]


def run(outcome: str, spent: int = 0, history: list[Attempt] | None = None, policy: Policy = POLICY, **changes):  # type: ignore[no-untyped-def]
    return decide(result(outcome, **changes), spent, history or [], policy, TIERS, jitter=lambda: 0.5)


def test_every_status_code_maps_to_an_outcome_with_a_rule() -> None:
    assert {outcome_of_status(status) for status in range(100, 600)} <= set(DEFAULT_RULES)


def test_the_policy_has_a_rule_for_every_outcome_and_no_other() -> None:
    assert set(DEFAULT_RULES) == set(OUTCOMES)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(200, "ok"), (204, "ok"), (301, "redirect"), (302, "redirect"), (403, "blocked"), (404, "not_found"),
     (410, "not_found"), (400, "client_error"), (429, "throttled"), (503, "throttled"), (500, "server_error"),
     (502, "server_error")],
)
def test_status_codes_are_classified(status: int, outcome: str) -> None:
    assert outcome_of_status(status) == outcome


def test_a_good_page_goes_to_the_parser_and_spends_its_attempt() -> None:
    decision = run("ok")
    assert (decision.action, decision.spend) == ("parse", True)


@pytest.mark.parametrize("outcome", PERMANENT)
def test_permanent_failures_go_dead_at_once_without_retry(outcome: str) -> None:
    decision = run(outcome, detail="why")
    assert (decision.action, decision.reason, decision.detail) == ("dead", outcome, "why")


@pytest.mark.parametrize("outcome", ["timeout", "reset", "server_error"])
def test_transient_failures_back_off_exponentially_on_the_tier_nearest_the_wait(outcome: str) -> None:
    policy = Policy(max_attempts=10)
    delays = [run(outcome, spent=n, policy=policy).delay for n in range(6)]
    # jitter 0.5 -> exactly first * 2^(n-1): 1, 2, 4, 8, 16, 32 -> the tiers 1, 1, 5, 5, 30, 30
    assert delays == [1.0, 1.0, 5.0, 5.0, 30.0, 30.0]
    assert run(outcome).spend is True


@pytest.mark.parametrize("jitter", [0.0, 0.3, 0.999])
def test_a_backoff_never_goes_below_its_rules_first_tier(jitter: float) -> None:
    tiers = (0.2, 0.5, 1.0)  # a block starts from the second: its first wait, 0.25 to 0.75 s, is nearer 0.2 s
    assert decide(result("blocked"), 0, [], POLICY, tiers, jitter=lambda: jitter).delay in (0.5, 1.0)


@pytest.mark.parametrize("jitter", [0.0, 0.5, 0.7, 0.999])
def test_a_first_retry_never_rounds_up_to_the_five_second_tier(jitter: float) -> None:
    assert decide(result("timeout"), 0, [], POLICY, TIERS, jitter=lambda: jitter).delay == 1.0


@pytest.mark.parametrize(("jitter", "delay"), [(0.0, 1.0), (0.6, 1.0), (0.7, 5.0), (0.999, 5.0)])
def test_a_wait_between_two_tiers_goes_to_the_nearer_by_ratio(jitter: float, delay: float) -> None:
    # waits 1, 2.2, 2.4 and 3 s: 2.24 s is as far from 1 s as from 5 s by ratio
    assert decide(result("timeout"), 1, [], POLICY, TIERS, jitter=lambda: jitter).delay == delay


def test_jitter_spreads_the_backoff_between_half_and_one_and_a_half_times() -> None:
    low = decide(result("timeout"), 2, [], Policy(max_attempts=10), TIERS, jitter=lambda: 0.0)
    high = decide(result("timeout"), 2, [], Policy(max_attempts=10), TIERS, jitter=lambda: 0.999)
    assert low.delay is not None and high.delay is not None
    assert low.delay < high.delay


def test_a_block_waits_longer_and_must_use_another_proxy() -> None:
    blocked = run("blocked")
    timeout = run("timeout")
    assert blocked.action == "retry" and blocked.avoid_proxy and blocked.spend
    assert blocked.delay is not None and timeout.delay is not None and blocked.delay > timeout.delay


def test_a_proxy_failure_retries_at_once_with_another_proxy_without_spending() -> None:
    decision = run("proxy_failure")
    assert (decision.action, decision.spend, decision.avoid_proxy) == ("frontier", False, True)
    assert decision.delay is None


def test_proxy_failures_past_their_cap_spend_attempts() -> None:
    policy = Policy(max_attempts=5, max_proxy_failures=2)
    assert run("proxy_failure", history=unspent("proxy_failure", 1), policy=policy).spend is False
    assert run("proxy_failure", history=unspent("proxy_failure", 2), policy=policy).spend is True


def test_a_429_waits_what_the_site_asked_without_spending_an_attempt() -> None:
    decision = run("throttled", retry_after=20.0)
    assert (decision.action, decision.spend, decision.delay) == ("retry", False, 30.0)


def test_a_429_without_retry_after_waits_the_default_pause() -> None:
    decision = run("throttled", policy=Policy(default_pause=100.0))
    assert (decision.spend, decision.delay) == (False, 120.0)


def test_a_site_wait_longer_than_the_maximum_pause_spends_an_attempt() -> None:
    decision = run("throttled", retry_after=7200.0, policy=Policy(max_pause=600.0))
    assert decision.spend is True
    assert decision.delay == 3600.0


def test_too_many_throttles_start_spending_attempts() -> None:
    policy = Policy(max_throttles=3)
    assert run("throttled", retry_after=1.0, history=unspent("throttled", 2), policy=policy).spend is False
    assert run("throttled", retry_after=1.0, history=unspent("throttled", 3), policy=policy).spend is True


def test_unspent_outcomes_never_exhaust_the_budget() -> None:
    assert run("throttled", spent=4, retry_after=1.0).action == "retry"
    assert run("proxy_failure", spent=4).action == "frontier"


@pytest.mark.parametrize("outcome", ["timeout", "reset", "server_error", "blocked"])
def test_the_last_spent_attempt_sends_the_task_dead_with_the_count(outcome: str) -> None:
    decision = run(outcome, spent=4, detail="HTTP 500")
    assert (decision.action, decision.reason) == ("dead", outcome)
    assert decision.detail == "gave up after 5 attempts: HTTP 500"


def test_a_redirect_is_a_new_attempt_through_the_frontier_that_spends_nothing() -> None:
    decision = run("redirect", location="http://B.example:80/a")
    assert (decision.action, decision.spend) == ("frontier", False)
    assert (decision.next_url, decision.next_domain) == ("http://b.example/a", "b.example")


def test_a_redirect_to_a_url_the_validator_refuses_is_dead_with_the_hop_named() -> None:
    decision = decide(result("redirect", location="ftp://b.example/"), 0, [], POLICY, TIERS,
                      redirects=2, url="http://a.example/x")
    assert (decision.action, decision.reason, decision.spend, decision.next_url) == ("dead", "invalid_url", False, None)
    assert decision.detail.startswith("redirect 3 from http://a.example/x: ")


def test_one_redirect_past_the_limit_is_dead() -> None:
    policy = Policy(max_redirects=2)
    within = decide(result("redirect", location="http://b.example/"), 0, [], policy, TIERS, redirects=1)
    past = decide(result("redirect", location="http://b.example/"), 0, [], policy, TIERS, redirects=2)
    assert within.action == "frontier"
    assert (past.action, past.reason, past.detail) == ("dead", "redirects", "more than 2 redirects")


def test_a_policy_file_overrides_a_rule_and_adds_block_patterns(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "outcomes:\n  server_error: {retry: false}\n"
        "blocks:\n  - {domains: ['shop.*'], status: [200], pattern: 'Access denied'}\n"
    )
    policy = load_policy(path)
    assert policy.rules["server_error"].retry is False
    assert policy.rules["timeout"] == DEFAULT_RULES["timeout"]
    assert policy.is_block("shop.example", 200, b"<p>Access denied</p>")
    assert not policy.is_block("news.example", 200, b"<p>Access denied</p>")


@pytest.mark.parametrize(
    "text",
    [
        "outcomes:\n  nonsense: {retry: true}\n",
        "outcomes:\n  timeout: {colour: red}\n",
        "blocks:\n  - {status: [200]}\n",
        "other: 1\n",
        "blocks:\n  - {pattern: '('}\n",
    ],
)
def test_a_bad_policy_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError):
        load_policy(path)


def test_challenge_pages_served_with_200_are_blocks_by_default() -> None:
    assert POLICY.is_block("any", 200, b'<div id="cf-challenge">')
    assert POLICY.is_block("any", 200, b"<title>Just a moment...</title>")
    assert not POLICY.is_block("any", 200, b"<title>Just a page</title>")
    assert POLICY.is_block("any", 403, b"")


@pytest.mark.parametrize(
    "body",
    [
        b'<div id="cf-challenge">',
        b"<title>\n  Just a moment...</title>",
        b"<h1>Attention Required! | Cloudflare</h1>",
        b"<p class=hutch-blocked>",
        b"<title>Just a moment..</title>",  # neither matches: one dot short
        b"<title>Just a page</title>",
        b"Attention Required! Cloudflare",
    ],
)
def test_the_default_blocks_needles_pass_every_body_their_pattern_matches(body: bytes) -> None:
    """The needles only skip the pattern: with or without them, the same answer."""
    (rule,) = DEFAULT_BLOCKS
    text = body.decode()
    without = dataclasses.replace(rule, needles=())
    assert rule.matches("any", 200, text) == without.matches("any", 200, text)
    assert rule.pattern.search(text) is None or any(needle in text for needle in rule.needles)
