"""Memory per domain: the governor's, and the broker's per domain queue, at 1,000 and 10,000.

    .venv/bin/python bench/governor_memory.py [--domains 1000,10000]

For each count, in a fresh vhost: every domain queue is declared, recorded in the domain
registry and given one task of backlog (the state a large job starts in). Broker side:
the node's total memory (`rabbitmq-diagnostics memory_breakdown`) before and after, and the
sum of the domain queues' own process memory (`rabbitmqctl list_queues memory`), each per
queue; the file descriptors the node holds open too, since a classic queue with messages
keeps one. Governor side: a governor process consumes every domain (no fetcher runs, so it
holds what it may and waits); its resident memory minus that of a governor with no domain,
per domain. Then, with no broker at all, `tracemalloc` measures what the governor's own
state (`Core`: bucket, adaptive rate, queue state, a lease) costs per domain.
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

from governor_common import bench_vhost, broker_fd_room, check_fd_room, child_env, rabbitmqctl, rss_kib, service

from hutch.amqp import Broker, declare_queue
from hutch.domains import routing_key
from hutch.models import DomainRecord, Event, Task
from hutch.services.governor.core import Core, CoreConfig
from hutch.services.governor.limits import DomainLimit, Limits
from hutch.settings import Settings
from hutch.topology import Topology


def node_memory_bytes() -> int:
    text = rabbitmqctl("status")
    match = re.search(r"Total memory used: ([0-9.]+) gb", text)
    if match is None:
        raise SystemExit("cannot read the node's memory from `rabbitmqctl status`")
    return int(float(match.group(1)) * 1024**3)


def breakdown_total_bytes() -> int:
    text = subprocess_text("rabbitmq-diagnostics", "memory_breakdown", "-q", "--unit", "bytes")
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
    broker = await Broker(settings, "bench-fill").connect()
    try:
        topology = broker.topology
        names = [f"m{i:06d}.bench.example" for i in range(domains)]
        channels = [await broker.channel() for _ in range(8)]

        async def declare(part: int) -> None:
            for name in names[part::8]:
                await declare_queue(channels[part], topology.domain_queue(name))

        await asyncio.gather(*(declare(i) for i in range(8)))
        for start in range(0, domains, 2000):
            chunk = names[start : start + 2000]
            await asyncio.gather(*(broker.publish("", topology.domains, DomainRecord(domain=n)) for n in chunk))
            await asyncio.gather(
                *(
                    broker.publish(
                        topology.frontier,
                        routing_key(n),
                        Task(id=f"{n}-0", job="bench", url=f"http://{n}/page/0", domain=n),
                    )
                    for n in chunk
                )
            )
    finally:
        await broker.close()


async def governor_rss(settings: Settings, work: Path, expect: int, label: str) -> int:
    """Resident KiB of a governor once it consumes `expect` domains (steady for a while)."""
    governor = service("governor", child_env(settings), work, label=label)
    await governor.start()
    try:
        await governor.wait_ready()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = governor.last_line("permits/s")
            match = re.search(r"; (\d+) domains", line)
            if match and int(match.group(1)) >= expect:
                break
            await asyncio.sleep(1)
        await asyncio.sleep(5)
        assert governor.process is not None
        return rss_kib(governor.process.pid)
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
        core.created(name)
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
    check_fd_room(count)
    with bench_vhost("memory") as url:
        vhost = url.rsplit("/", 1)[1].replace("%2F", "/")
        settings = Settings(
            amqp_url=url, namespace="bench", data_dir=work / "data", permit_ttl=5.0, respect_robots=False
        )
        # The static topology first, so that the difference is the domain queues alone.
        await (await Broker(settings, "bench-declare").connect()).close()
        baseline = await governor_rss(settings, work, 0, f"governor-0-{count}")
        before_node, before_total, (before_fds, _) = node_memory_bytes(), breakdown_total_bytes(), broker_fd_room()
        started = time.monotonic()
        await fill(settings, count)
        filled = time.monotonic() - started
        await asyncio.sleep(3)
        after_node, after_total, (after_fds, limit) = node_memory_bytes(), breakdown_total_bytes(), broker_fd_room()
        queues, queue_bytes = queue_memory(vhost, Topology("bench").frontier + ".d.")
        print(f"{count} domains with backlog (filled in {filled:.0f}s):", flush=True)
        print(
            f"  broker: node memory +{(after_node - before_node) / 2**20:.1f} MiB "
            f"({(after_node - before_node) / count / 1024:.1f} KiB per domain queue; memory_breakdown total "
            f"+{(after_total - before_total) / count / 1024:.1f} KiB); the {queues} queue processes themselves "
            f"{queue_bytes / max(queues, 1) / 1024:.1f} KiB each; file descriptors {before_fds} -> {after_fds} "
            f"of {limit}",
            flush=True,
        )
        rss = await governor_rss(settings, work, count, f"governor-{count}")
        print(
            f"  governor: resident {rss / 1024:.1f} MiB with {count} domains vs {baseline / 1024:.1f} MiB with none: "
            f"{(rss - baseline) / count:.1f} KiB per domain (its AMQP consumer included)",
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
