"""The adaptive per-domain timeouts: what a fetch waits, from how fast its domain answered,
under a fake clock."""

from __future__ import annotations

import pytest

from hutch.services.fetcher.timeouts import TimeoutEstimator, Timeouts

from .clock import FakeClock

READ, TOTAL = 10.0, 30.0


def estimator(clock: FakeClock | None = None, **kwargs: float) -> TimeoutEstimator:
    options: dict[str, float] = {"floor": 2.0, "k": 4.0, "min_samples": 3, **kwargs}
    return TimeoutEstimator(
        floor=options.pop("floor"),
        k=options.pop("k"),
        min_samples=int(options.pop("min_samples")),
        clock=clock or FakeClock(),
        **options,  # type: ignore[arg-type]
    )


def answered(timeouts: TimeoutEstimator, domain: str, *seconds: float) -> None:
    for value in seconds:
        timeouts.observe(domain, value)


def test_a_domain_never_heard_from_gets_the_configured_timeouts() -> None:
    assert estimator().timeouts("a.test", 0, READ, TOTAL) == Timeouts(READ, TOTAL)


def test_the_configured_timeouts_hold_until_the_domain_has_answered_enough_times() -> None:
    timeouts = estimator(min_samples=3)
    answered(timeouts, "a.test", 0.1, 0.1)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(READ, TOTAL)
    answered(timeouts, "a.test", 0.1)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(2.0, 2.0)


def test_a_fast_domain_gets_the_floor() -> None:
    timeouts = estimator(floor=2.0)
    answered(timeouts, "a.test", 0.05, 0.25, 0.15, 0.2, 0.1)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(2.0, 2.0)


def test_the_wait_is_the_smoothed_mean_plus_k_mean_deviations() -> None:
    timeouts = estimator(floor=0.1, k=4.0, min_samples=1)
    answered(timeouts, "a.test", 1.0)  # first sample: srtt 1.0, rttvar 0.5
    assert timeouts.timeouts("a.test", 0, READ, TOTAL).read == pytest.approx(1.0 + 4 * 0.5)
    answered(timeouts, "a.test", 3.0)  # rttvar 0.5 + (2.0 - 0.5) / 4 = 0.875; srtt 1.0 + 2.0 / 8 = 1.25
    assert timeouts.timeouts("a.test", 0, READ, TOTAL).read == pytest.approx(1.25 + 4 * 0.875)


def test_a_slow_domain_waits_longer_than_the_floor_but_never_past_the_configured_timeouts() -> None:
    timeouts = estimator(floor=2.0, min_samples=1)
    answered(timeouts, "slow.test", 3.0, 3.0, 3.0)
    waited = timeouts.timeouts("slow.test", 0, READ, TOTAL)
    assert 3.0 < waited.read <= READ and waited.read == waited.total
    answered(timeouts, "slower.test", 20.0)
    assert timeouts.timeouts("slower.test", 0, READ, TOTAL) == Timeouts(READ, TOTAL)


def test_each_earlier_timeout_of_the_task_doubles_the_wait_up_to_the_configured_timeouts() -> None:
    timeouts = estimator(floor=2.0, min_samples=1)
    answered(timeouts, "a.test", 0.1, 0.1, 0.1)
    waits = [timeouts.timeouts("a.test", n, READ, TOTAL) for n in range(5)]
    assert [w.read for w in waits] == [2.0, 4.0, 8.0, READ, READ]
    assert [w.total for w in waits] == [2.0, 4.0, 8.0, 16.0, TOTAL]


def test_a_huge_count_of_earlier_timeouts_still_gives_the_configured_timeouts() -> None:
    timeouts = estimator(min_samples=1)
    answered(timeouts, "a.test", 0.1)
    assert timeouts.timeouts("a.test", 10_000, READ, TOTAL) == Timeouts(READ, TOTAL)


def test_domains_are_estimated_apart() -> None:
    timeouts = estimator(floor=0.5, min_samples=1)
    answered(timeouts, "fast.test", 0.1, 0.1)
    answered(timeouts, "slow.test", 4.0, 4.0)
    assert timeouts.timeouts("fast.test", 0, READ, TOTAL).read < timeouts.timeouts("slow.test", 0, READ, TOTAL).read


def test_a_domain_idle_for_the_idle_time_is_forgotten_and_gets_the_configured_timeouts_again() -> None:
    clock = FakeClock()
    timeouts = estimator(clock, min_samples=1, idle_seconds=600.0)
    answered(timeouts, "a.test", 0.1)
    clock.advance(599.0)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(2.0, 2.0)
    clock.advance(1.0)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(READ, TOTAL)
    assert len(timeouts) == 0


def test_an_answer_keeps_its_domain_remembered() -> None:
    clock = FakeClock()
    timeouts = estimator(clock, min_samples=1, idle_seconds=600.0)
    for _ in range(5):
        answered(timeouts, "a.test", 0.1)
        clock.advance(500.0)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(2.0, 2.0)


def test_past_the_cap_the_least_recently_answered_domain_is_forgotten() -> None:
    timeouts = estimator(min_samples=1, max_domains=3)
    answered(timeouts, "a.test", 0.1)
    answered(timeouts, "b.test", 0.1)
    answered(timeouts, "c.test", 0.1)
    answered(timeouts, "a.test", 0.1)  # a is now the most recent
    answered(timeouts, "d.test", 0.1)
    assert len(timeouts) == 3
    assert timeouts.timeouts("b.test", 0, READ, TOTAL) == Timeouts(READ, TOTAL)
    assert timeouts.timeouts("a.test", 0, READ, TOTAL) == Timeouts(2.0, 2.0)
