"""The SQLite store on a temporary file: task states, idempotent writes, counts and the schema guard."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.models import DeadLetter, Event, Item, Task, task_id
from hutch.store import SCHEMA_VERSION, JobCounts, Store, StoreError, sqlite_path

JOB = "books"


def make_task(url: str, job: str = JOB, attempts: int = 0) -> Task:
    return Task(
        id=task_id(job, url), job=job, url=url, domain="example.com", attempts=attempts, submitted_at=1.0
    )


def row(task: Task) -> tuple[str, str, str, str]:
    return (task.id, task.job, task.url, task.domain)


def released(task: Task, attempt: int = 0, at: float = 10.0) -> Event:
    return Event(kind="released", task_id=task.id, job=task.job, domain=task.domain, attempt=attempt, at=at)


def outcome(task: Task, next_step: str, attempt: int = 1, at: float = 20.0, name: str = "timeout") -> Event:
    return Event(
        kind="outcome",
        task_id=task.id,
        job=task.job,
        domain=task.domain,
        attempt=attempt,
        at=at,
        outcome=name,
        next=next_step,  # type: ignore[arg-type]
        delay=5.0 if next_step == "retry" else None,
    )


def item(task: Task, **fields: object) -> Item:
    return Item(task=task, status=200, fields=fields or {"title": "T"}, parsed_at=30.0)


def letter(task: Task | None, reason: str = "not_found", detail: str = "HTTP 404") -> DeadLetter:
    return DeadLetter(stage="fetch", reason=reason, detail=detail, at=40.0, task=task)


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    s = Store(store_location)
    yield s
    s.close()


@pytest.fixture
def a() -> Task:
    return make_task("http://example.com/a")


@pytest.fixture
def b() -> Task:
    return make_task("http://example.com/b")


# -- opening -------------------------------------------------------------------------------------


def test_a_new_store_creates_its_folder_and_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "hutch.sqlite3"
    s = Store(str(path))
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"jobs", "tasks", "items", "attempts", "dead"} <= tables


def test_reopening_a_store_keeps_its_data(tmp_path: Path, a: Task) -> None:
    location = str(tmp_path / "hutch.sqlite3")
    first = Store(location)
    first.add_tasks([row(a)])
    first.close()
    second = Store(location)
    try:
        assert second.task_state(a.id) == "new"
    finally:
        second.close()


def test_a_store_of_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade Hutch"):
        Store(str(path))


def test_a_refused_newer_store_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.execute("CREATE TABLE future_only (x)")
    with pytest.raises(StoreError):
        Store(str(path))
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"future_only"}


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("sqlite:///data/h.sqlite3", Path("data/h.sqlite3")),
        ("sqlite:////abs/h.sqlite3", Path("/abs/h.sqlite3")),
        ("plain/path.db", Path("plain/path.db")),
    ],
)
def test_sqlite_path_reads_sqlite_urls_and_plain_paths(location: str, expected: Path) -> None:
    assert sqlite_path(location) == expected


def test_a_store_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(StoreError, match="unsupported store URL scheme in postgresql://"):
        sqlite_path("postgresql://user:secret@db/hutch")


def test_the_refusal_of_another_scheme_does_not_repeat_credentials() -> None:
    with pytest.raises(StoreError) as info:
        sqlite_path("postgresql://user:secret@db/hutch")
    assert "secret" not in str(info.value)


# -- adding tasks --------------------------------------------------------------------------------


def test_add_tasks_records_new_tasks_and_returns_their_ids_in_order(store: Store, a: Task, b: Task) -> None:
    assert store.add_tasks([row(b), row(a)]) == [b.id, a.id]
    assert store.task_state(a.id) == store.task_state(b.id) == "new"


def test_add_tasks_with_nothing_returns_nothing(store: Store) -> None:
    assert store.add_tasks([]) == []


def test_a_resubmit_returns_only_tasks_still_new_and_ignores_duplicates(
    store: Store, a: Task, b: Task
) -> None:
    store.add_tasks([row(a), row(b)])
    store.mark_queued([a.id])
    c = make_task("http://example.com/c")
    assert store.add_tasks([row(a), row(b), row(c)]) == [b.id, c.id]
    assert len(store.tasks(JOB)) == 3


def test_a_resubmit_never_returns_tasks_already_queued_or_done(store: Store, a: Task, b: Task) -> None:
    store.add_tasks([row(a), row(b)])
    store.mark_queued([a.id, b.id])
    store.store_item(item(a))
    assert store.add_tasks([row(a), row(b)]) == []
    assert store.task_state(a.id) == "stored"
    assert store.task_state(b.id) == "queued"


def test_a_duplicate_row_keeps_the_first_url_and_domain(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.add_tasks([(a.id, JOB, "http://elsewhere.example/", "elsewhere.example")])
    [only] = store.tasks(JOB)
    assert (only["url"], only["domain"]) == (a.url, a.domain)


def test_mark_queued_moves_new_tasks_to_queued(store: Store, a: Task, b: Task) -> None:
    store.add_tasks([row(a), row(b)])
    store.mark_queued([a.id])
    assert store.task_state(a.id) == "queued"
    assert store.task_state(b.id) == "new"


def test_mark_queued_does_not_move_a_task_back_from_flight(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    store.mark_queued([a.id])
    assert store.task_state(a.id) == "in_flight"


def test_mark_queued_handles_more_ids_than_one_sql_chunk(store: Store) -> None:
    tasks = [make_task(f"http://example.com/{i}") for i in range(1203)]
    store.add_tasks(row(t) for t in tasks[:600])
    store.add_tasks(row(t) for t in tasks[600:])
    store.mark_queued(t.id for t in tasks)
    assert {r["state"] for r in store.tasks(JOB)} == {"queued"}


def test_an_unknown_task_has_no_state(store: Store) -> None:
    assert store.task_state("nope") is None


# -- events --------------------------------------------------------------------------------------


def test_a_released_event_puts_a_queued_task_in_flight(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.mark_queued([a.id])
    store.apply_event(released(a))
    assert store.task_state(a.id) == "in_flight"


def test_a_batch_of_released_events_puts_each_of_its_tasks_in_flight(store: Store, a: Task, b: Task) -> None:
    store.add_tasks([row(a), row(b)])
    store.mark_queued([a.id, b.id])
    store.apply_events([released(a), released(b)])
    assert (store.task_state(a.id), store.task_state(b.id)) == ("in_flight", "in_flight")


def test_an_outcome_event_sending_the_task_to_retry_makes_it_retrying(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.mark_queued([a.id])
    store.apply_event(released(a))
    store.apply_event(outcome(a, "retry", name="throttled"))
    assert store.task_state(a.id) == "retrying"
    [task] = store.tasks(JOB)
    assert task["last_outcome"] == "throttled"
    assert task["attempts"] == 1


def test_a_task_returned_to_the_frontier_is_retrying(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    store.apply_event(outcome(a, "frontier", attempt=0, name="permit_expired"))
    assert store.task_state(a.id) == "retrying"


def test_a_retrying_task_goes_back_in_flight_when_released_again(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    store.apply_event(outcome(a, "retry"))
    store.apply_event(released(a, attempt=1, at=30.0))
    assert store.task_state(a.id) == "in_flight"


def test_an_outcome_to_parse_leaves_the_task_in_flight_until_it_is_stored(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    store.apply_event(outcome(a, "parse", name="ok"))
    assert store.task_state(a.id) == "in_flight"


def test_a_late_released_event_never_moves_a_stored_task_back(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.store_item(item(a))
    store.apply_event(released(a))
    assert store.task_state(a.id) == "stored"


def test_a_late_retry_outcome_never_moves_a_stored_task_back(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.store_item(item(a))
    store.apply_event(outcome(a, "retry"))
    assert store.task_state(a.id) == "stored"


def test_a_late_released_event_never_moves_a_dead_task_back(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a), "m-1")
    store.apply_event(released(a))
    store.apply_event(outcome(a, "retry"))
    assert store.task_state(a.id) == "dead"


def test_outcome_events_are_kept_as_attempt_history_once_each(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    first = outcome(a, "retry", attempt=1, at=20.0)
    store.apply_event(first)
    store.apply_event(first)  # redelivered
    store.apply_event(outcome(a, "parse", attempt=2, at=50.0, name="ok"))
    history = store.attempts(a.id)
    assert [(h["n"], h["outcome"], h["next"]) for h in history] == [
        (1, "timeout", "retry"),
        (2, "ok", "parse"),
    ]
    assert history[0]["delay"] == 5.0


def test_released_events_add_no_attempt_history(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    assert store.attempts(a.id) == []


def test_the_attempt_count_never_goes_down_when_events_arrive_out_of_order(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(outcome(a, "retry", attempt=3, at=30.0))
    store.apply_event(outcome(a, "retry", attempt=2, at=20.0))
    assert store.tasks(JOB)[0]["attempts"] == 3


# -- items ---------------------------------------------------------------------------------------


def test_storing_an_item_marks_the_task_stored(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.apply_event(released(a))
    store.store_item(item(a.model_copy(update={"attempts": 2})))
    assert store.task_state(a.id) == "stored"
    [task] = store.tasks(JOB)
    assert task["attempts"] == 2
    assert task["last_outcome"] == "ok"


def test_storing_the_same_item_twice_keeps_one_row(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.store_item(item(a, title="first"))
    store.store_item(item(a, title="second"))
    assert list(store.items(JOB)) == [{"url": a.url, "title": "second"}]
    assert len(store.tasks(JOB)) == 1


def test_an_item_for_a_task_this_store_never_saw_is_recorded_as_stored(store: Store) -> None:
    stranger = make_task("http://example.com/elsewhere", job="other", attempts=3)
    store.store_item(item(stranger))
    assert store.task_state(stranger.id) == "stored"
    assert store.tasks("other")[0]["attempts"] == 3


def test_an_item_arriving_after_a_dead_letter_wins(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a), "m-1")
    store.store_item(item(a))
    assert store.task_state(a.id) == "stored"


def test_items_export_url_and_fields_per_job_ordered_by_url(store: Store, a: Task, b: Task) -> None:
    other = make_task("http://example.com/z", job="other")
    store.store_item(item(b, title="B", links=["x", "y"]))
    store.store_item(item(a, title="A", price=None))
    store.store_item(item(other, title="O"))
    assert list(store.items(JOB)) == [
        {"url": a.url, "title": "A", "price": None},
        {"url": b.url, "title": "B", "links": ["x", "y"]},
    ]


def test_a_job_without_items_exports_nothing(store: Store) -> None:
    assert list(store.items("nothing")) == []


# -- dead letters --------------------------------------------------------------------------------


def test_a_dead_letter_marks_the_task_dead_and_is_kept(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a.model_copy(update={"attempts": 4}), reason="timeout", detail="gave up"), "m-1")
    assert store.task_state(a.id) == "dead"
    [dead] = store.dead_letters(JOB)
    assert (dead["task_id"], dead["reason"], dead["detail"], dead["attempts"]) == (
        a.id,
        "timeout",
        "gave up",
        4,
    )
    assert DeadLetter.model_validate_json(dead["letter"]).task == a.model_copy(update={"attempts": 4})


def test_recording_the_same_dead_letter_twice_keeps_one_row(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a), "m-1")
    store.record_dead(letter(a), "m-1")
    assert len(store.dead_letters()) == 1


def test_two_dead_letters_with_different_message_ids_are_both_kept(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a, reason="decode"), "m-1")
    store.record_dead(letter(a, reason="error"), "m-2")
    assert [d["reason"] for d in store.dead_letters(JOB)] == ["decode", "error"]


def test_a_dead_letter_without_a_task_is_kept_without_a_job(store: Store) -> None:
    raw = DeadLetter(stage="parse", reason="decode", at=1.0, raw="{broken")
    store.record_dead(raw, "m-9")
    [dead] = store.dead_letters()
    assert dead["task_id"] is None
    assert dead["job"] is None
    assert store.dead_letters(JOB) == []


def test_a_dead_letter_never_kills_a_stored_task(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.store_item(item(a))
    store.record_dead(letter(a), "m-1")
    assert store.task_state(a.id) == "stored"


# -- counts --------------------------------------------------------------------------------------


def test_counts_report_each_job_by_state(store: Store) -> None:
    tasks = [make_task(f"http://example.com/{i}") for i in range(5)]
    other = make_task("http://example.com/x", job="other")
    store.add_tasks([*map(row, tasks), row(other)])
    store.mark_queued([t.id for t in tasks])
    store.apply_event(released(tasks[0]))
    store.apply_event(released(tasks[1]))
    store.store_item(item(tasks[1]))
    store.record_dead(letter(tasks[2]), "m-1")
    store.apply_event(released(tasks[3]))
    store.apply_event(outcome(tasks[3], "retry"))
    assert store.counts() == [
        JobCounts(JOB, total=5, stored=1, dead=1, in_flight=1, pending=3),
        JobCounts("other", total=1, stored=0, dead=0, in_flight=0, pending=1),
    ]
    assert store.counts(JOB) == [JobCounts(JOB, 5, 1, 1, 1, 3)]


def test_a_job_is_done_when_nothing_is_pending(store: Store, a: Task, b: Task) -> None:
    store.add_tasks([row(a), row(b)])
    store.store_item(item(a))
    assert store.counts(JOB)[0].done is False
    store.record_dead(letter(b), "m-1")
    assert store.counts(JOB)[0].done is True


def test_a_known_job_without_tasks_counts_zero(store: Store) -> None:
    store.add_job("empty", None)
    assert store.counts("empty") == [JobCounts("empty", 0, 0, 0, 0, 0)]


def test_an_unknown_job_has_no_counts(store: Store) -> None:
    assert store.counts("never-submitted") == []


def test_add_job_twice_updates_its_spec(store: Store) -> None:
    store.add_job(JOB, {"fields": {"t": {"kind": "css", "expr": "title"}}})
    store.add_job(JOB, None)
    assert store.job_exists(JOB)
    assert not store.job_exists("other")
    assert [r[0] for r in store.db.execute("SELECT spec FROM jobs")] == [None]


def test_unpublished_lists_only_tasks_still_new(store: Store, a: Task, b: Task) -> None:
    store.add_tasks([row(a), row(b)])
    store.mark_queued([a.id])
    assert [r["id"] for r in store.unpublished(JOB)] == [b.id]


def test_a_dead_letter_whose_detail_holds_a_nul_is_recorded_on_either_backend(store: Store, a: Task) -> None:
    store.add_tasks([row(a)])
    store.record_dead(letter(a, detail="body: \x00\x01 end"), "m-nul")
    [entry] = store.dead_entries()
    assert entry["detail"] in ("body: \x00\x01 end", "body: \ufffd\x01 end")
    assert store.task_state(a.id) == "dead"
