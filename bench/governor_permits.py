"""Permits per second: 1,000 domains with backlog, limits that do not bind, a stand-in fetcher.

    .venv/bin/python bench/governor_permits.py [--domains 1000] [--per-domain 50] [--runs 3]
        [--queue-type classic|quorum]

Each run gets a fresh vhost; `--per-domain` tasks per domain go through the frontier as
the submitter sends them (round robin over the domains, each under its domain's shard key,
so into the fixed shard queues). A governor process then starts (it reads the released log
to its end before releasing) with every domain at 50/s, burst 1, and a stand-in
process drains `fetch.ready`, acking each task after its confirmed outcome event (see
`governor_standin.py`), with heartbeats. The figure is permits per second seen by the
stand-in over `--measure` seconds after a 2 s warm-up; the median of the runs is the result.
A last run under cProfile prints where the governor's time goes. robots.txt is off here:
there is nothing to fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from governor_common import (
    Process,
    bench_tasks,
    bench_vhost,
    broker_pid,
    check_fd_room,
    child_env,
    cpu_seconds,
    preload,
    processes,
    service,
)

from hutch.amqp import Broker
from hutch.settings import Settings

HERE = Path(__file__).resolve().parent


def bench_settings(url: str, data: Path, queue_type: str = "classic") -> Settings:
    return Settings(
        amqp_url=url,
        queue_type=queue_type,  # type: ignore[arg-type]
        namespace="bench",
        data_dir=data,
        rate=50.0,
        burst=1,
        permit_ttl=5.0,
        max_ready=5000,
        concurrency_per_domain=50,
        respect_robots=False,
    )


async def drop_other_consumers_queues(settings: Settings) -> None:
    """Delete the storer's and proxy-manager's event queues: they do not run here.

    Left in place they fill up (nothing consumes them) and the broker spends its one spare
    core writing events no one reads; in a deployment the storer drains them.
    """
    broker = await Broker(settings, "bench-admin").connect(declare=False)
    try:
        channel = await broker.channel()
        for name in (broker.topology.events_storer, broker.topology.events_proxy):
            await channel.queue_delete(name)
        await channel.close()
    finally:
        await broker.close()


def read_counts(path: Path) -> list[tuple[float, int, float]]:
    """(time, permits used so far, sum of their ages at use) a line a second."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append((row["t"], row["count"], row["age"]))
    return rows


async def one_run(args: argparse.Namespace, label: str, profile: Path | None = None) -> float:
    with bench_vhost("permits") as url, tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        settings = bench_settings(url, work / "data", args.queue_type)
        check_fd_room(settings.frontier_shards)
        started = time.monotonic()
        names = [f"d{i:05d}.bench.example" for i in range(args.domains)]
        await preload(settings, bench_tasks(names, args.per_domain))
        loaded = time.monotonic() - started
        tasks = args.domains * args.per_domain
        print(
            f"  {label}: preloaded {tasks} tasks in {loaded:.1f}s ({tasks / loaded:,.0f} published/s, confirmed)",
            flush=True,
        )
        counts = work / "counts.jsonl"
        env = child_env(settings, BENCH_COUNTS=str(counts))
        standin = Process("standin", [str(HERE / "governor_standin.py")], env, work)
        governor = service("governor", env, work, profile=profile)
        if os.environ.get("BENCH_GOVERNOR_SCRIPT"):  # an experiment: another entry point
            governor = Process("governor", [os.environ["BENCH_GOVERNOR_SCRIPT"]], env, work)
        async with processes(standin, governor):
            await standin.wait_ready()
            begun = time.monotonic()
            # The governor releases from its first shard on and logs "ready" once it consumes
            # every shard: the measurement starts from the first permit, not from "ready".
            ready_at: list[float] = []
            ready = asyncio.create_task(governor.wait_ready(timeout=300))
            ready.add_done_callback(
                lambda t: ready_at.append(time.monotonic()) if not t.cancelled() and not t.exception() else None
            )
            deadline = time.monotonic() + 120
            while not any(c for _, c, _ in read_counts(counts)):
                if time.monotonic() > deadline or (ready.done() and ready.exception()):
                    raise RuntimeError(f"no permit within 120s; see {work}")
                await asyncio.sleep(0.2)
            print(f"  {label}: first permit {time.monotonic() - begun:.1f}s after the governor started", flush=True)
            if not args.keep_other_queues:
                await drop_other_consumers_queues(settings)
            await asyncio.sleep(2.0)  # warm-up
            pids = {"governor": governor.pid, "stand-in": standin.pid, "broker": broker_pid()}
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items() if pid}
            w0 = time.monotonic()
            t0, c0, a0 = read_counts(counts)[-1]
            await asyncio.sleep(args.measure)
            print(f"  {label}: governor: {governor.last_line('permits/s')}", flush=True)
            t1, c1, a1 = read_counts(counts)[-1]
            cpu1 = {name: cpu_seconds(pids[name]) for name in cpu0}
            wall = time.monotonic() - w0
            ready.cancel()
            when = f"{ready_at[0] - begun:.1f}s after it started" if ready_at else "not yet at the end"
            print(f"  {label}: governor ready (every shard consumed): {when}", flush=True)
            await governor.stop(timeout=90)
        rate = (c1 - c0) / (t1 - t0)
        total = args.domains * args.per_domain
        age = (a1 - a0) / max(c1 - c0, 1)
        print(
            f"  {label}: {rate:,.0f} permits/s, permit age at use {age * 1000:.0f} ms ({c1}/{total} tasks drained)",
            flush=True,
        )
        # CPU seconds per 1,000 permits, over the same wall time as the count.
        permits = max(rate * wall, 1.0)
        spent = {name: cpu1[name] - cpu0[name] for name in cpu0}
        print(
            f"  {label}: CPU per 1,000 permits: "
            + ", ".join(
                f"{name} {1000 * sec / permits:.2f} s ({sec / wall:.0%} of a core)" for name, sec in spent.items()
            ),
            flush=True,
        )
        return rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--per-domain", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--measure", type=float, default=10.0)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--keep-other-queues",
        action="store_true",
        help="keep the storer's and proxy-manager's event queues (they fill up: nothing consumes them)",
    )
    parser.add_argument("--keep", help="folder for the processes' logs (default: a temporary one)")
    parser.add_argument(
        "--queue-type", choices=("classic", "quorum"), default="classic", help="HUTCH_QUEUE_TYPE of the run"
    )
    args = parser.parse_args()
    print(
        f"permits/s: {args.domains} domains x {args.per_domain} tasks, 50/s burst 1 each (not binding), "
        f"{args.queue_type} queues"
    )
    rates = [await one_run(args, f"run {i + 1}") for i in range(args.runs)]
    if rates:
        print(
            f"median of {len(rates)} runs: {statistics.median(rates):,.0f} permits/s "
            f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}; target >= 2,000)"
        )
    if not args.no_profile:
        with tempfile.TemporaryDirectory() as tmp:
            prof = Path(tmp) / "governor.prof"
            rate = await one_run(args, "profiled run (cProfile, slower)", profile=prof)
            print(f"profile of the governor during a run at {rate:,.0f} permits/s, top 25 by own time:")
            stats = pstats.Stats(str(prof))
            stats.sort_stats("tottime").print_stats(25)
            print("the governor's own code and the AMQP layer, by cumulative time:")
            stats.sort_stats("cumulative").print_stats(r"services/governor|shared/amqp", 20)


if __name__ == "__main__":
    asyncio.run(main())
