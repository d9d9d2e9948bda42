"""Frontier models side by side: what each costs the broker (or PostgreSQL) as domains grow.

    .venv/bin/python bench/frontier_models.py                 # default sizes, ~15 min on 2 cores
    .venv/bin/python bench/frontier_models.py --only shards --shard-domains 0 --quorum-domains 100000
    .venv/bin/python bench/frontier_models.py --only shards,pg --shard-domains 1000,10000
    .venv/bin/python bench/frontier_models.py --help

Prototypes for the frontier design note (docs/frontier-alternatives.md), not product code.
Each model is measured on a RabbitMQ node of the benchmark's own (tests/brokers.py
`BrokerNode`, started with the process's hard descriptor limit and stopped at the end), never
on the machine's shared broker; `--url` with `--nodename` points it at another node instead.

1. per-domain: N classic version 2 durable queues (as `frontier.d.<domain>` today), 5
   persistent ~1 KB messages each. Node memory (`erlang:memory(total)` after a garbage
   collection), the VM's open descriptors (/proc/<pid>/fd) and the time to declare and fill.
   Declaring stops early when the node holds 80 % of its descriptor limit, when the phase's
   time budget is spent, or when the rate falls below a crawl (a node out of descriptors
   stops answering instead of failing). A node that stalled is killed and started again
   with no data: it does not delete its queues either.
2. shards: 16 hashed classic queues holding N x 5 messages; memory, descriptors, publish
   time; then the consume rate of a window consumer (prefetch 256 per queue) that only acks
   ("release") against one that republishes each message to a TTL queue with a confirm and
   then acks ("park"), 3 runs each, interleaved. `--quorum-domains` repeats it on quorum
   queues. The park queue has a long TTL and no dead-letter target, so nothing returns
   during a run.
3. pg: a PostgreSQL frontier (a schema of its own in `--pg-dsn`, dropped at the end):
   domains with a next-fetch time and a rate, tasks per (domain, job); one statement claims
   the first task of the most overdue domain (`FOR UPDATE SKIP LOCKED`) and moves the
   domain's next fetch on by 1/rate (rate 1,000/s so the limit does not bind). Claims/s with
   1 and 4 claimer threads, 3 runs each; table and index sizes.
4. stream: one stream holding `--stream-messages` ~1 KB messages: append rate, memory,
   descriptors, bytes on disk, and the read rate of one consumer from the first offset.
5. facts: on the same node, `queue.delete if-empty` on an empty quorum queue and on an
   empty classic queue (the reclaiming-idle-queues question).

The Python publisher (aiormq, confirms) is CPU-bound on a small machine: at the biggest
sizes the fill may stop at `--budget` before every message is in; the tables say how many.

Every loop is bounded by a count and a time budget (`--budget` seconds per size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.brokers import SBIN, BrokerNode  # noqa: E402

SHARDS = 16
PREFETCH = 256
TASK_BYTES = 1024
PERSISTENT = Basic.Properties(delivery_mode=2, content_type="application/json")
FD_SHARE = 0.8  # stop declaring per-domain queues past this share of the node's limit
CRAWL = 20.0  # declared domains per second below which declaring counts as stalled


# -- the node ---------------------------------------------------------------------


class Node:
    """The broker under test: our own `BrokerNode`, or a named node given on the command line."""

    def __init__(self, own: BrokerNode | None, url: str, nodename: str | None) -> None:
        self.own = own
        self.url = url.rstrip("/")
        self.nodename = nodename
        self._pid: int | None = None

    def ctl(self, *args: str, timeout: float = 300.0) -> str:
        if self.own is not None:
            return self.own.ctl(*args, timeout=timeout)
        argv = [str(SBIN / "rabbitmqctl"), "-q", *(["-n", self.nodename] if self.nodename else []), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
        return done.stdout

    @property
    def pid(self) -> int:
        if self._pid is None:
            self._pid = int(self.ctl("eval", "os:getpid().").strip().strip('"'))
        return self._pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def fd_limit(self) -> int:
        for line in Path(f"/proc/{self.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
        raise SystemExit("cannot read the node's descriptor limit")

    def handle_cache_limit(self) -> str:
        """The handles RabbitMQ's file handle cache allows itself (3.10: derived from the limit)."""
        try:
            return self.ctl("eval", "file_handle_cache:get_limit().").strip()
        except Exception:  # not every version has it
            return "?"

    def memory(self) -> int:
        """The VM's total memory in bytes, after a garbage collection of every process."""
        expr = "[erlang:garbage_collect(P) || P <- erlang:processes()], erlang:memory(total)."
        return int(self.ctl("eval", expr).strip())

    def snapshot(self) -> Snapshot:
        return Snapshot(self.memory(), self.fds())

    def vhost_url(self, vhost: str) -> str:
        return f"{self.url}/{vhost}"

    def add_vhost(self, name: str) -> str:
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        return self.vhost_url(name)

    def reset(self) -> None:
        """Kill the node, delete its data and start it again (our own node only)."""
        if self.own is None:
            raise SystemExit("the node stalled; it is not ours to restart: stopping here")
        self.own.kill()
        shutil.rmtree(self.own.data_dir, ignore_errors=True)
        self.own.start(timeout=120)
        self._pid = None

    @contextlib.contextmanager
    def vhost(self, name: str) -> Any:
        url = self.add_vhost(name)
        try:
            yield url
        finally:
            self.ctl("delete_vhost", name, timeout=600)

    def data_bytes(self, marker: str) -> int | None:
        """Bytes on disk under the node's data folder in paths containing `marker` (own node only)."""
        if self.own is None:
            return None
        total = 0
        for path in self.own.data_dir.rglob("*"):
            if marker in str(path) and path.is_file():
                total += path.stat().st_size
        return total


@dataclass(frozen=True)
class Snapshot:
    memory: int
    fds: int


# -- helpers ------------------------------------------------------------------------


def task_body(domain: str, n: int) -> bytes:
    """About 1 KB of JSON, the size of a Task with its URL and headers."""
    head = f'{{"v":1,"job":"bench","domain":"{domain}","url":"https://{domain}/page/{n}","pad":"'
    return (head + "x" * max(0, TASK_BYTES - len(head) - 2) + '"}').encode()


def shard_of(domain: str) -> int:
    return zlib.crc32(domain.encode()) % SHARDS


def domain_name(i: int) -> str:
    return f"d{i:07d}.example"


def progress(line: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def mib(n: float) -> str:
    return f"{n / 1024**2:,.1f}"


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")
    sys.stdout.flush()


async def publish_all(
    channels: Sequence[aiormq.abc.AbstractChannel],
    items: Iterable[tuple[str, bytes]],
    *,
    window: int = 2000,
    deadline: float,
) -> int:
    """Publish (queue, body) pairs persistently through the default exchange with confirms,
    up to `window` unconfirmed at a time; returns how many were confirmed before `deadline`."""
    room = asyncio.Semaphore(window)
    confirmed = 0
    failed: list[BaseException] = []

    def settled(future: asyncio.Future[Any]) -> None:
        nonlocal confirmed
        room.release()
        if future.cancelled() or future.exception() is not None:
            failed.append(future.exception() or asyncio.CancelledError())
        elif isinstance(future.result(), Basic.Nack):
            failed.append(RuntimeError("nacked"))
        else:
            confirmed += 1

    pending: list[asyncio.Future[Any]] = []
    for n, (queue, body) in enumerate(items):
        if time.monotonic() > deadline or failed:
            break
        await room.acquire()
        ch = channels[n % len(channels)]
        future = asyncio.ensure_future(ch.basic_publish(body, routing_key=queue, properties=PERSISTENT, wait=False))
        future.add_done_callback(settled)
        pending.append(future)
        if len(pending) >= 4 * window:
            pending = [f for f in pending if not f.done()]
    if pending:
        await asyncio.wait(pending)
    if failed:
        raise RuntimeError(f"publish failed: {failed[0]!r}")
    return confirmed


async def confirm_channels(conn: aiormq.abc.AbstractConnection, n: int) -> list[aiormq.abc.AbstractChannel]:
    return [await conn.channel(publisher_confirms=True) for _ in range(n)]


# -- 1. a queue per domain -------------------------------------------------------------


async def per_domain(node: Node, url: str, n: int, tasks: int, budget: float) -> dict[str, Any]:
    limit = node.fd_limit()
    base = node.snapshot()
    conn = await aiormq.connect(url)
    channels = await confirm_channels(conn, 4)
    stop = asyncio.Event()
    declared = 0
    why = "all declared"
    stalled = False
    args = {"x-queue-version": 2}
    start = time.monotonic()
    deadline = start + budget

    async def worker(w: int) -> None:
        nonlocal declared
        ch = channels[w]
        for i in range(w, n, len(channels)):
            if stop.is_set():
                return
            domain = domain_name(i)
            queue = f"frontier.d.{domain}"
            await ch.queue_declare(queue, durable=True, arguments=args)
            await asyncio.gather(
                *(
                    ch.basic_publish(task_body(domain, k), routing_key=queue, properties=PERSISTENT)
                    for k in range(tasks)
                )
            )
            declared += 1

    async def watch() -> None:
        nonlocal why, stalled
        last, last_t = 0, time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(2.0)
            now = time.monotonic()
            fds = node.fds()
            if fds > FD_SHARE * limit:
                why = f"stopped: {fds:,} descriptors of {limit:,}"
            elif now > deadline:
                why = f"stopped: {budget:.0f} s budget"
            elif now - start > 10 and (declared - last) / (now - last_t) < CRAWL:
                why = f"stopped: under {CRAWL:.0f} domains/s"
                stalled = True
            else:
                last, last_t = declared, now
                continue
            stop.set()
            # A stalled node never answers the declare or publish in hand: stop waiting for it.
            for task in workers:
                task.cancel()

    workers = [asyncio.create_task(worker(w)) for w in range(len(channels))]
    watcher = asyncio.create_task(watch())
    done, _ = await asyncio.wait(workers, timeout=budget + 60)
    if len(done) < len(workers):
        why = "stopped: the node stopped answering"
        stalled = True
        for task in workers:
            task.cancel()
    elapsed = time.monotonic() - start
    stop.set()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 30)
    await asyncio.sleep(2.0)
    after = node.snapshot()
    return {
        "asked": n,
        "declared": declared,
        "seconds": elapsed,
        "memory": after.memory - base.memory,
        "fds": after.fds - base.fds,
        "fd_total": after.fds,
        "limit": limit,
        "why": why,
        "stalled": stalled,
    }


# -- 2. hashed shards, a window consumer, parking --------------------------------------


def shard_queue(i: int) -> str:
    return f"frontier.s.{i:02d}"


async def declare_shards(ch: aiormq.abc.AbstractChannel, kind: str) -> None:
    args: dict[str, Any] = {"x-queue-type": "quorum"} if kind == "quorum" else {"x-queue-version": 2}
    for i in range(SHARDS):
        await ch.queue_declare(shard_queue(i), durable=True, arguments=args)
    # The park tier: a long TTL and no dead-letter target, so nothing comes back mid-run.
    await ch.queue_declare("frontier.park", durable=True, arguments={**args, "x-message-ttl": 3_600_000})


def shard_items(n: int, tasks: int) -> Iterable[tuple[str, bytes]]:
    # Task by task, domain after domain, as a job's submit would publish them.
    for k in range(tasks):
        for i in range(n):
            domain = domain_name(i)
            yield shard_queue(shard_of(domain)), task_body(domain, k)


async def window_rate(url: str, mode: str, count: int, cap: float) -> float:
    """Messages/s through a window consumer on every shard (prefetch 256 each) that either
    acks (`release`) or republishes to the park queue with a confirm, then acks (`park`)."""
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    out = await conn.channel(publisher_confirms=True)
    await ch.basic_qos(prefetch_count=PREFETCH)  # per consumer
    taken = seen = 0
    enough = asyncio.Event()

    async def on_message(message: DeliveredMessage) -> None:
        nonlocal taken, seen
        if taken >= count:
            return  # past the run's count: left unacked, back in its shard when the channel closes
        taken += 1
        if mode == "park":
            await out.basic_publish(message.body, routing_key="frontier.park", properties=PERSISTENT)
        await ch.basic_ack(message.delivery_tag)  # type: ignore[arg-type]
        seen += 1
        if seen >= count:
            enough.set()

    start = time.monotonic()
    for i in range(SHARDS):
        await ch.basic_consume(shard_queue(i), on_message, no_ack=False)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(enough.wait(), cap)
    elapsed = time.monotonic() - start
    rate = seen / elapsed
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 30)
    return rate


async def shards(node: Node, url: str, n: int, tasks: int, kind: str, budget: float, rate_count: int) -> dict[str, Any]:
    base = node.snapshot()
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    await declare_shards(ch, kind)
    channels = await confirm_channels(conn, 2)
    start = time.monotonic()
    published = await publish_all(channels, shard_items(n, tasks), deadline=start + budget)
    elapsed = time.monotonic() - start
    await conn.close()
    await asyncio.sleep(2.0)
    after = node.snapshot()
    result: dict[str, Any] = {
        "kind": kind,
        "domains": n,
        "messages": published,
        "seconds": elapsed,
        "memory": after.memory - base.memory,
        "fds": after.fds - base.fds,
    }
    # Interleaved so that both modes see the same backlog and the same machine load.
    # Six runs of `count` each, and what a closing consumer held goes back: an eighth each.
    count = min(rate_count, published // 8)
    rates: dict[str, list[float]] = {"release": [], "park": []}
    for _ in range(3):
        for mode in ("release", "park"):
            rates[mode].append(await window_rate(url, mode, count, cap=60.0))
    result["count"] = count
    result["rates"] = rates
    return result


# -- 3. a PostgreSQL frontier ------------------------------------------------------------------

PG_SCHEMA = """
CREATE TABLE {s}.domain (
    id integer PRIMARY KEY,
    name text NOT NULL,
    rate real NOT NULL,              -- requests per second
    next_fetch timestamptz NOT NULL  -- 'infinity' while the domain has no waiting task
);
CREATE INDEX ON {s}.domain (next_fetch);
CREATE TABLE {s}.task (
    id bigserial PRIMARY KEY,
    domain_id integer NOT NULL,
    job integer NOT NULL,
    url text NOT NULL,
    state smallint NOT NULL DEFAULT 0  -- 0 waiting, 1 claimed
);
CREATE INDEX ON {s}.task (domain_id, id) WHERE state = 0;
"""

# One statement, one transaction: lock the most overdue domain nobody else holds, take its
# first waiting task, and move its next fetch on by 1/rate (to 'infinity' when it has none).
PG_CLAIM = """
WITH d AS (
    SELECT id, rate FROM {s}.domain WHERE next_fetch <= now()
    ORDER BY next_fetch LIMIT 1 FOR UPDATE SKIP LOCKED
), t AS (
    UPDATE {s}.task SET state = 1
    WHERE id = (SELECT task.id FROM {s}.task JOIN d ON task.domain_id = d.id
                WHERE task.state = 0 ORDER BY task.id LIMIT 1)
    RETURNING task.id, task.domain_id, task.url
), moved AS (
    UPDATE {s}.domain SET next_fetch = CASE WHEN EXISTS (SELECT 1 FROM t)
        THEN now() + make_interval(secs => 1.0 / d.rate) ELSE 'infinity' END
    FROM d WHERE domain.id = d.id
)
SELECT id, domain_id, url FROM t
"""


def pg_fill(conn: Any, s: str, n: int, tasks: int) -> float:
    start = time.monotonic()
    with conn.cursor() as cur:
        with cur.copy(f"COPY {s}.domain (id, name, rate, next_fetch) FROM STDIN") as copy:
            for i in range(n):
                copy.write_row((i, domain_name(i), 1000.0, "-infinity"))
        with cur.copy(f"COPY {s}.task (domain_id, job, url) FROM STDIN") as copy:
            for k in range(tasks):
                for i in range(n):
                    copy.write_row((i, 1, f"https://{domain_name(i)}/page/{k}"))
    conn.commit()
    return time.monotonic() - start


def pg_sizes(conn: Any, s: str) -> tuple[int, int]:
    """(heap bytes, index bytes) of both tables."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT sum(pg_table_size(c.oid)), sum(pg_indexes_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = %s AND c.relkind = 'r'",
            (s,),
        )
        heap, index = cur.fetchone()
    return int(heap), int(index)


def pg_reset(conn: Any, s: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {s}.task SET state = 0 WHERE state <> 0")
        cur.execute(f"UPDATE {s}.domain SET next_fetch = '-infinity'")
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"VACUUM ANALYZE {s}.task, {s}.domain")
    conn.autocommit = False


def pg_claims(dsn: str, s: str, claimers: int, count: int, cap: float) -> tuple[float, int]:
    """Claims/s over `count` claims shared by `claimers` threads (or `cap` seconds); and how
    many claims came back empty (no domain due, or a due domain with no task left)."""
    import psycopg

    sql = PG_CLAIM.format(s=s)
    lock = threading.Lock()
    claimed = 0
    empty = 0
    stop_at = time.monotonic() + cap

    def run() -> None:
        nonlocal claimed, empty
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.cursor()
            while True:
                with lock:
                    if claimed >= count or time.monotonic() > stop_at:
                        return
                row = cur.execute(sql, prepare=True).fetchone()
                with lock:
                    if row is None:
                        empty += 1
                    else:
                        claimed += 1

    start = time.monotonic()
    threads = [threading.Thread(target=run) for _ in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed / (time.monotonic() - start), empty


def pg_bench(dsn: str, sizes: Sequence[int], tasks: int, claim_count: int) -> list[dict[str, Any]]:
    import psycopg

    s = f"frontier_bench_{os.getpid()}"
    results = []
    with psycopg.connect(dsn) as conn:
        try:
            for n in sizes:
                with conn.cursor() as cur:
                    cur.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
                    cur.execute(f"CREATE SCHEMA {s}")
                    cur.execute(PG_SCHEMA.format(s=s))
                conn.commit()
                fill = pg_fill(conn, s, n, tasks)
                pg_reset(conn, s)
                heap, index = pg_sizes(conn, s)
                # Claim at most half the tasks per run, so the frontier never runs dry mid-run.
                count = min(claim_count, n * tasks // 2)
                row: dict[str, Any] = {"domains": n, "fill": fill, "heap": heap, "index": index, "count": count}
                for claimers in (1, 4):
                    runs = []
                    for _ in range(3):
                        pg_reset(conn, s)
                        runs.append(pg_claims(dsn, s, claimers, count, cap=15.0))
                    row[f"rate{claimers}"] = [r for r, _ in runs]
                    row[f"empty{claimers}"] = sum(e for _, e in runs)
                after_heap, after_index = pg_sizes(conn, s)
                row["heap_after"], row["index_after"] = after_heap, after_index
                results.append(row)
        finally:
            with conn.cursor() as cur:
                cur.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
            conn.commit()
    return results


# -- 4. a stream ---------------------------------------------------------------------------


async def stream(node: Node, url: str, messages: int, budget: float, read_count: int) -> dict[str, Any]:
    base = node.snapshot()
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    await ch.queue_declare("frontier.stream", durable=True, arguments={"x-queue-type": "stream"})
    channels = await confirm_channels(conn, 2)
    items = (("frontier.stream", task_body(domain_name(i % 100_000), i)) for i in range(messages))
    start = time.monotonic()
    appended = await publish_all(channels, items, deadline=start + budget)
    append_s = time.monotonic() - start
    await asyncio.sleep(2.0)
    after = node.snapshot()

    # One reader from the first offset: stream consumers need a prefetch and ack for credit.
    reader = await conn.channel()
    await reader.basic_qos(prefetch_count=1000)
    seen = 0
    enough = asyncio.Event()
    target = min(read_count, appended)

    async def on_message(message: DeliveredMessage) -> None:
        nonlocal seen
        await reader.basic_ack(message.delivery_tag)  # type: ignore[arg-type]
        seen += 1
        if seen >= target:
            enough.set()

    start = time.monotonic()
    await reader.basic_consume("frontier.stream", on_message, no_ack=False, arguments={"x-stream-offset": "first"})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(enough.wait(), 60.0)
    read_rate = seen / (time.monotonic() - start)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 30)
    return {
        "messages": appended,
        "append_s": append_s,
        "memory": after.memory - base.memory,
        "fds": after.fds - base.fds,
        "disk": node.data_bytes("stream"),
        "read_rate": read_rate,
        "read": seen,
    }


# -- 5. facts for reclaiming idle queues ----------------------------------------------------


async def delete_if_empty(url: str) -> list[tuple[str, str]]:
    """What `queue.delete if-empty` answers on an empty queue of each type. On 3.10 a quorum
    queue answers NOT_IMPLEMENTED, a connection error: each attempt gets its own connection."""
    found = []
    for kind, args in (("classic v2", {"x-queue-version": 2}), ("quorum", {"x-queue-type": "quorum"})):
        name = f"frontier.reclaim.{kind.split()[0]}"
        conn = await aiormq.connect(url)
        ch = await conn.channel()
        await ch.queue_declare(name, durable=True, arguments=args)
        try:
            await ch.queue_delete(name, if_empty=True)
            found.append((kind, "deleted"))
        except aiormq.exceptions.AMQPError as exc:
            found.append((kind, f"refused, connection closed: {exc}"[:160]))
            conn = await aiormq.connect(url)
            ch = await conn.channel()
            await ch.queue_delete(name)
        with contextlib.suppress(Exception):
            await conn.close()
    return found


# -- main -------------------------------------------------------------------------------------


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip() and int(x) > 0]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Measures on a RabbitMQ node of its own unless --url/--nodename name another (never 5672).",
    )
    p.add_argument("--only", default="per-domain,shards,pg,stream,facts", help="phases to run, comma separated")
    p.add_argument("--per-domain", default="1000,5000,10000", help="domain counts, a queue each (default %(default)s)")
    p.add_argument("--shard-domains", default="1000,10000,100000", help="domain counts in 16 shards (%(default)s)")
    p.add_argument(
        "--quorum-domains",
        default="0",
        help="the same on quorum shards, e.g. 100000 (~6 min more); 0 skips (%(default)s)",
    )
    p.add_argument("--pg-domains", default="1000,10000,100000", help="domain counts in PostgreSQL (%(default)s)")
    p.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 dbname=test user=postgres")
    p.add_argument("--stream-messages", type=int, default=500_000, help="messages in the stream (%(default)s)")
    p.add_argument("--tasks", type=int, default=5, help="tasks per domain (%(default)s)")
    p.add_argument("--rate-count", type=int, default=20_000, help="messages per window-consumer run (%(default)s)")
    p.add_argument("--claim-count", type=int, default=20_000, help="claims per PostgreSQL run (%(default)s)")
    p.add_argument("--budget", type=float, default=150.0, help="seconds at most to fill one size (%(default)s)")
    p.add_argument("--port", type=int, default=5690, help="AMQP port of the node started here (%(default)s)")
    p.add_argument("--dist-port", type=int, default=25690, help="its distribution port (%(default)s)")
    p.add_argument("--url", help="an existing node's AMQP URL instead of starting one (not the shared 5672)")
    p.add_argument("--nodename", help="that node's name, for rabbitmqctl (same machine: its pid is read)")
    return p.parse_args(argv)


def start_node(args: argparse.Namespace) -> Node:
    if args.url:
        if ":5672" in args.url:
            raise SystemExit("refusing the shared broker on 5672: start a node of your own")
        return Node(None, args.url, args.nodename)
    # The node inherits our limits: raise the soft descriptor limit to the hard one first.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    own = BrokerNode(name=f"hutch-frontier-{os.getpid()}", port=args.port, dist_port=args.dist_port)
    own.start(timeout=120)
    return Node(own, own.url, own.nodename)


async def run(args: argparse.Namespace, node: Node) -> None:
    phases = set(args.only.split(","))
    print(
        f"node {node.nodename or node.url}: pid {node.pid}, descriptor limit {node.fd_limit():,}, "
        f"file handle cache limit {node.handle_cache_limit()}"
    )
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")

    if "per-domain" in phases:
        rows = []
        for n in sizes(args.per_domain):
            url = node.add_vhost(f"fm-pd-{n}")
            r = await per_domain(node, url, n, args.tasks, args.budget)
            progress(f"per-domain {n:,}: {r['declared']:,} declared in {r['seconds']:.1f} s, {r['why']}")
            if r["stalled"]:
                # A stalled node does not delete its queues either (delete_vhost hung for
                # minutes here): throw the node's data away instead.
                progress("the node stalled: killing it and starting it again with no data")
                node.reset()
            else:
                node.ctl("delete_vhost", f"fm-pd-{n}", timeout=600)
            d = max(1, r["declared"])
            rows.append(
                [
                    f"{n:,}",
                    f"{r['declared']:,}",
                    f"{r['seconds']:.1f}",
                    f"{r['declared'] / r['seconds']:,.0f}",
                    mib(r["memory"]),
                    kib(r["memory"] / d),
                    f"{r['fds']:,}",
                    f"{r['fds'] / d:.2f}",
                    f"{r['fd_total']:,}/{r['limit']:,}",
                    r["why"],
                ]
            )
        table(
            f"1. A queue per domain: classic v2 durable, {args.tasks} persistent ~1 KB messages each",
            [
                "domains",
                "declared",
                "declare+fill s",
                "domains/s",
                "memory MiB",
                "KiB/domain",
                "fds",
                "fds/domain",
                "node fds/limit",
                "outcome",
            ],
            rows,
        )

    loop = asyncio.get_running_loop()

    if "shards" in phases:
        kinds = [("classic", sizes(args.shard_domains))]
        if sizes(args.quorum_domains):
            kinds.append(("quorum", sizes(args.quorum_domains)))
        await shard_phase(node, args, kinds)

    if "pg" in phases and sizes(args.pg_domains):
        results = await loop.run_in_executor(
            None, pg_bench, args.pg_dsn, sizes(args.pg_domains), args.tasks, args.claim_count
        )
        rows = []
        for r in results:
            total = r["heap"] + r["index"]
            rows.append(
                [
                    f"{r['domains']:,}",
                    f"{r['fill']:.1f}",
                    mib(r["heap"]),
                    mib(r["index"]),
                    f"{total / r['domains']:,.0f}",
                    f"{r['count']:,}",
                    " / ".join(f"{x:,.0f}" for x in r["rate1"]),
                    f"{statistics.median(r['rate1']):,.0f}",
                    " / ".join(f"{x:,.0f}" for x in r["rate4"]),
                    f"{statistics.median(r['rate4']):,.0f}",
                    mib(r["heap_after"] + r["index_after"]),
                    f"{r['empty1'] + r['empty4']}",
                ]
            )
        table(
            f"3. PostgreSQL frontier, {args.tasks} tasks per domain: claim = SKIP LOCKED on the most overdue domain",
            [
                "domains",
                "fill s",
                "heap MiB",
                "index MiB",
                "bytes/domain",
                "claims per run",
                "1 claimer runs",
                "1 median",
                "4 claimers runs",
                "4 median",
                "MiB after runs",
                "empty claims",
            ],
            rows,
        )

    if "stream" in phases and args.stream_messages > 0:
        with node.vhost("fm-stream") as url:
            r = await stream(node, url, args.stream_messages, args.budget, read_count=100_000)
        disk = "-" if r["disk"] is None else mib(r["disk"])
        table(
            "4. One stream of ~1 KB messages",
            ["messages", "append s", "appends/s", "memory MiB", "fds", "disk MiB", "read msgs/s (first offset)"],
            [
                [
                    f"{r['messages']:,}",
                    f"{r['append_s']:.1f}",
                    f"{r['messages'] / r['append_s']:,.0f}",
                    mib(r["memory"]),
                    f"{r['fds']:,}",
                    disk,
                    f"{r['read_rate']:,.0f} over {r['read']:,}",
                ]
            ],
        )

    if "facts" in phases:
        with node.vhost("fm-facts") as url:
            found = await delete_if_empty(url)
        table("5. queue.delete if-empty on an empty queue", ["queue type", "answer"], found)


async def shard_phase(node: Node, args: argparse.Namespace, kinds: list[tuple[str, list[int]]]) -> None:
    rows, rate_rows = [], []
    for kind, counts in kinds:
        for n in counts:
            with node.vhost(f"fm-{kind}-{n}") as url:
                r = await shards(node, url, n, args.tasks, kind, args.budget, args.rate_count)
                progress(
                    f"{kind} shards {n:,}: {r['messages']:,} published in {r['seconds']:.1f} s, rates {r['rates']}"
                )
            rel, park = statistics.median(r["rates"]["release"]), statistics.median(r["rates"]["park"])
            rows.append(
                [
                    kind,
                    f"{n:,}",
                    f"{r['messages']:,}",
                    f"{r['seconds']:.1f}",
                    f"{r['messages'] / r['seconds']:,.0f}",
                    mib(r["memory"]),
                    f"{r['memory'] / r['messages']:,.0f}",
                    f"{r['fds']:,}",
                ]
            )
            rate_rows.append(
                [
                    kind,
                    f"{n:,}",
                    f"{r['count']:,}",
                    " / ".join(f"{x:,.0f}" for x in r["rates"]["release"]),
                    f"{rel:,.0f}",
                    " / ".join(f"{x:,.0f}" for x in r["rates"]["park"]),
                    f"{park:,.0f}",
                    f"{park / rel:.2f}",
                ]
            )
    table(
        f"2a. {SHARDS} hashed shard queues, {args.tasks} persistent ~1 KB messages per domain",
        ["type", "domains", "messages", "publish s", "msgs/s", "memory MiB", "bytes/msg", "fds"],
        rows,
    )
    table(
        f"2b. Window consumer, prefetch {PREFETCH} per shard: ack only (release) vs republish+confirm+ack (park)",
        [
            "type",
            "domains",
            "msgs per run",
            "release runs",
            "release median",
            "park runs",
            "park median",
            "park/release",
        ],
        rate_rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    node = start_node(args)
    started = time.monotonic()
    try:
        asyncio.run(run(args, node))
    finally:
        if node.own is not None:
            node.own.stop(timeout=120)
            node.own.cleanup()
        print(f"\ntotal {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
