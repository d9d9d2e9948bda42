"""A permit's lateness at the fetcher, and the bound its rate allows: pacing at the site."""

from __future__ import annotations

import pytest

from hutch.services.fetcher.lateness import Lateness
from hutch.services.governor.core import late_after

from .clock import FakeClock


def test_the_quickest_permit_is_on_time_and_others_are_late_by_what_they_took_more() -> None:
    clock = FakeClock()
    lateness = Lateness(clock)
    assert lateness.of("g1.1", issued=clock.now - 0.004) == 0.0  # 4 ms on the way
    assert lateness.of("g1.2", issued=clock.now - 0.104) == pytest.approx(0.100)
    assert lateness.of("g1.3", issued=clock.now - 0.002) == 0.0  # quicker: the new best
    assert lateness.of("g1.4", issued=clock.now - 0.012) == pytest.approx(0.010)


def test_a_clock_offset_between_the_hosts_cancels_out() -> None:
    # The governor's clock is 50 ms ahead: every `issued` looks 50 ms in the future.
    clock = FakeClock()
    lateness = Lateness(clock)
    assert lateness.of("g1.1", issued=clock.now + 0.050 - 0.003) == 0.0
    assert lateness.of("g1.2", issued=clock.now + 0.050 - 0.033) == pytest.approx(0.030)


def test_each_governor_is_measured_against_its_own_quickest_permit() -> None:
    clock = FakeClock()
    lateness = Lateness(clock)
    lateness.of("g1.1", issued=clock.now - 0.001)
    assert lateness.of("g2.1", issued=clock.now - 0.200) == 0.0  # another clock, its first permit


def test_the_quickest_transit_is_forgotten_after_the_window() -> None:
    clock = FakeClock()
    lateness = Lateness(clock)
    lateness.of("g1.1", issued=clock.now - 0.001)
    clock.advance(31.0)
    assert lateness.of("g1.2", issued=clock.now - 0.050) == 0.0  # a clock step, or a slower path


@pytest.mark.parametrize(
    ("rate", "burst", "expected"),
    [
        (4.0, 1, 0.05),  # 0.9 / 4 = 0.225: the setting binds
        (20.0, 1, 0.045),  # 0.9 / 20
        (2.5, 1, 0.05),  # 3.5 lacks 0.5 of 4: 0.9 x 0.5 / 2.5 = 0.18
        (3.7, 2, 0.05),  # 5.7 lacks 0.3: 0.9 x 0.3 / 3.7 = 0.073
        (60.0, 1, 0.015),
    ],
)
def test_the_lateness_a_rate_allows(rate: float, burst: int, expected: float) -> None:
    assert late_after(rate, burst, lateness=0.05) == pytest.approx(expected)


def test_above_about_90_per_second_no_bound_is_given() -> None:
    assert late_after(100.0, 1, lateness=0.05) is None
    assert late_after(100_000.0, 1, lateness=0.05) is None


@pytest.mark.parametrize(("rate", "burst"), [(8.0, 1), (4.0, 1), (2.5, 1), (0.5, 1), (3.7, 2), (20.0, 3), (60.0, 1)])
def test_fetches_within_the_bound_keep_every_second_within_rate_plus_burst(rate: float, burst: int) -> None:
    # Releases exactly at the bucket's pace (the worst case: every token used at once), each
    # fetched a different amount late, up to the bound: no 1-second window at the site holds
    # more than rate + burst.
    bound = late_after(rate, burst, lateness=0.05)
    assert bound is not None
    releases = [0.0] * burst + [k / rate for k in range(1, int(rate * 20))]
    delays = [0.0, bound, 0.3 * bound, bound, 0.0, 0.9 * bound]
    fetches = sorted(t + delays[k % len(delays)] for k, t in enumerate(releases))
    worst = max(sum(1 for t in fetches if start <= t < start + 1.0) for start in fetches)
    assert worst <= int(rate + burst)


def test_a_permit_issued_ahead_is_held_until_its_moment_plus_the_quickest_transit() -> None:
    clock = FakeClock()
    lateness = Lateness(clock)
    lateness.of("g1.1", issued=clock.now - 0.004)  # the quickest: 4 ms
    # Issued 10 ms ago for 200 ms after its issue: due in 194 ms here.
    assert lateness.of("g1.2", issued=clock.now - 0.010, not_before=clock.now + 0.190) == pytest.approx(-0.194)
    # One that arrives after its moment is late by the difference.
    assert lateness.of("g1.3", issued=clock.now - 0.300, not_before=clock.now - 0.030) == pytest.approx(0.026)


@pytest.mark.parametrize("rate", [8.0, 9.5, 20.0])
def test_fetchers_50_ms_either_side_of_the_governors_clock_keep_the_buckets_spacing(rate: float) -> None:
    # Two fetchers, one clock 50 ms ahead of the governor's, one 50 ms behind, take permits
    # issued ahead in turn, each delivered a different time after its issue. Each holds its
    # permit until its moment on its own clock; on the governor's clock (the site's) each
    # fetch comes at its moment plus that fetcher's quickest transit so far: the skew is gone.
    governor = FakeClock()
    fetchers = [(Lateness(FakeClock()), +0.050), (Lateness(FakeClock()), -0.050)]
    transits = [0.003, 0.040, 0.012, 0.090, 0.005, 0.020]
    fetches = []
    for k in range(int(rate * 20)):
        lateness, skew = fetchers[k % 2]
        moment = governor.now + (k + 1) / rate
        issued = moment - 0.2  # released 200 ms ahead
        arrival = issued + transits[k % len(transits)]
        lateness.clock.now = arrival + skew  # type: ignore[attr-defined]
        late = lateness.of(f"g1.{k}", issued=issued, not_before=moment)
        assert late <= 0.0  # every one came early enough
        fetches.append(arrival - late)  # held until then, on the governor's clock
    moments = [governor.now + (k + 1) / rate for k in range(len(fetches))]
    assert all(m + 0.003 - 1e-9 <= f <= m + 0.040 + 1e-9 for f, m in zip(fetches, moments, strict=True))
    worst = max(sum(1 for t in fetches if start <= t < start + 1.0) for start in fetches)
    assert worst <= int(rate + 1)
