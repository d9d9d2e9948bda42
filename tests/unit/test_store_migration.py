"""A store written by an older Hutch is upgraded in place, keeping what it holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hutch.store import _SCHEMA, SCHEMA_VERSION, Store


def test_a_version_1_store_is_migrated_to_the_current_schema_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA[0])
    db.execute("PRAGMA user_version = 1")
    db.execute(
        "INSERT INTO tasks (id, job, url, domain, state, created_at, updated_at) "
        "VALUES ('t1', 'j', 'http://a/', 'a', 'dead', 0, 0)"
    )
    db.execute(
        "INSERT INTO dead (message_id, task_id, job, url, domain, stage, reason, letter, dead_at) "
        "VALUES ('m1', 't1', 'j', 'http://a/', 'a', 'fetch', 'timeout', '{}', 0)"
    )
    db.commit()
    db.close()
    store = Store(f"sqlite:///{path}")
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [e["reason"] for e in store.dead_entries(job="j")] == ["timeout"]
        columns = {row[1] for row in store.db.execute("PRAGMA table_info(attempts)")}
        assert {"tier", "cost"} <= columns
    finally:
        store.close()


def test_processes_opening_a_new_store_at_once_migrate_it_once(store_location: str) -> None:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        versions = pool.map(_open_and_read_version, [store_location] * 8)
    assert versions == [[SCHEMA_VERSION]] * 8


def _open_and_read_version(location: str) -> list[int]:
    store = Store(location)
    try:
        if store.backend == "sqlite":
            return [int(store.db.execute("PRAGMA user_version").fetchone()[0])]
        return [int(row[0]) for row in store.db.execute("SELECT version FROM hutch_schema")]
    finally:
        store.close()
