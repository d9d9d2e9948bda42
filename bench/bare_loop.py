"""The ceiling for `bench/speed.py`: a bare asyncio fetch loop in one process.

    .venv/bin/python bench/bare_loop.py URLS_FILE [--concurrency 16]

What a user's single script does when written well: `--concurrency` workers share one httpx
client, fetch every URL once (no retries, no limits, nothing durable), extract the same
fields as the benchmark's spec with parsel, and keep the items in memory. It prints one JSON
line: pages fetched, pages that failed, seconds, and the CPU seconds of the loop itself
(imports and start-up excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

import httpx
from parsel import Selector

FIELDS = {
    "title": "title::text",
    "h1": "h1::text",
    "price": "span.price::text",
    "description": "p.desc::text",
}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def crawl(urls: list[str], concurrency: int) -> dict[str, float]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for url in urls:
        queue.put_nowait(url)
    items: list[dict[str, object]] = []
    failed = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        while not queue.empty():
            url = queue.get_nowait()
            try:
                response = await client.get(url)
            except httpx.HTTPError:
                failed += 1
                continue
            page = Selector(text=response.text)
            item: dict[str, object] = {name: page.css(expr).get() for name, expr in FIELDS.items()}
            item["links"] = page.css("ul.links a::attr(href)").getall()
            item["url"], item["status"] = url, response.status_code
            items.append(item)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        started, cpu_start = time.monotonic(), cpu()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return {"pages": len(items), "failed": failed, "seconds": time.monotonic() - started, "cpu": cpu() - cpu_start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("urls_file")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with open(args.urls_file) as f:
        urls = [line.strip() for line in f if line.strip()]
    print(json.dumps(asyncio.run(crawl(urls, args.concurrency))))


if __name__ == "__main__":
    main()
