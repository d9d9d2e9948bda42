"""How long the governor parks a task: never so long that its domain idles while work waits."""

from __future__ import annotations

import pytest

from hutch.services.governor.lines import (
    EXACT_LEAD,
    PACED_PARK_MAX,
    PARK_BUDGET,
    RETURN_MARGIN,
    RETURN_ROOM,
    DomainLine,
    JobLine,
    back_by,
    paced,
    park_delay,
    park_slot,
    return_room,
)

NOW = 1_000.0


def line(held: int, returns: dict[int, int] | None = None) -> JobLine:
    jl = JobLine(returns=dict(returns or {}))
    jl.held.extend([object()] * held)  # type: ignore[list-item]
    return jl


def test_with_nothing_parked_the_supply_is_what_is_held_at_the_jobs_share() -> None:
    assert line(held=50).supply(NOW, share=10.0) == 5.0


def test_parked_tasks_that_come_back_in_time_add_to_the_supply() -> None:
    # 50 held last 5 s; 100 back at +5 s keep it going to 15 s; 700 back at +15 s to 85 s.
    jl = line(held=50, returns={int(NOW) + 5: 100, int(NOW) + 15: 700})
    assert jl.supply(NOW, share=10.0) == 85.0


def test_tasks_that_come_back_after_a_gap_do_not_count() -> None:
    # 50 held last 5 s, and nothing comes back until +30 s: a task parked now must be back
    # within 5 s, however many wait in the 30 s tier.
    jl = line(held=50, returns={int(NOW) + 30: 700})
    assert jl.supply(NOW, share=10.0) == 5.0


def test_a_parked_count_ends_at_the_second_its_tasks_are_due_back() -> None:
    jl = line(held=0, returns={int(NOW) + 5: 3, int(NOW) - 1: 4})
    assert jl.parked(NOW) == 3
    assert jl.parked(NOW + 6) == 0 and jl.returns == {}


def test_a_task_that_comes_back_is_no_longer_counted_as_to_come() -> None:
    jl = line(held=0, returns={int(NOW) + 5: 2})
    jl.came_back(int(NOW) + 5)
    assert jl.returns == {int(NOW) + 5: 1}
    jl.came_back(int(NOW) + 5)
    jl.came_back(int(NOW) + 5)  # one parked by an earlier governor: nothing to take back
    jl.came_back(int(NOW) + 9)
    assert jl.returns == {}


def test_a_parked_task_counts_as_back_only_from_the_second_it_is_surely_back_by() -> None:
    """Parked at 12.9 s into the 10 s tier, a task is back at 22.9 s. At 22.0 s the 5 held of
    a job at 10/s last 0.5 s, so the gap before it comes is seen, and a task parked then is
    sent to come back within 0.5 s; counted from 22 s, the supply looked 10.5 s long."""
    back = back_by(NOW + 12.9, 10.0)
    assert back == int(NOW) + 23
    assert line(held=5, returns={back: 100}).supply(NOW + 22.0, share=10.0) == 0.5
    assert line(held=50, returns={back: 100}).supply(NOW + 18.0, share=10.0) == 15.0  # in time: counted


def busy_domain(since: float, releases: dict[int, int]) -> DomainLine:
    domain = DomainLine(busy_since=since)
    for second, count in releases.items():
        for _ in range(count):
            domain.released(second + 0.5)
    return domain


def test_a_domain_has_no_pace_until_it_has_been_busy_a_whole_second() -> None:
    assert DomainLine().pace(NOW) is None
    assert busy_domain(NOW - 0.5, {}).pace(NOW) is None


def test_the_pace_is_the_busiest_whole_second_of_the_last_few_while_busy() -> None:
    # Busy since NOW - 10: the seconds NOW-5 .. NOW-1 count; the current one is not whole.
    domain = busy_domain(NOW - 10, {int(NOW) - 4: 30, int(NOW) - 2: 12, int(NOW) - 1: 20, int(NOW): 90})
    assert domain.pace(NOW) == 30.0


def test_seconds_before_the_domain_was_busy_do_not_count() -> None:
    domain = busy_domain(NOW - 2.5, {int(NOW) - 4: 30, int(NOW) - 1: 8})
    assert domain.pace(NOW) == 8.0


def test_old_release_counts_are_forgotten() -> None:
    domain = busy_domain(NOW - 100, {int(NOW) - 50 + k: 1 for k in range(50)})
    assert len(domain.releases) <= 7


def test_a_domain_that_keeps_its_rate_parks_at_its_share_of_the_rate() -> None:
    jl = line(held=50, returns={int(NOW) + 5: 100, int(NOW) + 15: 700})
    assert park_delay(jl, NOW, share=10.0, rate=10.0, pace=10.0, blocked_until=0.0) == 85.0
    assert park_delay(jl, NOW, share=10.0, rate=10.0, pace=None, blocked_until=0.0) == 85.0


def test_a_domain_the_fleet_paces_below_its_rate_parks_at_twice_its_pace_for_30_s_at_most() -> None:
    # Rate 1,000/s, drained at 5/s: at 10/s, 50 held last 5 s; 150 more back in time, 20 s.
    assert park_delay(line(held=50), NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0) == 5.0
    jl = line(held=50, returns={int(NOW) + 5: 150})
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0) == 20.0
    # 800 back in time would carry it 85 s: a guess of a pace is not trusted that far.
    jl = line(held=50, returns={int(NOW) + 5: 800})
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0) == 30.0
    # Counted at its rate it would look a few milliseconds long: the shortest tier, again and again.
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=None, blocked_until=0.0) == 0.05


def test_a_task_back_to_a_full_hold_parks_at_the_smaller_return_margin() -> None:
    # Drained at 5/s: 50 held and 150 back in 5 s cover 20 s at 10/s, 200 / 7.5 at 7.5/s.
    jl = line(held=50, returns={int(NOW) + 5: 150})
    first = park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0)
    again = park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0, margin=RETURN_MARGIN)
    assert first == 20.0
    assert again == pytest.approx(200 / (RETURN_MARGIN * 5.0))
    assert again > first
    # Where the rate binds, the margin changes nothing: the rate is a fact, not a guess.
    jl = line(held=50, returns={int(NOW) + 5: 100, int(NOW) + 15: 700})
    assert park_delay(jl, NOW, share=10.0, rate=10.0, pace=10.0, blocked_until=0.0, margin=RETURN_MARGIN) == 85.0


def test_a_longer_limit_lets_a_long_backlog_park_for_its_supply() -> None:
    # 5,000 parked and 50 held at 5/s (counted at 10/s): 505 s of supply. At most 30 s would
    # cost 5,050 / 30 = 168 parks a second; the governor gives the limit as its whole backlog
    # over PARK_BUDGET when that is longer.
    jl = line(held=50, returns={int(NOW) + 5: 1000, int(NOW) + 30: 4000})
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0) == 30.0
    longest = max(PACED_PARK_MAX, 5050 / PARK_BUDGET)
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=0.0, longest=longest) == (
        pytest.approx(min(505.0, longest))
    )
    # The supply still binds where it is shorter: 2,150 in all at 50/s (counted at 100/s), 21.5 s.
    jl = line(held=200, returns={int(NOW) + 1: 950, int(NOW) + 5: 1000})
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=50.0, blocked_until=0.0, longest=505.0) == (
        pytest.approx(21.5)
    )


def test_a_long_wait_of_the_domain_outlasts_any_supply() -> None:
    jl = line(held=50)
    assert park_delay(jl, NOW, share=1000.0, rate=1000.0, pace=5.0, blocked_until=NOW + 60) == 60.0


LADDER = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
LEAD = EXACT_LEAD


def test_a_park_into_empty_queues_goes_for_exactly_its_wait_in_the_shortest_tier_long_enough() -> None:
    heads: dict[float, float] = {}
    assert park_slot(LADDER, heads, NOW, 14.7) == (20.0, 14.7 - LEAD)
    assert heads == {20.0: NOW + 14.7 - LEAD}


def test_later_parks_share_a_queue_while_their_expiries_stay_in_order() -> None:
    heads: dict[float, float] = {}
    assert park_slot(LADDER, heads, NOW, 14.0) == (20.0, 14.0 - LEAD)
    assert park_slot(LADDER, heads, NOW + 0.1, 14.5) == (20.0, 14.5 - LEAD)  # behind it, and later: in order
    # Sooner than the last park in the 20 s queue: it would wait behind it, so the next
    # queue long enough and free.
    assert park_slot(LADDER, heads, NOW + 0.2, 13.0) == (30.0, 13.0 - LEAD)
    # Of the queues it fits, the one whose last park expires latest: the others stay free.
    assert park_slot(LADDER, heads, NOW + 0.3, 14.7) == (20.0, 14.7 - LEAD)
    assert heads == pytest.approx({20.0: NOW + 0.3 + 14.7 - LEAD, 30.0: NOW + 0.2 + 13.0 - LEAD})


def test_with_no_queue_free_in_time_a_park_takes_the_longest_tier_not_longer_for_all_of_it() -> None:
    late = {d: NOW + 100.0 for d in LADDER}  # an earlier governor's parks, expiring late
    assert park_slot(LADDER, dict(late), NOW, 14.0) == (10.0, 10.0)
    # For its whole TTL: every park in its queue expires sooner, so it waits behind none.
    heads = {**late, 10.0: NOW + 9.0}
    assert park_slot(LADDER, heads, NOW, 14.0) == (10.0, 10.0)
    assert heads[10.0] == NOW + 10.0


def test_a_park_shorter_than_the_shortest_tier_is_parked_for_that_tier() -> None:
    assert park_slot(LADDER, {}, NOW, 0.01) == (1.0, 1.0)
    assert park_slot(LADDER, {}, NOW, LEAD + 0.5) == (1.0, 1.0)


def test_a_park_longer_than_every_tier_is_parked_for_the_longest() -> None:
    assert park_slot(LADDER, {}, NOW, 500.0) == (60.0, 60.0)


def test_a_wait_timed_by_a_guessed_pace_takes_the_longest_tier_not_longer_even_with_queues_free() -> None:
    heads: dict[float, float] = {}
    assert park_slot(LADDER, heads, NOW, 13.7, exact=False) == (10.0, 10.0)
    assert heads == {10.0: NOW + 10.0}


def test_parks_are_timed_by_the_pace_only_when_the_margin_on_it_is_below_the_rate() -> None:
    assert paced(rate=100.0, pace=30.0, margin=2.0)
    assert not paced(rate=50.0, pace=30.0, margin=2.0)  # the rate binds: a fact, parked exactly
    assert not paced(rate=100.0, pace=None, margin=2.0)  # no pace measured yet


def test_a_domain_with_nothing_held_and_well_below_its_rate_is_starved() -> None:
    d = DomainLine(releases={int(NOW) - 1: 40, int(NOW): 3})
    assert d.starved(NOW, rate=100.0)


def test_a_domain_that_holds_a_task_is_not_starved() -> None:
    d = DomainLine(jobs={"job": line(held=1)})
    assert not d.starved(NOW, rate=100.0)


def test_a_domain_its_rate_holds_back_is_not_starved() -> None:
    """Idle between its turns by design: its parks come back for their turns."""
    d = DomainLine(releases={int(NOW) - 2: 8, int(NOW) - 1: 7})
    assert not d.starved(NOW, rate=8.0)
    assert DomainLine(releases={int(NOW) - 1: 7}).starved(NOW, rate=8.0)  # 7 < 0.9 x 8


def test_only_recent_seconds_say_whether_the_rate_holds_a_domain_back() -> None:
    d = DomainLine(releases={int(NOW) - 30: 8, int(NOW) - 1: 2})
    assert d.starved(NOW, rate=8.0)


def test_a_domain_in_a_long_wait_is_not_starved() -> None:
    d = DomainLine(blocked_until=NOW + 5.0)
    assert not d.starved(NOW, rate=100.0)


def test_a_domains_parks_out_are_the_queues_it_has_parks_due_back_in_after_a_moment_longest_first() -> None:
    d = DomainLine()
    d.parked_at(5.0, NOW + 4.0)
    d.parked_at(20.0, NOW + 18.0)
    d.parked_at(1.0, NOW + 0.3)
    d.parked_at(5.0, NOW + 2.0)  # an earlier expiry in the same queue does not shorten it
    assert d.parked_in[5.0] == NOW + 4.0
    assert d.parks_out(NOW + 0.5) == [20.0, 5.0]
    assert d.parks_out(NOW + 10.0) == [20.0]


def test_a_paced_domain_may_hold_its_returns_past_its_hold_for_the_holds_horizon_at_most() -> None:
    assert return_room(pace=60.0, horizon=5.0) == RETURN_ROOM
    assert return_room(pace=2.0, horizon=5.0) == 10  # 5 s of its pace
    assert return_room(pace=0.1, horizon=5.0) == 1
    assert return_room(pace=0.0, horizon=5.0) == 0
