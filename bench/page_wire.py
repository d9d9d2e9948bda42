"""What compressing page bodies on the wire costs and saves, the broker's VM included.

    .venv/bin/python bench/page_wire.py [--pages 1000] [--rounds 3] [--above 0,16384] [--backlog]

One process publishes documentation pages of about 100 KB (the sandbox's, as `Page` messages:
persistent, confirmed, through `Broker.publish`) to the parse queue and consumes them through
`Broker.consume`, as the fetcher and the parser do, on a RabbitMQ node of the benchmark's own.
With `--backlog` the consumer starts only once every page waits in the queue (a parser behind
the fetchers: the broker keeps the bodies on disk); without, it takes them as they come.
Each round runs every `--above` setting (HUTCH_COMPRESS_ABOVE; 0 is uncompressed) one after the
other, in a fresh vhost each, so that the settings meet the same load on a shared machine;
medians of the rounds are printed: CPU milliseconds per page of this process (compress and
inflate, publish and consume) and of the broker's VM, and their sum.

`bench/speed.py --shapes large` shows the same on the whole pipeline, where the rest of the
work (governor, events, store) hides most of the difference in noise.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_node import private_node
from governor_common import bench_vhost, broker_pid, cpu_seconds, use_node
from hutch_sandbox.pages import render_page

from hutch.amqp import Broker, Delivery
from hutch.models import Page, Task, task_id
from hutch.settings import Settings

IN_FLIGHT = 16  # publishes awaiting their confirm at once, as a fetcher's concurrency
WAIT = 300.0  # seconds one round may take


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pages(count: int) -> list[Page]:
    made = []
    for i in range(count):
        url = f"http://docs.test/page/{i}"
        task = Task(id=task_id("bench", url), job="bench", url=url, domain="docs.test")
        text = render_page("docs.test", i % 50, 100)
        made.append(Page(task=task, status=200, final_url=url, text=text, fetched_at=time.time()))
    return made


async def one_run(url: str, above: int, batch: list[Page], vm: int, backlog: bool) -> tuple[float, float]:
    """(this process's, the broker's) CPU seconds to send `batch` through the parse queue."""
    broker = await Broker(Settings(amqp_url=url, compress_above=above), "page-wire").connect()
    received = 0
    done = asyncio.Event()

    async def handler(_: Page, __: Delivery) -> None:
        nonlocal received
        received += 1
        if received == len(batch):
            done.set()

    async def consume() -> None:
        await broker.consume(broker.topology.parse, Page, handler, stage="parse", prefetch=IN_FLIGHT)

    try:
        mine, theirs = own_cpu(), cpu_seconds(vm)
        if not backlog:
            await consume()
        for start in range(0, len(batch), IN_FLIGHT):
            chunk = batch[start : start + IN_FLIGHT]
            await asyncio.gather(*(broker.publish(broker.topology.work, "parse", page) for page in chunk))
        if backlog:
            await consume()
        await asyncio.wait_for(done.wait(), WAIT)
        return own_cpu() - mine, cpu_seconds(vm) - theirs
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--above", default="0,16384", help="HUTCH_COMPRESS_ABOVE values, comma-separated")
    parser.add_argument("--backlog", action="store_true", help="consume only once every page is queued")
    args = parser.parse_args()
    settings = [int(value) for value in args.above.split(",")]
    batch = pages(args.pages)
    figures: dict[int, list[tuple[float, float]]] = {above: [] for above in settings}
    with private_node() as node:
        use_node(node.url, node.nodename)
        vm = broker_pid()
        assert vm is not None, "the benchmark node's VM is not visible"
        for round_ in range(args.rounds):
            for above in settings:
                with bench_vhost("page-wire") as url:
                    mine, theirs = asyncio.run(one_run(url, above, batch, vm, args.backlog))
                figures[above].append((mine, theirs))
                print(f"round {round_ + 1}, above={above}: client {mine:.2f}s, broker {theirs:.2f}s", flush=True)
    per_page = 1000.0 / args.pages
    how = "queued first" if args.backlog else "consumed as they come"
    print(f"{args.pages} pages of ~100 KB per run ({how}), {args.rounds} rounds; CPU ms per page (median):")
    for above, runs in figures.items():
        client = statistics.median(mine for mine, _ in runs) * per_page
        broker = statistics.median(theirs for _, theirs in runs) * per_page
        sums = statistics.median((mine + theirs) for mine, theirs in runs) * per_page
        print(f"  HUTCH_COMPRESS_ABOVE={above}: client {client:.2f}, broker {broker:.2f}, sum {sums:.2f}")


if __name__ == "__main__":
    main()
