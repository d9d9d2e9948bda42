"""Each job's state and weight in the store, from the `jobs` stream: the newest record wins,
replaying the stream from its start changes nothing, and cancelled tasks count apart."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.models import DeadLetter, JobControl, Task
from hutch.store import _SCHEMA, SCHEMA_VERSION, Store


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    store = Store(store_location)
    yield store
    store.close()


def control(action: str, at: float, job: str = "j", weight: float | None = None) -> JobControl:
    return JobControl(job=job, action=action, at=at, weight=weight)  # type: ignore[arg-type]


def test_a_job_starts_running_at_weight_one(store: Store) -> None:
    store.add_job("j", None)
    assert store.job_state("j") == ("running", 1.0)
    assert store.job_state("other") is None


def test_the_newest_record_wins_whatever_order_they_are_applied_in(store: Store) -> None:
    store.add_job("j", None)
    records = [control("pause", 1.0), control("resume", 2.0), control("pause", 3.0)]
    for record in reversed(records):
        store.apply_job_control(record)
    assert store.job_state("j") == ("paused", 1.0)


def test_replaying_the_whole_stream_again_changes_nothing(store: Store) -> None:
    store.add_job("j", None)
    records = [control("pause", 1.0), control("weight", 2.0, weight=3.0), control("resume", 4.0)]
    for _ in range(3):
        for record in records:
            store.apply_job_control(record)
        assert store.job_state("j") == ("running", 3.0)


def test_a_weight_leaves_the_state_and_a_state_leaves_the_weight(store: Store) -> None:
    store.add_job("j", None)
    store.apply_job_control(control("cancel", 5.0))
    store.apply_job_control(control("weight", 6.0, weight=0.5))
    store.apply_job_control(control("weight", 1.0, weight=9.0))  # older: ignored
    assert store.job_state("j") == ("cancelled", 0.5)


def test_records_of_the_same_instant_follow_the_streams_order(store: Store) -> None:
    store.add_job("j", None)
    store.apply_job_control(control("pause", 1.0))
    store.apply_job_control(control("resume", 1.0))
    assert store.job_state("j") == ("running", 1.0)


def test_a_record_for_a_job_this_store_never_saw_records_the_job(store: Store) -> None:
    store.apply_job_control(control("pause", 1.0, job="elsewhere"))
    assert store.job_state("elsewhere") == ("paused", 1.0)
    assert store.job_exists("elsewhere")
    (counts,) = store.counts("elsewhere")
    assert (counts.total, counts.state) == (0, "paused")


def test_counts_carry_state_weight_and_the_cancelled_tasks_apart_from_other_dead(store: Store) -> None:
    store.add_job("j", None)
    tasks = [Task(id=f"t{n}", job="j", url=f"http://a.example/{n}", domain="a.example") for n in range(4)]
    store.add_tasks([(t.id, t.job, t.url, t.domain) for t in tasks])
    store.mark_queued([t.id for t in tasks])
    store.record_dead(DeadLetter(stage="governor", reason="cancelled", detail="", task=tasks[0]), "m0")
    store.record_dead(DeadLetter(stage="governor", reason="cancelled", detail="", task=tasks[1]), "m1")
    store.record_dead(DeadLetter(stage="fetch", reason="not_found", detail="", task=tasks[2]), "m2")
    store.apply_job_control(control("cancel", 1.0))
    store.apply_job_control(control("weight", 2.0, weight=2.5))
    (counts,) = store.counts()
    assert (counts.dead, counts.cancelled, counts.pending) == (3, 2, 1)
    assert (counts.state, counts.weight) == ("cancelled", 2.5)
    assert counts.done  # cancelled: one task has not surfaced yet, but nobody need wait for it


def test_a_version_3_store_gains_job_state_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(";".join(_SCHEMA[:3]))
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO jobs (name, spec, created_at) VALUES ('old', NULL, 0)")
    db.commit()
    db.close()
    store = Store(str(path))
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
        assert store.job_state("old") == ("running", 1.0)
    finally:
        store.close()
