"""Errors that belong to the task (a crash, an exception nothing foresaw) spend its attempts."""

from __future__ import annotations

import pytest

from hutch.models import Attempt
from hutch.services.fetcher.policy import FetchResult, Policy, decide

TIERS = (1.0, 5.0, 30.0)


@pytest.mark.parametrize("outcome", ["crashed", "error"])
def test_a_crash_or_an_unforeseen_error_is_retried_with_backoff_and_spends_an_attempt(outcome: str) -> None:
    decision = decide(FetchResult(outcome, 0.0, detail="boom"), 0, [], Policy(max_attempts=3), TIERS, lambda: 0.5)
    assert (decision.action, decision.reason, decision.spend) == ("retry", outcome, True)
    assert decision.delay in TIERS


@pytest.mark.parametrize("outcome", ["crashed", "error"])
def test_a_crash_or_an_unforeseen_error_on_the_last_attempt_is_dead_with_that_reason(outcome: str) -> None:
    history = [Attempt(n=n, at=0.0, outcome=outcome) for n in (1, 2)]
    decision = decide(FetchResult(outcome, 0.0, detail="boom"), 2, history, Policy(max_attempts=3), TIERS)
    assert (decision.action, decision.reason, decision.spend) == ("dead", outcome, True)
    assert "gave up after 3 attempts" in decision.detail


def test_a_crash_backs_off_from_the_second_tier_so_a_page_that_kills_fetchers_is_not_hammered() -> None:
    crash = decide(FetchResult("crashed", 0.0), 0, [], Policy(), TIERS, lambda: 0.5)
    error = decide(FetchResult("error", 0.0), 0, [], Policy(), TIERS, lambda: 0.5)
    assert crash.delay is not None and error.delay is not None
    assert crash.delay > error.delay
