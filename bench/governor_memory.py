"""Memory per domain on the sharded frontier: the broker's and the governor's, at 1,000 and 10,000.

    .venv/bin/python bench/governor_memory.py [--domains 1000,10000]

For each count, in a fresh vhost: one task per domain goes into the frontier under its
domain's shard key (the state a large job starts in); the broker holds the same 16 shard
queues whatever the count. Broker side: the node's total memory (`erlang:memory(total)`
and `rabbitmq-diagnostics memory_breakdown`) before and after, per domain; the shard queues'
own process memory (`rabbitmqctl list_queues memory`); the descriptors the node holds.
Governor side: a governor process takes what its shard windows hold (16 x 256 by default;
no fetcher runs, so it holds them and waits); its resident memory minus that of a governor
with no domain, per domain it holds. Then, with no broker at all, `tracemalloc` measures
what the governor's own state (`Core`: bucket, adaptive rate, queue state, a lease) costs
per domain.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import governor_common as common
from governor_common import (
    bench_tasks,
    bench_vhost,
    broker_fd_room,
    check_fd_room,
    child_env,
    node_memory,
    preload,
    rabbitmqctl,
    rss_kib,
    service,
)

from hutch.amqp import Broker
from hutch.models import Event, Task
from hutch.services.governor.core import Core, CoreConfig
from hutch.services.governor.limits import DomainLimit, Limits
from hutch.settings import Settings
from hutch.topology import Topology


def breakdown_total_bytes() -> int:
    node = ["-n", common.NODE] if common.NODE else []
    text = subprocess_text("rabbitmq-diagnostics", *node, "memory_breakdown", "-q", "--unit", "bytes")
    total = 0
    for line in text.splitlines():
        match = re.match(r"\s*[a-z_]+: (\d+)", line)
        if match:
            total += int(match.group(1))
    return total


def subprocess_text(*argv: str) -> str:
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout


def queue_memory(vhost: str, prefix: str) -> tuple[int, int]:
    """(number, summed process memory in bytes) of the queues whose name starts with prefix."""
    text = rabbitmqctl("list_queues", "-p", vhost, "-q", "name", "memory")
    count = total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith(prefix) and parts[1].isdigit():
            count += 1
            total += int(parts[1])
    return count, total


async def fill(settings: Settings, domains: int) -> None:
    names = [f"m{i:06d}.bench.example" for i in range(domains)]
    await preload(settings, bench_tasks(names, 1))


async def governor_rss(settings: Settings, work: Path, expect: int, label: str) -> tuple[int, int]:
    """Resident KiB of a governor once it holds tasks of `expect` domains (or its count has
    stood still for 10 s), and that count."""
    governor = service("governor", child_env(settings), work, label=label)
    await governor.start()
    try:
        await governor.wait_ready()
        deadline = time.monotonic() + 300
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            line = governor.last_line("permits/s")
            match = re.search(r"; (\d+) domains", line)
            count = int(match.group(1)) if match else 0
            if count >= expect or (count == seen and time.monotonic() - since > 10.0):
                break
            if count != seen:
                seen, since = count, time.monotonic()
            await asyncio.sleep(1)
        await asyncio.sleep(5)
        assert governor.process is not None
        line = governor.last_line("permits/s")
        match = re.search(r"; (\d+) domains", line)
        return rss_kib(governor.process.pid), int(match.group(1)) if match else 0
    finally:
        await governor.stop()


def core_bytes_per_domain(domains: int) -> float:
    """tracemalloc: the governor's own per-domain state, one release and one outcome each."""
    now = [1000.0]
    core = Core("g", Limits(DomainLimit(2.0, 1, 8)), clock=lambda: now[0], config=CoreConfig())
    names = [f"m{i:06d}.bench.example" for i in range(domains)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for name in names:
        core.queue(name)
        core.activate(name)
    now[0] += 10
    for i, name in enumerate(names):
        task = core.commit(Task(id=f"t{i}", job="j", url=f"http://{name}/", domain=name), name)
        assert task.permit is not None
        core.on_outcome(
            Event(kind="outcome", task_id=task.id, job="j", domain=name, attempt=1, outcome="ok",
                  permit_id=task.permit.id)
        )
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / domains


async def one(count: int, work: Path) -> None:
    with bench_vhost("memory") as url:
        vhost = url.rsplit("/", 1)[1].replace("%2F", "/")
        settings = Settings(
            amqp_url=url, namespace="bench", data_dir=work / "data", permit_ttl=5.0, respect_robots=False
        )
        check_fd_room(settings.frontier_shards)
        # The static topology first, so that the difference is the backlog alone.
        await (await Broker(settings, "bench-declare").connect()).close()
        baseline, _ = await governor_rss(settings, work, 0, f"governor-0-{count}")
        before_node, before_total, (before_fds, _) = node_memory(), breakdown_total_bytes(), broker_fd_room()
        started = time.monotonic()
        await fill(settings, count)
        filled = time.monotonic() - started
        await asyncio.sleep(3)
        after_node, after_total, (after_fds, limit) = node_memory(), breakdown_total_bytes(), broker_fd_room()
        queues, queue_bytes = queue_memory(vhost, Topology("bench").frontier + ".s.")
        print(f"{count} domains with backlog, one task each (filled in {filled:.0f}s):", flush=True)
        print(
            f"  broker: node memory +{(after_node - before_node) / 2**20:.1f} MiB "
            f"({(after_node - before_node) / count / 1024:.2f} KiB per domain; memory_breakdown total "
            f"+{(after_total - before_total) / count / 1024:.2f} KiB); the {queues} shard queue processes "
            f"{queue_bytes / 2**20:.1f} MiB in all; file descriptors {before_fds} -> {after_fds} of {limit}",
            flush=True,
        )
        windows = settings.frontier_shards * settings.frontier_window
        rss, held = await governor_rss(settings, work, min(count, windows), f"governor-{count}")
        print(
            f"  governor: resident {rss / 1024:.1f} MiB holding tasks of {held} domains (its windows: "
            f"{settings.frontier_shards} x {settings.frontier_window}) vs {baseline / 1024:.1f} MiB with none: "
            f"{(rss - baseline) / max(held, 1):.1f} KiB per domain held",
            flush=True,
        )
    print(f"  governor state alone (tracemalloc, no broker): {core_bytes_per_domain(count) / 1024:.2f} KiB per domain",
          flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", default="1000,10000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for count in (int(part) for part in args.domains.split(",")):
            await one(count, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
