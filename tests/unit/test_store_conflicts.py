"""A write that PostgreSQL rolls back to break a deadlock is run again (`run_again_on_conflict`),
as `hutch run`'s submit needs beside a storer that updates the same task rows meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from hutch.store import AsyncStore, Store, is_conflict

JOB = "j"


def seed(location: str) -> None:
    store = Store(location)
    try:
        store.add_tasks([("t1", JOB, "http://a.test/1", "a.test"), ("t2", JOB, "http://a.test/2", "a.test")])
    finally:
        store.close()


async def test_a_write_chosen_to_break_a_deadlock_is_run_again_and_lands(postgres_url: str) -> None:
    """The write locks t1 then t2; another transaction holds t2 and then asks for t1. The write
    waited first, so PostgreSQL rolls it back; run again, it goes through after the other."""
    seed(postgres_url)
    holds_t1, holds_t2, runs = threading.Event(), threading.Event(), []

    def write(store: Store) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            assert holds_t2.wait(10)
        with store._tx():
            store.db.execute("UPDATE tasks SET updated_at = 1 WHERE id = 't1'")
            if len(runs) == 1:
                holds_t1.set()
            store.db.execute("UPDATE tasks SET updated_at = 1 WHERE id = 't2'")

    def other() -> None:
        with psycopg.connect(postgres_url) as conn:
            conn.execute("UPDATE tasks SET updated_at = 2 WHERE id = 't2'")
            holds_t2.set()
            assert holds_t1.wait(10)
            time.sleep(0.3)  # the write is waiting for t2 by now
            conn.execute("UPDATE tasks SET updated_at = 2 WHERE id = 't1'")
            conn.commit()

    store = await AsyncStore(postgres_url).open()
    try:
        rival = asyncio.create_task(asyncio.to_thread(other))
        await store.run_again_on_conflict(write)
        await rival
        stamps = await store.run(lambda s: s.db.execute("SELECT updated_at FROM tasks ORDER BY id").fetchall())
    finally:
        await store.close()
    assert len(runs) == 2  # rolled back once, then run again
    assert [row[0] for row in stamps] == [1, 1]  # the write's, after the other's


async def test_only_a_conflict_is_run_again(postgres_url: str) -> None:
    seed(postgres_url)
    runs = []

    def broken(store: Store) -> None:
        runs.append(1)
        store.db.execute("UPDATE no_such_table SET x = 1")

    store = await AsyncStore(postgres_url).open()
    try:
        with pytest.raises(psycopg.Error) as raised:
            await store.run_again_on_conflict(broken)
    finally:
        await store.close()
    assert not is_conflict(raised.value) and runs == [1]
