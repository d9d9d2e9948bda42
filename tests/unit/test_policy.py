"""The retry policy: what every fetch outcome leads to, with the jitter source injected."""

from __future__ import annotations

import pytest
from hutch.services.fetcher.policy import RULES, Decision, FetchResult, decide, outcome_of_status

TIERS = (1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
PERMANENT = ("not_found", "client_error", "too_large", "invalid_url", "redirects")
RETRYABLE = ("timeout", "connection", "proxy", "blocked", "throttled", "server_error")


def no_jitter() -> float:
    """The middle of the jitter range: the backoff is exactly first * 2^(n-1)."""
    return 0.5


def result(outcome: str, **changes: object) -> FetchResult:
    return FetchResult(outcome=outcome, elapsed=0.1, **changes)  # type: ignore[arg-type]


def run(outcome: str, spent: int = 0, max_attempts: int = 5, **changes: object) -> Decision:
    return decide(result(outcome, **changes), spent, max_attempts, TIERS, jitter=no_jitter)


def test_the_rules_cover_exactly_the_permanent_and_retryable_outcomes_plus_ok() -> None:
    assert set(RULES) == {"ok", *PERMANENT, *RETRYABLE}


# -- success and permanent failures --------------------------------------------------------------


def test_an_ok_fetch_goes_to_the_parser_and_spends_an_attempt() -> None:
    decision = run("ok", status=200)
    assert decision.action == "parse"
    assert decision.reason == "ok"
    assert decision.spend is True
    assert decision.delay is None


def test_an_ok_fetch_on_the_last_allowed_attempt_is_still_parsed() -> None:
    assert run("ok", spent=4, max_attempts=5).action == "parse"


@pytest.mark.parametrize("outcome", PERMANENT)
def test_a_permanent_failure_goes_dead_at_once_without_a_retry(outcome: str) -> None:
    decision = run(outcome, spent=0, detail="HTTP 404")
    assert decision.action == "dead"
    assert decision.reason == outcome
    assert decision.delay is None
    assert decision.spend is True
    assert decision.detail == "HTTP 404"
    assert "gave up" not in decision.detail


@pytest.mark.parametrize("outcome", RETRYABLE)
def test_a_transient_failure_with_budget_left_is_retried_after_a_delay(outcome: str) -> None:
    decision = run(outcome, spent=0, detail="x")
    assert decision.action == "retry"
    assert decision.reason == outcome
    assert decision.delay in TIERS
    assert decision.spend is True
    assert decision.detail == "x"


def test_an_unknown_outcome_is_an_error_rather_than_a_silent_retry() -> None:
    with pytest.raises(KeyError):
        run("mystery")


# -- exponential backoff -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spent_before", "delay"),
    [(0, 1.0), (1, 5.0), (2, 5.0), (3, 30.0)],  # wanted 1, 2, 4, 8 seconds
)
def test_the_backoff_doubles_with_each_attempt_and_lands_on_a_tier(spent_before: int, delay: float) -> None:
    assert run("timeout", spent=spent_before, max_attempts=10).delay == delay


def test_the_backoff_keeps_growing_until_the_longest_tier() -> None:
    delays = [run("server_error", spent=n, max_attempts=100).delay for n in range(20)]
    assert delays == sorted(delays)
    assert delays[0] == 1.0
    assert delays[-1] == 3600.0
    assert set(delays) <= set(TIERS)


def test_blocked_starts_its_backoff_from_the_second_tier() -> None:
    assert run("blocked", spent=0).delay == 5.0
    assert run("blocked", spent=1).delay == 30.0  # wanted 10


def test_throttled_without_retry_after_backs_off_from_the_second_tier() -> None:
    assert run("throttled", spent=0).delay == 5.0
    assert run("throttled", spent=1).delay == 30.0


def test_jitter_spreads_the_delay_between_half_and_one_and_a_half_times_the_backoff() -> None:
    # spent=3 wants 4 s: jitter 0 gives 2 s (tier 5), jitter just under 1 gives ~6 s (tier 30).
    low = decide(result("timeout"), 2, 10, TIERS, jitter=lambda: 0.0)
    high = decide(result("timeout"), 2, 10, TIERS, jitter=lambda: 0.99)
    assert (low.delay, high.delay) == (5.0, 30.0)


def test_the_lowest_jitter_can_bring_a_blocked_retry_below_its_first_tier() -> None:
    # wanted = 5 * 0.5 = 2.5 -> tier 5; with tiers 1, 3, 5 the full-range jitter lands on 3.
    decision = decide(result("blocked"), 0, 5, (1.0, 3.0, 5.0), jitter=lambda: 0.0)
    assert decision.delay == 3.0


def test_the_injected_jitter_source_is_used() -> None:
    calls: list[int] = []

    def jitter() -> float:
        calls.append(1)
        return 0.5

    decide(result("timeout"), 0, 5, TIERS, jitter=jitter)
    assert calls == [1]


@pytest.mark.parametrize("jitter_value", [0.0, 0.1, 0.37, 0.5, 0.77, 0.999])
@pytest.mark.parametrize("spent_before", [0, 1, 2, 3])
def test_every_retry_delay_is_one_of_the_configured_tiers(jitter_value: float, spent_before: int) -> None:
    for outcome in RETRYABLE:
        decision = decide(result(outcome), spent_before, 10, TIERS, jitter=lambda v=jitter_value: v)
        assert decision.delay in TIERS


def test_a_single_tier_serves_every_retry_even_when_a_rule_starts_later() -> None:
    for outcome in ("timeout", "blocked", "throttled"):
        assert decide(result(outcome), 3, 10, (7.0,), jitter=no_jitter).delay == 7.0


# -- Retry-After ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("retry_after", "delay"), [(1.0, 1.0), (5.0, 5.0), (6.0, 30.0), (45.0, 120.0)])
def test_retry_after_of_a_throttled_answer_picks_the_first_tier_that_honours_it(
    retry_after: float, delay: float
) -> None:
    assert run("throttled", retry_after=retry_after).delay == delay


def test_retry_after_is_honoured_regardless_of_the_attempt_number() -> None:
    assert run("throttled", spent=3, max_attempts=10, retry_after=2.0).delay == 5.0


def test_a_zero_retry_after_still_waits_the_shortest_tier() -> None:
    assert run("throttled", retry_after=0.0).delay == 1.0


def test_a_retry_after_beyond_every_tier_waits_the_longest_tier() -> None:
    assert run("throttled", retry_after=86_400.0).delay == 3600.0


def test_retry_after_on_an_outcome_other_than_throttled_is_ignored() -> None:
    assert run("server_error", retry_after=500.0).delay == 1.0


# -- attempt budget ------------------------------------------------------------------------------


def test_the_attempt_that_exhausts_the_budget_goes_dead_with_gave_up_after_n_attempts() -> None:
    decision = run("timeout", spent=4, max_attempts=5, detail="ReadTimeout")
    assert decision.action == "dead"
    assert decision.reason == "timeout"
    assert decision.delay is None
    assert decision.detail == "gave up after 5 attempts: ReadTimeout"


def test_the_attempt_before_the_last_is_still_retried() -> None:
    assert run("timeout", spent=3, max_attempts=5).action == "retry"


def test_gave_up_detail_has_no_dangling_colon_without_a_detail() -> None:
    assert run("connection", spent=2, max_attempts=3).detail == "gave up after 3 attempts"


def test_a_budget_of_one_attempt_never_retries() -> None:
    for outcome in RETRYABLE:
        assert run(outcome, spent=0, max_attempts=1).action == "dead"


def test_a_task_that_already_overspent_its_budget_goes_dead() -> None:
    decision = run("throttled", spent=9, max_attempts=5, retry_after=1.0)
    assert decision.action == "dead"
    assert decision.detail.startswith("gave up after 10 attempts")


# -- proxies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["blocked", "proxy"])
def test_blocked_and_proxy_failures_avoid_the_proxy_next_time(outcome: str) -> None:
    assert run(outcome).avoid_proxy is True


@pytest.mark.parametrize("outcome", ["timeout", "connection", "throttled", "server_error"])
def test_other_transient_failures_keep_the_proxy_eligible(outcome: str) -> None:
    assert run(outcome).avoid_proxy is False


# -- status codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "ok"),
        (204, "ok"),
        (299, "ok"),
        (429, "throttled"),
        (503, "throttled"),
        (403, "blocked"),
        (404, "not_found"),
        (410, "not_found"),
        (500, "server_error"),
        (502, "server_error"),
        (504, "server_error"),
        (599, "server_error"),
        (400, "client_error"),
        (401, "client_error"),
        (418, "client_error"),
        (304, "client_error"),
        (100, "client_error"),
    ],
)
def test_outcome_of_status_maps_http_status_codes(status: int, outcome: str) -> None:
    assert outcome_of_status(status) == outcome


def test_every_status_maps_to_an_outcome_with_a_rule() -> None:
    assert {outcome_of_status(status) for status in range(100, 600)} <= set(RULES)
