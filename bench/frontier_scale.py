"""The sharded frontier at 1,000, 10,000 and 100,000 domains with backlog, 5 tasks each.

    .venv/bin/python bench/frontier_scale.py [--sizes 1000,10000,100000] [--per-domain 5]
        [--drain-limit 900] [--private-node]

For each size, in a fresh vhost: the tasks go through the frontier as the submitter sends
them (round robin over the domains, each under `topology.shard_key(domain)`, so into the
fixed shard queues), then a governor process and the stand-in fetcher
(`governor_standin.py`: acks each task after its confirmed `ok` outcome, heartbeats a
concurrency of 1,000) drain them. Settings are the defaults (2 requests/s and burst 1 per
domain, 16 shards, a window of 256 per shard, `max_ready` 200, permits of 30 s) except
robots.txt, off: nothing serves one (`HUTCH_` variables change the rest, for experiments:
the settings used are printed). The storer's and proxy-manager's event queues are
deleted once the governor runs (they do not run here and would fill up).

Measured: the node's memory (`erlang:memory(total)`) and the descriptors its VM holds
(/proc/<pid>/fd) before and after the preload and at the peak while draining (sampled
every second, memory every 10 s); the governor's peak resident memory and CPU seconds; the
stand-in's permits per second (the median of its per-second counts from 5 s after the first
permit until 90 % are drained); the time from the governor's start until every task came
back done, given up after `--drain-limit` seconds (then: how far it got).

The broker is the shared one unless `--private-node` starts a node of the benchmark's own
(`broker_node.py`, `ulimit -n 20000`), or `BENCH_AMQP_URL` and `BENCH_RABBITMQ_NODE` name one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import governor_common as common
from broker_node import private_node
from governor_common import (
    Process,
    bench_tasks,
    bench_vhost,
    broker_pid,
    child_env,
    cpu_seconds,
    fd_count,
    node_memory,
    preload,
    rss_kib,
    service,
)

from hutch.amqp import Broker
from hutch.settings import Settings

HERE = Path(__file__).resolve().parent
WARM_UP = 5.0  # seconds after the first permit not counted in permits/s
MEMORY_EVERY = 10.0  # seconds between two reads of the node's memory (each starts an Erlang VM)


@dataclass
class Result:
    domains: int
    tasks: int
    preload_s: float = 0.0
    broker_mib: list[float] = field(default_factory=list)  # before, after preload, peak, at the end
    broker_fds: list[int] = field(default_factory=list)  # the same
    governor_peak_mib: float = 0.0
    governor_cpu_s: float = 0.0
    first_permit_s: float = 0.0
    ready_s: float | None = None  # the governor consumes every shard
    permits_median: float = 0.0
    permits_mean: float = 0.0
    drained: int = 0
    drain_s: float | None = None  # None: not drained within the limit
    note: str = ""


def read_counts(path: Path) -> list[tuple[float, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            row = json.loads(line)
            rows.append((float(row["t"]), int(row["count"])))
    return rows


def permits_per_second(rows: list[tuple[float, int]], total: int) -> tuple[float, float]:
    """(median of per-second counts after warm-up until 90 % drained, mean over the same)."""
    first = next((t for t, c in rows if c > 0), None)
    if first is None:
        return 0.0, 0.0
    end = next((t for t, c in rows if c >= 0.9 * total), rows[-1][0])
    window = [(t, c) for t, c in rows if first + WARM_UP <= t <= end]
    if len(window) < 3:  # drained within the warm-up: every second from the first permit
        window = [(t, c) for t, c in rows if first <= t <= end]
    rates = [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in itertools.pairwise(window) if t1 > t0]
    if not rates:
        return 0.0, 0.0
    return statistics.median(rates), (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])


async def drop_other_consumers_queues(settings: Settings) -> None:
    """The storer's and proxy-manager's event queues: nothing consumes them here."""
    broker = await Broker(settings, "bench-admin").connect(declare=False)
    try:
        channel = await broker.channel()
        for name in (broker.topology.events_storer, broker.topology.events_proxy):
            await channel.queue_delete(name)
        await channel.close()
    finally:
        await broker.close()


class Sampler:
    """Peaks of the node's descriptors and memory, and of the governor's resident memory."""

    def __init__(self, beam: int) -> None:
        self.beam = beam
        self.governor: int | None = None
        self.peak_fds = 0
        self.peak_memory = 0
        self.peak_governor_kib = 0

    async def run(self) -> None:
        last_memory = 0.0
        while True:
            self.peak_fds = max(self.peak_fds, fd_count(self.beam))
            if self.governor is not None:
                with contextlib.suppress(OSError):
                    self.peak_governor_kib = max(self.peak_governor_kib, rss_kib(self.governor))
            if time.monotonic() - last_memory >= MEMORY_EVERY:
                last_memory = time.monotonic()
                with contextlib.suppress(SystemExit):
                    self.peak_memory = max(self.peak_memory, await asyncio.to_thread(node_memory))
            await asyncio.sleep(1.0)


def mib(n: int) -> float:
    return round(n / 2**20, 1)


async def one(domains: int, args: argparse.Namespace, work: Path) -> Result:
    total = domains * args.per_domain
    result = Result(domains, total)
    beam = broker_pid()
    if beam is None:
        raise SystemExit("cannot find the broker's VM on this machine (its memory and descriptors are measured)")
    with bench_vhost("frontier") as url:
        settings = Settings(amqp_url=url, namespace="bench", data_dir=work / "data", respect_robots=False)
        print(f"  settings: rate {settings.rate:g}/s, burst {settings.burst}, {settings.frontier_shards} shards, "
              f"window {settings.frontier_window}, hold horizon {settings.hold_horizon:g}s, max_ready "
              f"{settings.max_ready}, permits {settings.permit_ttl:g}s, robots.txt off", flush=True)
        await (await Broker(settings, "bench-declare").connect()).close()  # the static topology first
        await asyncio.sleep(2)
        memory0, fds0 = node_memory(), fd_count(beam)
        started = time.monotonic()
        names = [f"f{i:06d}.bench.example" for i in range(domains)]
        step = max(total // 10, 2000)

        def progress(sent: int) -> None:
            if sent % step < 2000:
                print(f"    {domains}: {sent:,} of {total:,} published, {time.monotonic() - started:.0f}s", flush=True)

        await preload(settings, bench_tasks(names, args.per_domain), progress=progress)
        result.preload_s = round(time.monotonic() - started, 1)
        await asyncio.sleep(2)
        memory1, fds1 = node_memory(), fd_count(beam)
        print(f"  {domains}: preloaded {total:,} tasks in {result.preload_s:.0f}s; node {mib(memory0)} -> "
              f"{mib(memory1)} MiB, descriptors {fds0} -> {fds1}", flush=True)

        counts = work / f"counts-{domains}.jsonl"
        env = child_env(settings, BENCH_COUNTS=str(counts))
        standin = Process(f"standin-{domains}", [str(HERE / "governor_standin.py")], env, work)
        governor = service("governor", env, work, label=f"governor-{domains}")
        sampler = Sampler(beam)
        sampling = asyncio.create_task(sampler.run())
        try:
            await standin.start()
            await standin.wait_ready()
            begun = time.monotonic()
            began_wall = time.time()
            await governor.start()
            sampler.governor = governor.pid
            ready = asyncio.create_task(governor.wait_ready(timeout=args.drain_limit))
            dropped = False
            deadline = begun + args.drain_limit
            rows: list[tuple[float, int]] = []
            next_report = 30.0
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                rows = read_counts(counts)
                done = rows[-1][1] if rows else 0
                if done and not result.first_permit_s:
                    result.first_permit_s = round(next(t for t, c in rows if c > 0) - began_wall, 1)
                if done and not dropped:
                    await drop_other_consumers_queues(settings)
                    dropped = True
                if ready.done() and result.ready_s is None and not ready.exception():
                    result.ready_s = round(time.monotonic() - begun, 1)
                if governor.process is not None and governor.process.returncode is not None:
                    result.note = f"governor exited: see {governor.log_path}"
                    break
                if done >= total:
                    break
                elapsed = time.monotonic() - begun
                if elapsed >= next_report:
                    next_report += 30
                    print(f"    {domains}: {done:,} of {total:,} done after {elapsed:.0f}s", flush=True)
            assert governor.pid is not None
            summarise(result, rows, began_wall, governor.pid, sampler)
            memory2, fds2 = node_memory(), fd_count(beam)
            ready.cancel()
        finally:
            sampling.cancel()
            await governor.stop(timeout=90)
            await standin.stop()
        result.broker_mib = [mib(memory0), mib(memory1), mib(max(sampler.peak_memory, memory1, memory2)), mib(memory2)]
        result.broker_fds = [fds0, fds1, max(sampler.peak_fds, fds1, fds2), fds2]
        if result.drain_s is None and not result.note:
            result.note = f"gave up after {args.drain_limit:.0f}s: {result.drained:,} of {total:,} done"
    return result


def summarise(
    result: Result, rows: list[tuple[float, int]], began_wall: float, governor: int, sampler: Sampler
) -> None:
    """What the counts and the sampler say of a finished (or abandoned) run."""
    result.drained = rows[-1][1] if rows else 0
    if result.drained >= result.tasks:
        reached = next(t for t, c in rows if c >= result.tasks)
        result.drain_s = round(reached - began_wall, 1)
    result.permits_median, result.permits_mean = (round(x) for x in permits_per_second(rows, result.tasks))
    result.governor_cpu_s = round(cpu_seconds(governor), 1)
    result.governor_peak_mib = round(sampler.peak_governor_kib / 1024, 1)


def table(results: list[Result]) -> str:
    lines = [
        "| domains | tasks | preload | broker memory MiB: before / after preload / peak / end "
        "| broker descriptors: before / after preload / peak / end | governor peak RSS | governor CPU "
        "| first permit | governor ready | permits/s median (mean) | drained in |",
        "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        mem = " / ".join(f"{x:,.0f}" for x in r.broker_mib)
        fds = " / ".join(str(x) for x in r.broker_fds)
        ready = f"{r.ready_s:.0f} s" if r.ready_s is not None else "not within the run"
        drain = f"{r.drain_s:.0f} s" if r.drain_s is not None else f"{r.drained:,} done; {r.note}"
        lines.append(
            f"| {r.domains:,} | {r.tasks:,} | {r.preload_s:.0f} s | {mem} | {fds} | {r.governor_peak_mib:.0f} MiB "
            f"| {r.governor_cpu_s:.0f} s | {r.first_permit_s:.1f} s | {ready} "
            f"| {r.permits_median:,.0f} ({r.permits_mean:,.0f}) | {drain} |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        for domains in (int(x) for x in args.sizes.split(",")):
            print(f"{domains:,} domains x {args.per_domain} tasks:", flush=True)
            result = await one(domains, args, work)
            results.append(result)
            if args.out:
                with Path(args.out).open("a", encoding="utf-8") as out:  # noqa: ASYNC230 (one line)
                    out.write(json.dumps(asdict(result)) + "\n")
            print(table([result]), flush=True)
    print(table(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="numbers of domains, comma separated")
    parser.add_argument("--per-domain", type=int, default=5)
    parser.add_argument("--drain-limit", type=float, default=900.0, help="seconds before giving up a drain")
    parser.add_argument("--private-node", action="store_true", help="start a RabbitMQ node of its own, stop it after")
    parser.add_argument("--out", help="append each size's figures to this file as a JSON line")
    parser.add_argument("--keep", help="folder for the processes' logs (default: a temporary one)")
    args = parser.parse_args()
    if args.private_node:
        with private_node() as node:
            common.use_node(node.url, node.nodename)
            print(f"on a node of its own: {node.nodename}, {node.url}", flush=True)
            asyncio.run(run(args))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
