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


# -- the carry: releases that come a little late -------------------------------------------------


def releases_late_by(bucket: TokenBucket, clock: FakeClock, lateness: list[float], seconds: float) -> list[float]:
    """Take each token as soon as it is due plus the next lateness (cycled); the times."""
    taken: list[float] = []
    start, k = clock.now, 0
    while clock.now - start < seconds:
        clock.advance(bucket.wait_time() + lateness[k % len(lateness)] + 1e-9)
        assert bucket.take()
        taken.append(clock.now)
        k += 1
    return taken


def worst_window(times: list[float]) -> int:
    """The most releases within any half-open 1-second window."""
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


def test_a_release_a_little_late_does_not_push_back_the_next(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=8.0, burst=1, clock=clock)
    clock.advance(0.125 + 0.010)  # 10 ms after its token
    assert bucket.take()
    clock.advance(0.115)  # the next is due on the rate's own beat, 0.250 from the start
    assert bucket.take()


def test_a_dispatcher_always_5_ms_late_still_gets_the_whole_rate(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=8.0, burst=1, clock=clock)
    taken = releases_late_by(bucket, clock, [0.005], seconds=10.0)
    assert len(taken) >= 79  # without the carry: 10 s / 0.130 s = 76


@pytest.mark.parametrize(("rate", "burst"), [(8.0, 1), (4.0, 1), (2.5, 1), (0.5, 1), (3.7, 2), (10.0, 3)])
def test_however_late_the_releases_no_second_holds_more_than_rate_plus_burst(
    clock: FakeClock, rate: float, burst: int
) -> None:
    bucket = TokenBucket(rate=rate, burst=burst, clock=clock)
    clock.advance(10.0)  # full, with its carry
    lateness = [0.0, 0.0, 0.004, 0.031, 0.0, 0.2, 0.0, 0.009, 0.6, 0.0, 0.0, 0.017]
    taken = releases_late_by(bucket, clock, lateness, seconds=60.0)
    assert worst_window(taken) <= int(rate + burst)
    assert 0 < bucket.carry < 1.0
