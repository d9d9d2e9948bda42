"""A job's proxy budget in the store: its spend counted once per attempt, from the events the
storer applies, on both backends; over budget only while running; the pause's reason kept
until a resume, which may bring a new budget."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.models import Event, JobControl
from hutch.store import _SCHEMA, SCHEMA_VERSION, Store


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    store = Store(store_location)
    yield store
    store.close()


def job(store: Store, name: str = "j", budget: float | None = 0.01, tasks: int = 2) -> None:
    store.add_job(name, {"fields": {}, "budget": budget} if budget is not None else {"fields": {}})
    store.add_tasks([(f"{name}-t{n}", name, f"http://a.test/{n}", "a.test") for n in range(tasks)])


def attempt(
    n: int, cost: float | None = 0.003, outcome: str = "ok", proxy: str | None = "px-1", name: str = "j", task: int = 0
) -> Event:
    return Event(
        kind="outcome", task_id=f"{name}-t{task}", job=name, domain="a.test", attempt=n, at=1000.0 + n,
        outcome=outcome, proxy_id=proxy, tier="residential" if proxy else None, cost=cost, next="retry", delay=1.0,
    )  # fmt: skip


def spent(store: Store, name: str = "j") -> float:
    found = store.job_budget(name)
    assert found is not None
    return round(found[1], 9)


def test_a_jobs_budget_comes_from_its_spec_and_its_spend_from_its_proxied_attempts(store: Store) -> None:
    job(store)
    assert store.job_budget("j") == (0.01, 0.0)
    store.apply_events([attempt(1), attempt(2, cost=0.001, outcome="blocked", task=1)])
    assert spent(store) == 0.004


def test_an_event_applied_again_costs_nothing_more(store: Store) -> None:
    job(store)
    for _ in range(3):  # a redelivered event, or a storer that stopped before its ack
        store.apply_events([attempt(1), attempt(2)])
    assert spent(store) == 0.006


def test_attempts_that_sent_no_request_or_went_direct_cost_nothing(store: Store) -> None:
    job(store)
    store.apply_events([
        attempt(1, outcome="no_proxy"), attempt(2, outcome="permit_late"), attempt(3, outcome="forbidden_target"),
        attempt(4, proxy=None, cost=None), attempt(5, cost=None),
    ])  # fmt: skip
    assert spent(store) == 0.0
    store.apply_events([attempt(6, outcome="proxy_failure"), attempt(7, outcome="timeout")])  # sent, and billed
    assert spent(store) == 0.006


def test_the_spend_is_the_cost_reports_sum(store: Store) -> None:
    from hutch.services.proxy_manager.costs import cost_summary

    job(store, budget=100.0)
    store.apply_events(
        [attempt(n, outcome=o) for n, o in enumerate(["ok", "blocked", "no_proxy", "reset", "never_sent"])]
    )
    assert spent(store) == round(sum(row["cost"] for row in cost_summary(store, "j")), 9) == 0.009


def test_a_job_is_over_budget_once_its_spend_reaches_it_and_only_while_running(store: Store) -> None:
    job(store)
    job(store, "other", budget=None)
    store.apply_events([attempt(1), attempt(2), attempt(3, name="other")])
    assert store.over_budget(["j", "other"]) == []
    store.apply_events([attempt(3), attempt(4)])  # 0.012: past 0.01
    assert store.over_budget(["j", "other", "unknown"]) == ["j"]
    store.apply_job_control(JobControl(job="j", action="pause", reason="budget", at=2000.0))
    assert store.over_budget(["j"]) == []
    (counts,) = store.counts("j")
    assert (counts.state, counts.reason, counts.budget, counts.spent) == ("paused", "budget", 0.01, 0.012)


def test_a_job_without_a_budget_counts_no_spend_and_is_never_over(store: Store) -> None:
    job(store, budget=None)
    store.apply_events([attempt(n) for n in range(10)])
    assert store.job_budget("j") == (None, 0.0)
    assert store.over_budget(["j"]) == []
    (counts,) = store.counts("j")
    assert (counts.budget, counts.reason) == (None, None)


def test_a_resume_clears_the_reason_and_may_bring_a_new_budget(store: Store) -> None:
    job(store)
    store.apply_events([attempt(n) for n in range(4)])
    store.apply_job_control(JobControl(job="j", action="pause", reason="budget", at=2000.0))
    store.apply_job_control(JobControl(job="j", action="resume", budget=0.05, at=2001.0))
    (counts,) = store.counts("j")
    assert (counts.state, counts.reason, counts.budget, counts.spent) == ("running", None, 0.05, 0.012)
    assert store.over_budget(["j"]) == []
    store.apply_job_control(JobControl(job="j", action="pause", at=2002.0))  # a person's pause: no reason
    assert store.counts("j")[0].reason is None


def test_an_older_record_changes_neither_the_reason_nor_the_budget(store: Store) -> None:
    job(store)
    store.apply_job_control(JobControl(job="j", action="pause", reason="budget", at=2000.0))
    store.apply_job_control(JobControl(job="j", action="resume", budget=9.0, at=1999.0))
    (counts,) = store.counts("j")
    assert (counts.state, counts.reason, counts.budget) == ("paused", "budget", 0.01)


def test_a_budget_given_later_starts_from_what_the_job_spent_so_far(store: Store) -> None:
    job(store, budget=None)
    store.apply_events([attempt(1), attempt(2), attempt(3, outcome="no_proxy")])
    store.add_job("j", {"fields": {}, "budget": 1.0})  # submitted again with a budget
    assert store.job_budget("j") == (1.0, 0.006)
    job(store, "k", budget=None)
    store.apply_events([attempt(1, name="k")])
    store.apply_job_control(JobControl(job="k", action="resume", budget=2.0, at=2000.0))
    assert store.job_budget("k") == (2.0, 0.003)


def test_resubmitting_with_the_same_budget_keeps_the_spend(store: Store) -> None:
    job(store)
    store.apply_events([attempt(1)])
    job(store)
    assert store.job_budget("j") == (0.01, 0.003)


def test_a_version_7_store_gains_budgets_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "v7.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(";".join(_SCHEMA[:7]))
    db.execute("PRAGMA user_version = 7")
    db.execute("INSERT INTO jobs (name, spec, created_at) VALUES ('old', NULL, 0)")
    db.commit()
    db.close()
    store = Store(str(path))
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 8
        assert store.job_budget("old") == (None, 0.0)
        assert store.counts("old")[0].reason is None
    finally:
        store.close()
