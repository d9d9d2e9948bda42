"""`hutch store copy --to postgresql://...`: an SQLite store moved whole, and what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hutch.models import DeadLetter, Event, Item, Task, task_id
from hutch.settings import Settings
from hutch.store import Store


def _task(url: str, job: str = "moved") -> Task:
    return Task(id=task_id(job, url), job=job, url=url, domain="example.com", submitted_at=1.0)


def fill(store: Store) -> None:
    """A job with a stored task (two attempts), a dead one, one still queued, and a control."""
    tasks = [_task(f"http://example.com/{i}") for i in range(3)]
    store.add_job("moved", {"fields": {"title": {"kind": "css", "expr": "title"}}})
    store.add_tasks([(t.id, t.job, t.url, t.domain) for t in tasks])
    store.mark_queued([t.id for t in tasks])
    for n, at in ((1, 10.0), (2, 20.0)):
        store.apply_event(
            Event(
                kind="outcome",
                task_id=tasks[0].id,
                job="moved",
                domain="example.com",
                attempt=n,
                at=at,
                outcome="timeout" if n == 1 else "ok",
                next="retry" if n == 1 else "parse",
                delay=1.0 if n == 1 else None,
                trace_id="ab" * 16,
            )
        )
    store.store_item(Item(task=tasks[0], status=200, fields={"title": "Zürich ☃"}, parsed_at=30.0))
    for k in range(3):  # ids 1..3 in the ledger; the copy keeps them
        store.record_dead(
            DeadLetter(stage="fetch", reason="not_found", detail=f"HTTP 404 ({k})", at=40.0 + k, task=tasks[1]),
            f"m{k}",
        )


def snapshot(store: Store) -> dict[str, object]:
    return {
        "counts": store.counts("moved"),
        "job": store.job_state("moved"),
        "tasks": store.tasks("moved"),
        "items": list(store.items("moved")),
        "dead": [{k: v for k, v in d.items()} for d in store.dead_letters("moved")],
        "attempts": store.attempts(task_id("moved", "http://example.com/0")),
    }


def copy(settings: Settings, to: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**settings.to_env(os.environ)}
    return subprocess.run(
        [str(Path(sys.executable).with_name("hutch")), "store", "copy", "--to", to, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_sqlite_store_is_copied_whole_to_postgresql_and_a_second_copy_is_refused(
    settings: Settings, postgres_url: str, tmp_path: Path
) -> None:
    source = Store(settings.store_location)
    try:
        fill(source)
        before = snapshot(source)
    finally:
        source.close()

    done = copy(settings, postgres_url)
    assert done.returncode == 0, done.stderr
    assert "3 tasks" in done.stderr and "2 attempts" in done.stderr and "3 dead" in done.stderr
    assert "postgresql://postgres@127.0.0.1" in done.stderr

    target = Store(postgres_url)
    try:
        assert target.backend == "postgresql"
        assert snapshot(target) == before
        # The ledger goes on after the ids it brought.
        target.record_dead(
            DeadLetter(stage="fetch", reason="not_found", detail="later", at=50.0, task=_task("http://example.com/2")),
            "m-later",
        )
        assert [d["id"] for d in target.dead_letters("moved")] == [1, 2, 3, 4]
    finally:
        target.close()

    again = copy(settings, postgres_url)
    assert again.returncode == 2
    assert "already holds" in again.stderr


def test_a_copy_into_the_store_itself_is_refused(settings: Settings) -> None:
    Store(settings.store_location).close()
    done = copy(settings, settings.store_location)
    assert done.returncode == 2 and "the store itself" in done.stderr
