"""Benchmark: what durable commits cost the storer, and what group commit gives back.

An item is acked only after the transaction holding it has committed. With SQLite's
`synchronous=NORMAL` in WAL mode a commit does not wait for the disk (a power cut may lose
the last ones: an acked item lost); with `FULL` it does, so one commit per message runs at
the disk's flush rate. The storer therefore commits the messages that arrive together in one
transaction (HUTCH_STORE_BATCH, HUTCH_STORE_BATCH_WAIT) and acks them after it.

This runs the real storer (in this process) on the local RabbitMQ, each run in a namespace of
its own: it publishes N items to the `store` queue first, starts the storer, and times until
the store holds all N. Three set-ups, each run `--runs` times in turn, medians side by side:

- NORMAL, one message per transaction (store_batch = 1; the storer before this change)
- FULL, one message per transaction
- FULL, grouped (store_batch = 256, the default)

and the same two on PostgreSQL (`--postgres URL`, default the machine's server at
127.0.0.1:5432, database `test`; each run in a schema of its own, dropped after; `--postgres ''`
leaves them out): one message per transaction, and grouped (the default), with
`synchronous_commit = on` as the store sets it.

    .venv/bin/python bench/store_commit.py                # 2,000 items, 3 runs each
    .venv/bin/python bench/store_commit.py --items 5000 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from hutch.admin import delete_namespace
from hutch.amqp import Broker
from hutch.models import Item, Task, task_id
from hutch.services.storer.app import Storer
from hutch.settings import Settings
from hutch.store import sqlite_path

SETUPS = (("NORMAL", 1), ("FULL", 1), ("FULL", 256))
PG_SETUPS = (("postgresql", 1), ("postgresql", 256))


def item(n: int) -> Item:
    url = f"http://bench.test/item/{n}"
    task = Task(id=task_id("bench", url), job="bench", url=url, domain="bench.test")
    return Item(task=task, status=200, fields={"title": f"Item {n}", "price": n * 0.01}, parsed_at=time.time())


def count(reader: Any) -> int:
    return int(reader.execute("SELECT COUNT(*) FROM items").fetchone()[0])


def pg_schema(base: str) -> tuple[str, str]:
    """A fresh schema in `base`'s database: (its name, a store URL on it)."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema, f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"


async def one_run(synchronous: str, batch: int, items: int, data_dir: Path, postgres: str = "") -> float:
    schema = None
    store_url = None
    if synchronous == "postgresql":
        schema, store_url = pg_schema(postgres)
    settings = Settings(
        namespace=f"bench-store-{uuid.uuid4().hex[:6]}",
        data_dir=data_dir,
        store_url=store_url,
        store_batch=batch,
        reconcile_interval=3600.0,  # no sweep during the run
    )
    broker = await Broker(settings, "bench-publisher").connect()
    storer = Storer(settings)
    try:
        for start in range(0, items, 500):
            await asyncio.gather(
                *(broker.publish(broker.topology.work, "store", item(n)) for n in range(start, min(start + 500, items)))
            )
        await storer.connect(wait=False)
        started = time.perf_counter()
        await storer.start()
        reader: Any
        if store_url is not None:
            import psycopg

            reader = psycopg.connect(store_url, autocommit=True)
        else:
            await storer.store.run(lambda s: s.db.execute(f"PRAGMA synchronous={synchronous}"))
            # A read-only connection to watch: opening a Store would take the write lock to
            # check the schema, each time.
            reader = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
        deadline = started + 120
        try:
            while count(reader) < items:
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{synchronous}/{batch}: not all items stored after 120 s")
                await asyncio.sleep(0.02)
        finally:
            reader.close()
        elapsed = time.perf_counter() - started
    finally:
        await storer.shutdown()
        await broker.close()
        await delete_namespace(settings)
        if schema is not None:
            import psycopg

            with psycopg.connect(postgres, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return items / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test", help="'' to leave out")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    setups = SETUPS + (PG_SETUPS if args.postgres else ())
    rates: dict[tuple[str, int], list[float]] = {setup: [] for setup in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for synchronous, batch in setups:  # interleaved, so a busy moment hurts all alike
                data_dir = Path(tmp) / f"{synchronous}-{batch}-{run}"
                rate = await one_run(synchronous, batch, args.items, data_dir, args.postgres)
                rates[(synchronous, batch)].append(rate)
    print(f"{args.items} items through the storer, median of {args.runs} runs (items/s):")
    for (synchronous, batch), found in rates.items():
        how = "one message per transaction" if batch == 1 else f"grouped (up to {batch})"
        label = f"PostgreSQL, {how}" if synchronous == "postgresql" else f"SQLite synchronous={synchronous}, {how}"
        runs = ", ".join(f"{r:,.0f}" for r in found)
        print(f"  {label:<52} {statistics.median(found):>8,.0f}   (runs: {runs})")


if __name__ == "__main__":
    asyncio.run(main())
