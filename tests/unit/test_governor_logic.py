"""The governor's pure parts with a fake clock: buckets, AIMD, leases, capacity, limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch.services.governor.aimd import AdaptiveRate
from hutch.services.governor.buckets import TokenBucket
from hutch.services.governor.capacity import FleetCapacity
from hutch.services.governor.leases import Leases
from hutch.services.governor.limits import DomainLimit, Limits, LimitsError, parse_rate, parse_rate_for

from .clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- buckets: what the governor adds to the plain bucket ------------------------------------


def test_a_debit_from_another_governor_delays_the_next_token(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=4.0, burst=1, clock=clock)
    clock.advance(0.25)
    bucket.debit()
    assert bucket.take() is False
    assert bucket.wait_time() == pytest.approx(0.25)


def test_debts_are_bounded_so_stale_events_cannot_stall_a_domain(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=1, clock=clock)
    bucket.debit(1000)
    assert bucket.wait_time() == pytest.approx((1 + 2 + 1) / 2.0)


def test_emptying_a_bucket_makes_the_next_token_one_interval_away(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    clock.advance(10)
    bucket.empty()
    assert bucket.wait_time() == pytest.approx(0.5)


def test_a_new_rate_applies_from_now_and_keeps_what_was_earned(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    clock.advance(0.5)  # half a token at 1/s
    bucket.set_limits(0.25)
    assert bucket.wait_time() == pytest.approx(2.0)  # the other half at 0.25/s


def test_a_lower_burst_drops_the_tokens_above_it(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=10.0, burst=5, clock=clock)
    clock.advance(10)
    bucket.set_limits(10.0, burst=1)
    assert [bucket.take(), bucket.take()] == [True, False]


def test_releases_at_four_per_second_never_exceed_rate_plus_burst_in_any_second(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=4.0, burst=1, clock=clock)
    times = []
    for _ in range(20000):  # 20 s in 1 ms steps: a release is at most 1 ms late
        clock.advance(0.001)
        if bucket.take():
            times.append(clock.now)
    worst = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert worst <= 5
    assert len(times) >= 79  # lateness is not carried over (burst caps it): keep wake-ups prompt


# -- AIMD ---------------------------------------------------------------------------------


def test_a_single_429_does_not_lower_the_rate() -> None:
    rate = AdaptiveRate(ceiling=4.0, streak_limit=2)
    assert rate.throttled(now=0.0) is False
    assert rate.rate == 4.0


def test_a_streak_of_429s_halves_the_rate() -> None:
    rate = AdaptiveRate(ceiling=4.0, decrease=0.5, streak_limit=2)
    rate.throttled(now=0.0)
    assert rate.throttled(now=0.1) is True
    assert rate.rate == 2.0


def test_a_success_between_429s_breaks_the_streak() -> None:
    rate = AdaptiveRate(ceiling=4.0, streak_limit=2, increase=0.0)
    rate.throttled(0.0)
    rate.succeeded()
    rate.throttled(0.2)
    assert rate.rate == 4.0


def test_answers_arriving_together_lower_the_rate_once_per_cooldown() -> None:
    rate = AdaptiveRate(ceiling=8.0, streak_limit=1, cooldown=1.0)
    for i in range(6):
        rate.throttled(now=10.0 + i * 0.1)
    assert rate.rate == 4.0
    rate.throttled(now=11.2)
    assert rate.rate == 2.0


def test_successes_recover_the_rate_additively_up_to_the_ceiling() -> None:
    rate = AdaptiveRate(ceiling=4.0, streak_limit=1, increase=0.5)
    rate.throttled(0.0)
    assert rate.rate == 2.0
    rate.succeeded()
    assert rate.rate == 2.5
    for _ in range(10):
        rate.succeeded()
    assert rate.rate == 4.0


def test_the_rate_never_drops_below_the_floor() -> None:
    rate = AdaptiveRate(ceiling=1.0, streak_limit=1, floor=0.3, cooldown=0.0)
    for i in range(10):
        rate.throttled(float(i))
    assert rate.rate == 0.3


def test_a_lower_ceiling_caps_the_current_rate() -> None:
    rate = AdaptiveRate(ceiling=4.0)
    rate.set_ceiling(0.5)
    assert (rate.rate, rate.ceiling) == (0.5, 0.5)
    rate.succeeded()
    assert rate.rate == 0.5


# -- leases -------------------------------------------------------------------------------


def test_a_lease_counts_until_its_outcome_names_the_permit() -> None:
    leases = Leases()
    leases.add("g.1", "t1", "a.example", until=100.0)
    leases.add("g.2", "t2", "a.example", until=100.0)
    assert (leases.count("a.example"), leases.total) == (2, 2)
    assert leases.end("g.1") is not None
    assert (leases.count("a.example"), leases.total) == (1, 1)


def test_an_outcome_without_a_permit_id_ends_the_lease_of_its_task() -> None:
    leases = Leases()
    leases.add("g.1", "t1", "a.example", until=100.0)
    assert leases.end(None, "t1") is not None
    assert leases.count("a.example") == 0


def test_the_echo_of_a_known_permit_is_not_counted_twice() -> None:
    leases = Leases()
    assert leases.add("g.1", "t1", "a.example", until=100.0) is True
    assert leases.add("g.1", "t1", "a.example", until=100.0) is False
    assert leases.total == 1


def test_a_newer_permit_for_the_same_task_replaces_the_older_one() -> None:
    leases = Leases()
    leases.add("g.1", "t1", "a.example", until=100.0)
    leases.add("g.2", "t1", "a.example", until=200.0)
    assert leases.total == 1
    assert "g.2" in leases


def test_leases_of_a_dead_fetcher_expire_at_their_deadline() -> None:
    leases = Leases()
    leases.add("g.1", "t1", "a.example", until=100.0)
    leases.add("g.2", "t2", "b.example", until=150.0)
    assert leases.expire(99.0) == []
    assert [lease.permit_id for lease in leases.expire(100.0)] == ["g.1"]
    assert leases.next_expiry() == 150.0
    assert leases.next_expiry("a.example") is None


def test_ending_an_unknown_lease_changes_nothing() -> None:
    leases = Leases()
    assert leases.end("nope") is None
    assert leases.end(None, None) is None


# -- capacity -----------------------------------------------------------------------------


def test_capacity_is_the_fallback_until_a_first_heartbeat() -> None:
    capacity = FleetCapacity(stale_after=3.0, fallback=16)
    assert capacity.total(0.0) == 16


def test_capacity_sums_the_concurrency_of_fresh_fetchers() -> None:
    capacity = FleetCapacity(stale_after=3.0)
    capacity.heartbeat("f1", 16, 3, now=10.0)
    capacity.heartbeat("f2", 8, 0, now=11.0)
    assert capacity.total(12.0) == 24
    assert capacity.busy(12.0) == 3
    assert capacity.total(13.5) == 8  # f1 silent for more than 3 s: died or stuck
    assert capacity.total(20.0) == 0  # every fetcher gone: nothing may be released


# -- limits -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "rate"), [("2", 2.0), ("2/s", 2.0), ("0.5/s", 0.5), ("30/m", 0.5), ("36/h", 0.01)])
def test_rates_are_read_per_second_minute_or_hour(text: str, rate: float) -> None:
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["fast", "0", "-1/s", ""])
def test_a_bad_rate_is_refused(text: str) -> None:
    with pytest.raises(LimitsError):
        parse_rate(text)


def test_rate_for_entries_are_domain_equals_rate() -> None:
    assert parse_rate_for("a.example=2/s, B.example=0.5") == {"a.example": 2.0, "b.example": 0.5}
    with pytest.raises(LimitsError, match="DOMAIN=RATE"):
        parse_rate_for("a.example")


def test_a_domain_without_override_gets_the_defaults() -> None:
    limits = Limits(DomainLimit(2.0, 1, 8))
    assert limits.for_key("a.example") == DomainLimit(2.0, 1, 8)


def test_limits_file_overrides_per_domain_and_parents_cover_subdomains(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(
        "default: {rate: 3, concurrency: 4}\n"
        "domains:\n"
        "  example.com: {rate: 0.5}\n"
        "  '127.0.0.1:8001': {rate: 4, burst: 2, concurrency: 2}\n"
    )
    limits = Limits.load(rate=2.0, burst=1, concurrency=8, path=path, rate_for="other.org=1/s")
    assert limits.for_key("unknown.net") == DomainLimit(3.0, 1, 4)
    assert limits.for_key("example.com") == DomainLimit(0.5, 1, 4)
    assert limits.for_key("www.shop.example.com") == DomainLimit(0.5, 1, 4)
    assert limits.for_key("127.0.0.1:8001") == DomainLimit(4.0, 2, 2)
    assert limits.for_key("127.0.0.1:8002") == DomainLimit(3.0, 1, 4)
    assert limits.for_key("other.org") == DomainLimit(1.0, 1, 4)


def test_rate_for_wins_over_the_limits_file(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("domains:\n  example.com: {rate: 0.5, burst: 3}\n")
    limits = Limits.load(rate=2.0, burst=1, concurrency=8, path=path, rate_for="example.com=5/s")
    assert limits.for_key("example.com") == DomainLimit(5.0, 3, 8)


@pytest.mark.parametrize(
    "text",
    ["domains: {example.com: {speed: 1}}", "domains: {example.com: {rate: 0}}", "nonsense: 1", "[1, 2"],
)
def test_a_bad_limits_file_is_refused_at_load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    with pytest.raises(LimitsError):
        Limits.load(rate=2.0, burst=1, concurrency=8, path=path)


def test_a_missing_limits_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(LimitsError, match="cannot read limits file"):
        Limits.load(rate=2.0, burst=1, concurrency=8, path=tmp_path / "nope.yaml")
