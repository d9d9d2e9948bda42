"""`hutch store copy --to URL`: move a store to another backend (SQLite to PostgreSQL).

Run while the services are stopped: the copy reads the source as it is and nothing must
write to it meanwhile. It refuses a storer still consuming on the broker (when the broker
can be asked) and a target that already holds jobs or tasks, so a copy never mixes two
stores. The target is migrated to the current schema first; then every table is copied in
one transaction on the target, in batches, with progress on stderr: a copy that fails
leaves the target as it was. The row counts of source and target are compared at the end.
Dead-letter ids are kept (the CLI and the API name entries by them).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from hutch.settings import Settings, redact_url
from hutch.store import Store

# Parents before children is not needed (no foreign keys), but jobs first reads naturally.
TABLES = ("jobs", "tasks", "items", "attempts", "dead", "page_links", "crawls", "bodies", "pages")
BATCH = 2000


class CopyRefused(Exception):
    """The copy cannot start: the message says why."""


def _columns(store: Store, table: str) -> list[str]:
    cursor = store.db.execute(f"SELECT * FROM {table} LIMIT 0")
    return [column[0] for column in cursor.description]


def _count(store: Store, table: str) -> int:
    return int(store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _copy_table(source: Store, target: Store, table: str, progress: Callable[[str], None]) -> int:
    wanted = [c for c in _columns(source, table) if c in set(_columns(target, table))]
    insert = f"INSERT INTO {table} ({', '.join(wanted)}) VALUES ({', '.join('?' * len(wanted))})"
    total = _count(source, table)
    done = 0
    cursor = source.db.execute(f"SELECT {', '.join(wanted)} FROM {table}")
    while batch := cursor.fetchmany(BATCH):
        target.db.executemany(insert, [tuple(row) for row in batch])
        done += len(batch)
        progress(f"{table}: {done}/{total}")
    return done


def copy_store(source: Store, target: Store, progress: Callable[[str], None]) -> dict[str, int]:
    """Copy every row of `source` into `target` (empty, same schema); rows copied per table."""
    for table in ("jobs", "tasks"):
        if _count(target, table):
            raise CopyRefused(f"the target {target.location} already holds {table}: copy into an empty store")
    copied: dict[str, int] = {}
    # One snapshot of the source (a read transaction), one transaction on the target; the
    # counts are compared inside it, so a copy that does not add up commits nothing.
    source.db.execute("BEGIN" if source.backend == "sqlite" else "BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        with target._tx():
            for table in TABLES:
                copied[table] = _copy_table(source, target, table, progress)
            if target.backend == "postgresql":
                # The ledger's ids came along; the next one must follow the highest.
                target.db.execute(
                    "SELECT setval(pg_get_serial_sequence('dead', 'id'), GREATEST((SELECT MAX(id) FROM dead), 1))"
                )
            for table in TABLES:
                if _count(target, table) != copied[table] or _count(source, table) != copied[table]:
                    raise RuntimeError(f"{table}: {copied[table]} rows copied but the counts differ; nothing written")
    finally:
        source.db.execute("ROLLBACK")
    return copied


async def _storer_consumers(settings: Settings) -> int | None:
    """How many consumers the storer's queues have; None when the broker cannot be asked."""
    from hutch.amqp import Broker, queue_depth

    broker = Broker(settings, "store-copy")
    try:
        await broker.connect(declare=False, timeout=5.0)
    except Exception:
        return None
    try:
        channel = await broker.raw_channel()
        found = await queue_depth(channel, broker.topology.store)
        return None if found is None else found[1]
    finally:
        await broker.close()


def run(settings: Settings, to: str, force: bool = False) -> dict[str, int]:
    if to == settings.store_location:
        raise CopyRefused("the target is the store itself")
    if not force:
        consumers = asyncio.run(_storer_consumers(settings))
        if consumers:
            raise CopyRefused(
                f"a storer is running ({consumers} consuming on the broker): stop the services first "
                "(--force skips this check)"
            )
    source = Store(settings.store_location)
    try:
        target = Store(to)
        try:
            start = time.monotonic()
            last = [0.0]

            def progress(line: str) -> None:
                now = time.monotonic()
                if now - last[0] >= 1.0:
                    last[0] = now
                    print(f"copying {line}", file=sys.stderr)

            copied = copy_store(source, target, progress)
        finally:
            target.close()
    finally:
        source.close()
    rows = ", ".join(f"{n} {table}" for table, n in copied.items())
    print(
        f"copied {redact_url(settings.store_location)} to {redact_url(to)} in {time.monotonic() - start:.1f}s: {rows}",
        file=sys.stderr,
    )
    return copied
