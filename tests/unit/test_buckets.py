"""Token buckets paced by a fake clock: how the governor spaces a domain's releases."""

from __future__ import annotations

import pytest

from hutch.services.governor.buckets import Buckets, TokenBucket

from .clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- TokenBucket ---------------------------------------------------------------------------------


def test_a_new_bucket_starts_empty_so_a_new_owner_cannot_burst(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=5, clock=clock)
    assert bucket.take() is False
    assert bucket.wait_time() == pytest.approx(0.5)


def test_a_bucket_refills_at_its_rate(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=1, clock=clock)
    clock.advance(0.49)
    assert bucket.take() is False
    clock.advance(0.01)
    assert bucket.take() is True


def test_take_consumes_the_token(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    clock.advance(1.0)
    assert bucket.take() is True
    assert bucket.take() is False
    assert bucket.wait_time() == pytest.approx(1.0)


def test_a_bucket_never_holds_more_than_burst_tokens(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=10.0, burst=3, clock=clock)
    clock.advance(3600)
    taken = [bucket.take() for _ in range(5)]
    assert taken == [True, True, True, False, False]


def test_a_burst_of_one_allows_exactly_one_release_after_a_long_pause(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=1, clock=clock)
    clock.advance(60)
    assert bucket.take() is True
    assert bucket.take() is False


def test_wait_time_is_zero_while_a_token_is_there(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=4.0, burst=2, clock=clock)
    clock.advance(0.25)
    assert bucket.wait_time() == 0.0


def test_wait_time_counts_the_fraction_of_a_token_already_refilled(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=0.5, burst=1, clock=clock)  # a token every 2 s
    clock.advance(1.5)
    assert bucket.wait_time() == pytest.approx(0.5)


def test_wait_time_does_not_consume_a_token(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    clock.advance(1.0)
    assert bucket.wait_time() == 0.0
    assert bucket.wait_time() == 0.0
    assert bucket.take() is True


def test_waiting_exactly_wait_time_makes_a_token_available(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=3.0, burst=1, clock=clock)
    clock.advance(0.1)
    clock.advance(bucket.wait_time())
    assert bucket.take() is True


def test_releases_over_a_long_run_match_the_rate(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=1, clock=clock)
    released = 0
    for _ in range(1025):  # 10.25 s in 10 ms steps: releases near 0.5, 1.0, ... 10.0
        clock.advance(0.01)
        if bucket.take():
            released += 1
    assert released == 20


def test_a_clock_going_backwards_neither_adds_nor_removes_tokens(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=1.0, burst=2, clock=clock)
    clock.advance(1.0)
    assert bucket.wait_time() == 0.0
    clock.advance(-10.0)
    assert bucket.take() is True
    assert bucket.take() is False


def test_a_bucket_built_with_a_zero_clock_still_starts_at_that_time() -> None:
    clock = FakeClock(start=0.0)
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    assert bucket.take() is False
    clock.advance(1.0)
    assert bucket.take() is True


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_a_rate_that_is_not_positive_is_refused(rate: float, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        TokenBucket(rate=rate, burst=1, clock=clock)


@pytest.mark.parametrize("burst", [0, -3])
def test_a_burst_below_one_is_refused(burst: int, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="burst must be at least 1"):
        TokenBucket(rate=1.0, burst=burst, clock=clock)


# -- Buckets -------------------------------------------------------------------------------------


def test_each_domain_gets_its_own_bucket(clock: FakeClock) -> None:
    buckets = Buckets(rate=1.0, burst=1, clock=clock)
    buckets["a.example"]
    clock.advance(1.0)
    assert buckets["a.example"].take() is True
    assert buckets["b.example"].take() is False  # first seen now: empty, not sharing a's history
    assert buckets["a.example"].take() is False


def test_the_same_domain_always_gets_the_same_bucket(clock: FakeClock) -> None:
    buckets = Buckets(rate=1.0, burst=1, clock=clock)
    assert buckets["a.example"] is buckets["a.example"]
    assert len(buckets) == 1


def test_taking_from_one_domain_leaves_another_untouched(clock: FakeClock) -> None:
    buckets = Buckets(rate=1.0, burst=1, clock=clock)
    buckets["a.example"]
    buckets["b.example"]
    clock.advance(1.0)
    assert buckets["a.example"].take() is True
    assert buckets["b.example"].take() is True


def test_every_domain_bucket_has_the_configured_limits_and_clock(clock: FakeClock) -> None:
    buckets = Buckets(rate=4.0, burst=3, clock=clock)
    bucket = buckets["a.example"]
    assert (bucket.rate, bucket.burst, bucket.clock) == (4.0, 3, clock)
    assert len(buckets) == 1
    buckets["b.example"]
    assert len(buckets) == 2


def test_buckets_refuse_an_invalid_rate_when_a_domain_is_first_seen(clock: FakeClock) -> None:
    buckets = Buckets(rate=0.0, burst=1, clock=clock)
    with pytest.raises(ValueError, match="rate"):
        buckets["a.example"]


def test_reservations_are_due_one_rate_interval_apart_however_early_they_are_made(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=4.0, burst=1, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    clock.advance(0.6)
    assert bucket.reserve() == pytest.approx(0.4)  # the fourth: due at 1.0
    clock.advance(5.0)
    assert bucket.reserve() == 0.0  # a token was there, and the debt is paid
