"""How long the governor parks a task: never so long that its domain idles while work waits."""

from __future__ import annotations

from hutch.services.governor.app import JobLine

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
