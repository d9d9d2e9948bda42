"""`hutch status --domains` at 100,000 domains: what a governor selects before it answers, and
how several governors' answers merge."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hutch.models import GovernorStatus, StatusRequest
from hutch.services.governor.status import merge_answers, select_domains


def row(domain: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "domain": domain,
        "key": domain,
        "rate": 1.0,
        "ceiling": 1.0,
        "burst": 1,
        "concurrency": 2,
        "in_flight": 0,
        "paused_for": 0.0,
        "pause_reason": "",
        "takeover_wait": 0.0,
        "active": True,
        "released": 0,
        "throttled": 0,
        "robots_cap": None,
        "held": 0,
        "parked": 0,
        "jobs": 0,
        "oldest_held": 0.0,
    }
    return {**base, **fields}


def names(rows: list[dict[str, Any]]) -> list[str]:
    return [r["domain"] for r in rows]


def test_the_default_selection_is_the_twenty_domains_holding_most_tasks_out_of_all() -> None:
    rows = [row(f"d{n:05}.example", held=n % 97) for n in range(100_000)]
    selected, total = select_domains(rows, StatusRequest())
    assert total == 100_000
    assert len(selected) == 20
    assert all(r["held"] == 96 for r in selected)
    assert names(selected) == sorted(names(selected))  # ties go by name


@pytest.mark.parametrize("key", ["in_flight", "released", "throttled", "rate", "parked", "oldest_held", "jobs"])
def test_each_numeric_sort_puts_the_largest_first(key: str) -> None:
    rows = [row("a.example", **{key: 1}), row("b.example", **{key: 5}), row("c.example", **{key: 3})]
    selected, _ = select_domains(rows, StatusRequest(sort=key))  # type: ignore[arg-type]
    assert names(selected) == ["b.example", "c.example", "a.example"]


def test_sorting_by_name_is_alphabetical() -> None:
    rows = [row("c.example"), row("a.example"), row("b.example")]
    selected, _ = select_domains(rows, StatusRequest(sort="name", top=2))
    assert names(selected) == ["a.example", "b.example"]


def test_a_row_without_a_number_under_the_sort_key_sorts_as_zero() -> None:
    old = row("old.example")
    del old["held"]
    rows = [old, row("new.example", held=2), row("none.example", held=None)]
    selected, _ = select_domains(rows, StatusRequest())
    assert names(selected) == ["new.example", "none.example", "old.example"]
    odd = [*rows, row("odd.example", held="many")]  # not a number: as 0 too
    assert names(select_domains(odd, StatusRequest())[0]) == [
        "new.example",
        "none.example",
        "odd.example",
        "old.example",
    ]


def test_a_glob_filters_on_the_domain_case_insensitively_and_the_total_counts_all_rows() -> None:
    rows = [row("a.shop.example"), row("B.Shop.example"), row("blog.example"), row("shop.example.org")]
    selected, total = select_domains(rows, StatusRequest(match="*.SHOP.example", sort="name"))
    assert names(selected) == ["B.Shop.example", "a.shop.example"]
    assert total == 4


def test_paused_only_keeps_the_domains_paused_now() -> None:
    rows = [row("a.example", paused_for=3.0), row("b.example"), row("c.example", paused_for=0.5)]
    selected, total = select_domains(rows, StatusRequest(paused_only=True, sort="paused_for"))
    assert names(selected) == ["a.example", "c.example"]
    assert total == 3


def test_top_bounds_what_an_answer_carries_and_the_request_refuses_unbounded_queries() -> None:
    rows = [row(f"{n}.example", held=n) for n in range(50)]
    assert names(select_domains(rows, StatusRequest(top=3))[0]) == ["49.example", "48.example", "47.example"]
    for bad in ({"top": 0}, {"top": 10_001}, {"sort": "backlog"}, {"match": ""}, {"match": "x" * 300}):
        with pytest.raises(ValidationError):
            StatusRequest(**bad)


def test_an_empty_selection_still_reports_the_total() -> None:
    assert select_domains([row("a.example")], StatusRequest(match="*.org")) == ([], 1)


def answer(governor: str, started: float, rows: list[dict[str, Any]], total: int = 0) -> GovernorStatus:
    return GovernorStatus(
        governor=governor, started=started, capacity=1, fetchers=1, in_flight=0, domains=rows, total_domains=total
    )


def test_merged_answers_keep_the_active_governors_row_select_again_and_report_the_largest_total() -> None:
    standby = answer("g2", 2.0, [row("a.example", active=False, held=0), row("b.example", active=False)], 900)
    active = answer("g1", 1.0, [row("a.example", held=7), row("c.example", held=3)], 1000)
    rows, total = merge_answers([standby, active], StatusRequest(top=2))
    assert names(rows) == ["a.example", "c.example"]
    assert rows[0]["governor"] == "g1" and rows[0]["held"] == 7
    assert "active" not in rows[0]
    assert total == 1000


def test_answers_of_governors_that_send_every_row_count_the_distinct_domains() -> None:
    one = answer("g1", 1.0, [row("a.example"), row("b.example")])
    two = answer("g2", 2.0, [row("b.example", active=False), row("c.example", active=False)])
    rows, total = merge_answers([one, two], StatusRequest(sort="name"))
    assert names(rows) == ["a.example", "b.example", "c.example"]
    assert [r["governor"] for r in rows] == ["g1", "g1", None]
    assert total == 3
