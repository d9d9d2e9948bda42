"""What the store keeps for the reconciler: latest messages, incarnations, due times, rescues;
and how it is made: durable at commit, private files."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.models import DeadLetter, Event, Item, JobControl, Task, task_id
from hutch.store import _SCHEMA, SCHEMA_VERSION, Silent, Store

JOB = "books"


def make_task(url: str = "http://example.com/a", incarnation: int = 0) -> Task:
    # The trace id pinned as the id is: every copy of one task is in one trace.
    return Task(
        id=task_id(JOB, url), job=JOB, url=url, domain="example.com", submitted_at=1.0, incarnation=incarnation,
        trace_id=task_id(JOB, url),
    )


def released(task: Task, at: float = 100.0) -> Event:
    return Event(
        kind="released", task_id=task.id, job=JOB, domain=task.domain, attempt=task.attempts,
        at=at, incarnation=task.incarnation,
    )  # fmt: skip


def outcome(task: Task, next_step: str, at: float = 110.0, delay: float | None = None) -> Event:
    routed = task.model_copy(update={"attempts": task.attempts + 1})
    return Event(
        kind="outcome", task_id=task.id, job=JOB, domain=task.domain, attempt=routed.attempts, at=at,
        outcome="timeout", next=next_step, delay=delay,  # type: ignore[arg-type]
        incarnation=task.incarnation, task=routed,
    )  # fmt: skip


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    s = Store(store_location)
    yield s
    s.close()


def lost_again(lost: Silent) -> Task:
    """The copy a rescue of `lost` republishes."""
    return make_task(lost.url, incarnation=lost.incarnation + 1)


def submitted(store: Store, task: Task) -> None:
    store.add_tasks([(task.id, task.job, task.url, task.domain)], {task.id: task.model_dump_json()})
    store.mark_queued([task.id])


def row(store: Store, task: Task) -> dict[str, object]:
    found = store.db.execute(
        "SELECT state, incarnation, rescues, due_at, message FROM tasks WHERE id = ?", (task.id,)
    ).fetchone()
    return dict(found)


def test_a_submitted_task_keeps_its_message_and_waits_unwatched_in_its_backlog(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    found = row(store, task)
    assert Task.model_validate_json(str(found["message"])) == task
    assert (found["state"], found["due_at"]) == ("queued", None)
    assert store.silent_tasks(1e12, 1e12, 10) == []


def test_a_release_starts_the_watch_and_a_retry_outcome_keeps_the_routed_task_and_its_due_time(
    store: Store,
) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task, at=100.0))
    assert (row(store, task)["state"], row(store, task)["due_at"]) == ("in_flight", 100.0)
    store.apply_event(outcome(task, "retry", at=110.0, delay=30.0))
    found = row(store, task)
    assert (found["state"], found["due_at"]) == ("retrying", 140.0)
    assert Task.model_validate_json(str(found["message"])).attempts == 1


def test_a_release_arriving_after_its_own_outcome_does_not_put_the_task_back_in_flight(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(outcome(task, "retry", at=110.0, delay=30.0))
    store.apply_event(released(task, at=100.0))  # its batch left the governor after the fetch ended
    found = row(store, task)
    assert (found["state"], found["due_at"]) == ("retrying", 140.0)
    store.apply_event(released(task, at=150.0))  # the next release, after the retry came back
    assert (row(store, task)["state"], row(store, task)["due_at"]) == ("in_flight", 150.0)


@pytest.mark.parametrize("next_step", ["frontier", "parse"])
def test_a_task_back_in_its_backlog_or_on_the_parse_queue_is_not_watched(store: Store, next_step: str) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task))
    store.apply_event(outcome(task, next_step))
    assert row(store, task)["due_at"] is None
    assert store.silent_tasks(1e12, 1e12, 10) == []


def test_silent_tasks_are_those_in_flight_or_retrying_past_their_cutoffs_oldest_first(store: Store) -> None:
    a, b, c = make_task("http://example.com/a"), make_task("http://example.com/b"), make_task("http://example.com/c")
    for task in (a, b, c):
        submitted(store, task)
    store.apply_event(released(a, at=100.0))
    store.apply_event(released(b, at=50.0))
    store.apply_event(outcome(b, "retry", at=60.0, delay=5.0))  # due at 65
    store.apply_event(released(c, at=300.0))
    assert [t.id for t in store.silent_tasks(in_flight_before=200.0, retrying_before=70.0, limit=10)] == [b.id, a.id]
    assert [t.id for t in store.silent_tasks(in_flight_before=200.0, retrying_before=60.0, limit=10)] == [a.id]
    assert [t.id for t in store.silent_tasks(in_flight_before=400.0, retrying_before=0.0, limit=1)] == [a.id]


def test_a_rescue_raises_the_incarnation_then_queues_the_task_and_stale_events_move_nothing(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task, at=100.0))
    (lost,) = store.silent_tasks(200.0, 0.0, 10)
    assert store.begin_rescue(lost, lost_again(lost), now=500.0)
    assert not store.begin_rescue(lost, lost_again(lost), now=500.0)  # claimed once only
    again = task.model_copy(update={"incarnation": 1})
    store.finish_rescue(again, 500.0)
    found = row(store, task)
    assert (found["state"], found["incarnation"], found["rescues"], found["due_at"]) == ("queued", 1, 1, None)
    assert Task.model_validate_json(str(found["message"])) == again  # the copy republished
    # The old copy surfaces: its release and outcome are history, not state.
    store.apply_event(released(task, at=600.0))
    store.apply_event(outcome(task, "retry", at=610.0, delay=1.0))
    assert row(store, task)["state"] == "queued"
    assert len(store.attempts(task.id)) == 1
    store.record_dead(DeadLetter(stage="fetch", reason="not_found", task=task), "old-copy")
    assert row(store, task)["state"] == "queued"
    assert store.dead_entries(job=JOB) == []  # kept as history, purged: not listed, not replayable
    # The new copy moves it.
    store.apply_event(released(again, at=700.0))
    assert row(store, task)["state"] == "in_flight"


def test_a_rescued_copy_released_before_the_rescue_is_finished_stays_in_flight(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task, at=100.0))
    (lost,) = store.silent_tasks(200.0, 0.0, 10)
    assert store.begin_rescue(lost, lost_again(lost), now=500.0)
    again = task.model_copy(update={"incarnation": 1})
    store.apply_event(released(again, at=500.5))  # the governor was quick
    store.finish_rescue(again, 500.0)
    assert (row(store, task)["state"], row(store, task)["due_at"]) == ("in_flight", 500.5)


def test_pages_sent_before_a_moment_are_the_tasks_whose_page_went_to_the_parsers_then(store: Store) -> None:
    # On the wall clock, as the storer sweeps: a task rescued after the moment is not one of them.
    base = time.time()
    early, late, fetching, stored, retried, quick = (make_task(f"http://example.com/{n}") for n in "abcdef")
    for task in (early, late, fetching, stored, retried):
        submitted(store, task)
        store.apply_event(released(task, at=base - 30))
    store.apply_event(outcome(early, "parse", at=base - 20))
    store.apply_event(outcome(late, "parse", at=base + 3600))  # sent after the moment
    store.apply_event(outcome(stored, "parse", at=base - 20))
    store.store_item(Item(task=stored, status=200, fields={}, parsed_at=base - 19))
    store.apply_event(outcome(retried, "retry", at=base - 20, delay=1.0))
    # Its outcome came before its release, which is then old news: still `queued`.
    submitted(store, quick)
    store.apply_event(outcome(quick, "parse", at=base - 20))
    store.apply_event(released(quick, at=base - 30))
    assert row(store, quick)["state"] == "queued"
    moment = time.time()
    # `fetching` has no outcome yet: its release is persistent, the reconciler's to watch.
    assert {t.id for t in store.pages_sent_before(moment, 10)} == {early.id, quick.id}
    assert {t.id for t in store.pages_sent_before(base + 7200, 10)} == {early.id, late.id, quick.id}
    for lost in store.pages_sent_before(moment, 10):
        assert lost.due_at is None
        now = time.time()
        assert store.begin_rescue(lost, lost_again(lost), now=now)
        assert not store.begin_rescue(lost, lost_again(lost), now=now)  # claimed once only
        store.finish_rescue(lost_again(lost), now)
    # Rescued since: a second sweep with the same moment finds them no more.
    assert store.pages_sent_before(moment, 10) == []
    assert [row(store, t)["incarnation"] for t in (early, quick)] == [1, 1]


def test_a_task_that_moved_after_it_was_read_is_not_claimed(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task, at=100.0))
    (lost,) = store.silent_tasks(200.0, 0.0, 10)
    store.apply_event(outcome(task, "retry", at=300.0, delay=1.0))
    assert not store.begin_rescue(lost, lost_again(lost), now=500.0)
    assert row(store, task)["incarnation"] == 0


def test_an_item_from_a_stale_copy_stores_the_task_once(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task))
    (lost,) = store.silent_tasks(1e12, 0.0, 10)
    store.begin_rescue(lost, lost_again(lost), now=500.0)
    store.finish_rescue(task.model_copy(update={"incarnation": 1}), 500.0)
    for copy in (task, task.model_copy(update={"incarnation": 1})):
        store.store_item(Item(task=copy, status=200, fields={"title": "T"}, parsed_at=1.0))
    assert row(store, task)["state"] == "stored"
    assert store.db.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 1


def test_counts_show_tasks_rescued_and_tasks_stalled(store: Store) -> None:
    a, b = make_task("http://example.com/a"), make_task("http://example.com/b")
    for task in (a, b):
        submitted(store, task)
        store.apply_event(released(task))
        (lost,) = [t for t in store.silent_tasks(1e12, 0.0, 10) if t.id == task.id]
        store.begin_rescue(lost, lost_again(lost), now=500.0)
    stalled = DeadLetter(stage="reconcile", reason="stalled", task=b.model_copy(update={"incarnation": 1}))
    store.record_dead(stalled, "s")
    (counts,) = store.counts(JOB)
    assert (counts.rescued, counts.stalled, counts.dead, counts.pending) == (2, 1, 1, 1)


def test_a_replayed_stalled_task_gets_its_rescues_back(store: Store) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task))
    (lost,) = store.silent_tasks(1e12, 0.0, 10)
    store.begin_rescue(lost, lost_again(lost), now=500.0)
    stalled = DeadLetter(stage="reconcile", reason="stalled", task=task.model_copy(update={"incarnation": 1}))
    store.record_dead(stalled, "s")
    (entry,) = store.dead_entries(job=JOB)
    store.mark_replayed([entry["id"]])
    assert (row(store, task)["state"], row(store, task)["rescues"]) == ("queued", 0)


def test_a_version_2_store_gains_the_reconciler_columns_and_keeps_its_tasks(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA[0] + ";" + _SCHEMA[1])
    db.execute("PRAGMA user_version = 2")
    db.execute(
        "INSERT INTO tasks (id, job, url, domain, state, created_at, updated_at) "
        "VALUES ('t1', 'j', 'http://a/', 'a', 'in_flight', 0, 0)"
    )
    db.commit()
    db.close()
    store = Store(str(path))
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 3
        (found,) = store.db.execute("SELECT state, incarnation, rescues, due_at, message FROM tasks").fetchall()
        assert tuple(found) == ("in_flight", 0, 0, None, None)
    finally:
        store.close()


# -- how the store is made ---------------------------------------------------------------------------


def test_the_store_is_durable_at_commit(store: Store) -> None:
    if store.backend == "sqlite":
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    else:
        assert store.db.execute("SHOW synchronous_commit").fetchone()[0] == "on"


def test_store_files_are_created_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    old = os.umask(0o022)
    try:
        s = Store(str(tmp_path / "data" / "deeper" / "hutch.sqlite3"))
        s.add_job("j", None)  # writes, so the WAL and shared-memory files exist
        try:
            files = sorted((tmp_path / "data" / "deeper").iterdir())
            assert [f.name for f in files] == ["hutch.sqlite3", "hutch.sqlite3-shm", "hutch.sqlite3-wal"]
            assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
            for folder in (tmp_path / "data", tmp_path / "data" / "deeper"):
                assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        finally:
            s.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # a folder that existed is left as it was


def test_an_existing_store_file_open_to_others_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "hutch.sqlite3"
    Store(str(path)).close()
    os.chmod(path, 0o644)
    Store(str(path)).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_the_tasks_of_a_paused_or_cancelled_job_are_never_taken_for_lost(store: Store, action: str) -> None:
    task = make_task()
    submitted(store, task)
    store.apply_event(released(task, at=100.0))
    assert [t.id for t in store.silent_tasks(200.0, 0.0, 10)] == [task.id]  # overdue while running
    store.apply_job_control(JobControl(job=JOB, action=action, at=150.0))  # type: ignore[arg-type]
    assert store.silent_tasks(200.0, 0.0, 10) == []
    if action == "pause":
        store.apply_job_control(JobControl(job=JOB, action="resume", at=160.0))
        assert [t.id for t in store.silent_tasks(200.0, 0.0, 10)] == [task.id]  # watched again once resumed
