"""Benchmark: what extraction in worker processes costs per page, against extraction in a thread.

The parser runs extraction in killable worker processes (services/parser/pool.py) so that a
time limit per page can be enforced. The price is a pipe round trip per page: the page goes
to the worker as JSON and the item comes back as JSON. This measures it on realistic pages
(a synthetic shop listing of ~100 KB with real markup: nav, 140 product cards, footer) and a
spec of five fields, two of them lists, and prints side by side, each the median of the runs:

- time per page: pages extracted one after the other (the latency one page sees);
- pages/s: all pages with `--workers` in flight at once (the throughput of the pool).

`thread` is the parser as it was (a ThreadPoolExecutor running `extract`); `process` is the
ParsePool with its default limits. No broker, no network.

    .venv/bin/python bench/parse_workers.py                      # 200 pages, 2 workers, 3 runs
    .venv/bin/python bench/parse_workers.py --pages 500 --workers 2 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hutch.models import FieldRule, Spec
from hutch.services.parser.extract import extract
from hutch.services.parser.pool import Limits, ParsePool

SPEC = Spec(
    fields={
        "title": FieldRule(kind="css", expr="title::text"),
        "h1": FieldRule(kind="xpath", expr="//h1/text()"),
        "prices": FieldRule(kind="css", expr="span.price::text", many=True),
        "links": FieldRule(kind="css", expr="a::attr(href)", many=True),
        "description": FieldRule(kind="css", expr="p.desc::text"),
    }
)
LIMITS = Limits(timeout=10.0, max_item_bytes=1024 * 1024, memory_bytes=512 * 1024 * 1024)


def make_page(n: int, cards: int = 140) -> str:
    nav = "".join(f'<li class="nav-item"><a href="/category/{c}">Category {c}</a></li>' for c in range(30))
    body = []
    for i in range(cards):
        sku = n * 1000 + i
        body.append(
            f'<article class="product card" data-sku="{sku}" itemscope itemtype="https://schema.org/Product">'
            f'<a class="thumb" href="/product/{sku}"><img src="/img/{sku}.jpg" alt="Product {sku}" '
            f'width="240" height="240" loading="lazy"></a>'
            f'<h2 class="name" itemprop="name"><a href="/product/{sku}">Handmade teapot no. {sku}</a></h2>'
            f'<p class="desc" itemprop="description">Stoneware teapot, {i % 7 + 1} cups, glazed by hand; '
            f"each one differs a little from the picture. Ships in {i % 5 + 2} days.</p>"
            f'<div class="offer" itemprop="offers"><span class="price">{10 + i % 90}.{i % 100:02d} EUR</span>'
            f'<button class="add" data-sku="{sku}" type="button">Add to basket</button></div>'
            f'<ul class="tags"><li><a href="/tag/ceramic">ceramic</a></li><li><a href="/tag/tea">tea</a></li></ul>'
            "</article>"
        )
    footer = "".join(f'<a href="/help/{h}">Help topic {h}</a> ' for h in range(20))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Teapots, page {n} | The Quiet Shop</title>"
        "<link rel='stylesheet' href='/static/site.css'></head><body>"
        f"<header><nav><ul>{nav}</ul></nav></header><main><h1>Teapots, page {n}</h1>"
        f"<section class='grid'>{''.join(body)}</section></main><footer>{footer}</footer></body></html>"
    )


Extractor = Callable[[str], Awaitable[dict[str, Any]]]


async def one_run(run: Extractor, pages: list[str], workers: int) -> tuple[float, float]:
    """(median seconds per page one at a time, pages per second with `workers` in flight)."""
    times = []
    for page in pages:
        start = time.perf_counter()
        await run(page)
        times.append(time.perf_counter() - start)
    gate = asyncio.Semaphore(workers)

    async def gated(page: str) -> None:
        async with gate:
            await run(page)

    start = time.perf_counter()
    await asyncio.gather(*(gated(page) for page in pages))
    return statistics.median(times), len(pages) / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pages = [make_page(n) for n in range(args.pages)]
    sizes = sorted(len(p.encode()) for p in pages)
    median_kib = sizes[len(sizes) // 2] / 1024
    print(f"{args.pages} pages, median {median_kib:.0f} KiB; {args.workers} workers; {args.runs} runs")

    loop = asyncio.get_running_loop()
    threads = ThreadPoolExecutor(max_workers=args.workers)
    url = "http://shop.test/teapots"

    async def in_thread(page: str) -> dict[str, Any]:
        return await loop.run_in_executor(threads, extract, page, url, 200, SPEC)

    pool = ParsePool(args.workers, LIMITS)
    await pool.start()

    async def in_process(page: str) -> dict[str, Any]:
        return await pool.extract(page, url, 200, SPEC)

    # Same answer both ways, and a warm-up for each.
    assert await in_thread(pages[0]) == await in_process(pages[0])
    results: dict[str, list[tuple[float, float]]] = {"thread": [], "process": []}
    try:
        for _ in range(args.runs):  # alternate, so machine noise falls on both alike
            results["thread"].append(await one_run(in_thread, pages, args.workers))
            results["process"].append(await one_run(in_process, pages, args.workers))
    finally:
        await pool.close()
        threads.shutdown()
    print(f"{'mode':<8} {'ms/page':>9} {'pages/s':>9}   runs (ms/page; pages/s)")
    for mode, runs in results.items():
        per_page = statistics.median(r[0] for r in runs) * 1000
        rate = statistics.median(r[1] for r in runs)
        detail = ", ".join(f"{r[0] * 1000:.2f}; {r[1]:.0f}" for r in runs)
        print(f"{mode:<8} {per_page:>9.2f} {rate:>9.0f}   {detail}")
    thread_ms = statistics.median(r[0] for r in results["thread"]) * 1000
    process_ms = statistics.median(r[0] for r in results["process"]) * 1000
    print(f"worker processes cost {process_ms - thread_ms:+.2f} ms per page ({process_ms / thread_ms - 1:+.0%})")


if __name__ == "__main__":
    asyncio.run(main())
