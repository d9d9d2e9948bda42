"""Group commit on a real SQLite file: many writes per transaction, each answered after the
commit; a full or read-only store retried in place; a write's own error stays its own."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable

import pytest

from hutch.models import Item, Task, task_id
from hutch.services.storer.writer import GroupWriter
from hutch.store import AsyncStore, Store, StoreUnavailable, is_outage

JOB = "j"


def item(n: int, size: int = 10) -> Item:
    url = f"http://example.com/{n}"
    task = Task(id=task_id(JOB, url), job=JOB, url=url, domain="example.com")
    return Item(task=task, status=200, fields={"body": "x" * size}, parsed_at=1.0)


def stored(store: Store) -> int:
    return int(store.db.execute("SELECT COUNT(*) FROM items").fetchone()[0])


@pytest.fixture
async def store(store_location: str) -> AsyncIterator[AsyncStore]:
    s = await AsyncStore(store_location).open()
    yield s
    await s.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer_for(
    store: AsyncStore, clock: Clock, sleep: Callable[[float], object] | None = None, **kw: float
) -> GroupWriter:
    async def fake_sleep(seconds: float) -> None:
        clock.now += seconds
        if sleep is not None:
            result = sleep(seconds)
            if asyncio.iscoroutine(result):
                await result
        await asyncio.sleep(0)

    options: dict[str, float] = {"batch": 256, "wait": 0.005, "retry_seconds": 30.0, **kw}
    return GroupWriter(
        store.run, batch=int(options["batch"]), wait=options["wait"], retry_seconds=options["retry_seconds"],
        clock=clock, sleep=fake_sleep,
    ).start()  # fmt: skip


def write_item(i: Item) -> Callable[[Store], None]:
    return lambda s: s.store_item(i)


async def test_writes_arriving_together_commit_in_one_transaction_each_answered_after_it(store: AsyncStore) -> None:
    writer = writer_for(store, Clock())
    try:
        await asyncio.gather(*(writer.write(write_item(item(n))) for n in range(200)))
        assert writer.commits == 1
        assert await store.run(stored) == 200
    finally:
        await writer.close()


async def test_a_group_holds_at_most_batch_writes(store: AsyncStore) -> None:
    writer = writer_for(store, Clock(), batch=64)
    try:
        await asyncio.gather(*(writer.write(write_item(item(n))) for n in range(200)))
        assert writer.commits == 4
    finally:
        await writer.close()


async def test_a_write_that_fails_on_its_own_gets_its_error_and_the_others_commit(store: AsyncStore) -> None:
    writer = writer_for(store, Clock())

    def broken(s: Store) -> None:
        s.store_item(item(999))
        raise ValueError("this message is bad")

    try:
        results = await asyncio.gather(
            writer.write(write_item(item(1))), writer.write(broken), writer.write(write_item(item(2))),
            return_exceptions=True,
        )  # fmt: skip
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], ValueError)
        assert writer.commits == 1
        # The broken write was undone alone, with what it had written before failing.
        assert await store.run(stored) == 2
    finally:
        await writer.close()


def break_store(store: Store, outage: str) -> Callable[[], None]:
    """Make the store fail every write the way `outage` says; return what heals it.

    `full`: SQLite at its page limit; on PostgreSQL, whose disk a test cannot fill, a lock
    held elsewhere that the store's writes wait for in vain (as SQLite's busy file).
    `read_only`: SQLite's query_only; PostgreSQL's read-only transactions (a standby's).
    """
    if store.backend == "sqlite":
        if outage == "full":
            pages = store.db.execute("PRAGMA page_count").fetchone()[0]
            store.db.execute(f"PRAGMA max_page_count = {pages}")
            return lambda: store.db.execute("PRAGMA max_page_count = 1073741823")
        store.db.execute("PRAGMA query_only = 1")
        return lambda: store.db.execute("PRAGMA query_only = 0")
    if outage == "full":
        import psycopg

        locker = psycopg.connect(store.db.url)
        locker.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        store.db.execute("SET lock_timeout = '50ms'")
        return locker.close  # closing it rolls its transaction back
    store.db.execute("SET default_transaction_read_only = on")
    return lambda: store.db.execute("SET default_transaction_read_only = off")


@pytest.mark.parametrize("outage", ["full", "read_only"])
async def test_a_full_or_read_only_store_is_retried_in_place_until_it_heals_and_nothing_is_lost(
    store: AsyncStore, outage: str
) -> None:
    await store.run(lambda s: s.store_item(item(0)))
    heal = await store.run(lambda s: break_store(s, outage))
    pauses: list[float] = []

    async def heal_after_five(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 5:
            await store.run(lambda s: heal())

    writer = writer_for(store, Clock(), sleep=heal_after_five)
    try:
        await asyncio.gather(*(writer.write(write_item(item(n, size=20_000))) for n in range(1, 51)))
        assert writer.outages == 5
        assert pauses == sorted(pauses) and pauses[0] < pauses[-1]  # backing off
        assert await store.run(stored) == 51
    finally:
        await writer.close()


async def test_writes_failing_longer_than_the_retry_time_get_store_unavailable(store: AsyncStore) -> None:
    heal = await store.run(lambda s: break_store(s, "read_only"))
    clock = Clock()
    writer = writer_for(store, clock, retry_seconds=5.0)
    try:
        results = await asyncio.gather(*(writer.write(write_item(item(n))) for n in range(3)), return_exceptions=True)
        assert all(isinstance(r, StoreUnavailable) for r in results)
        assert 5.0 <= clock.now < 10.0
        # The writer still serves writes once the store heals.
        await store.run(lambda s: heal())
        await writer.write(write_item(item(7)))
        assert await store.run(stored) == 1
    finally:
        await writer.close()


def test_store_errors_are_outages_and_a_messages_own_errors_are_not() -> None:
    assert is_outage(sqlite3.OperationalError("database or disk is full"))
    assert is_outage(sqlite3.OperationalError("database is locked"))
    assert is_outage(sqlite3.DatabaseError("file is not a database"))
    assert is_outage(OSError(28, "No space left on device"))
    assert not is_outage(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_outage(ValueError("bad"))


def test_postgresql_errors_are_outages_only_where_no_message_causes_them() -> None:
    import psycopg
    from psycopg import errors

    assert is_outage(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert is_outage(errors.AdminShutdown("terminating connection due to administrator command"))
    assert is_outage(errors.DiskFull("could not extend file"))
    assert is_outage(errors.LockNotAvailable("canceling statement due to lock timeout"))
    assert is_outage(errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"))
    assert is_outage(psycopg.InterfaceError("the connection is closed"))
    assert not is_outage(errors.UniqueViolation("duplicate key value"))
    assert not is_outage(errors.StringDataRightTruncation("value too long"))
