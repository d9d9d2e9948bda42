"""The rate governor at the site: 6 domains x 150 URLs, 4 requests/s burst 1 each, faults.

    .venv/bin/python bench/governor_sites.py [--fetchers 1,2,4] [--no-sequential]

For each fetcher count, a fresh sandbox (`bench/governor_sites.yaml`: latency 150 +- 100 ms,
2 % 500s, 0.5 % hangs past the 2 s fetch deadline, 0.5 % 429 with Retry-After: 1), a fresh vhost,
and the governor, N fetcher processes, the parser and the storer run one job of the 900
URLs to the end. Everything is counted at the sandbox by arrival time, robots.txt included:

- worst: most requests one domain received in any sliding 1-second window (limit: rate +
  burst = 5), and the share of windows (one starting at each request) within it;
- utilisation: a domain's requests over `rate x` the time it was not paused (pauses: one
  Retry-After from each 429's arrival) between its first and last request;
- pages/s: URLs finished (stored or dead) per second from submit to the end of the job,
  against 0.85 x the sum of the limits (0.85 x 24 = 20.4).

Then a plain sequential loop (one request at a time, retrying a failure up to 5 times and
sleeping out a 429's Retry-After) fetches the same workload from a fresh sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from governor_common import bench_vhost, child_env
from hutch_sandbox import Sandbox, load_config
from hutch_sandbox.accesslog import AccessRecord

from hutch.amqp import Broker
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import AsyncStore, Store

CONFIG = Path(__file__).resolve().parent / "governor_sites.yaml"
RATE = 4.0
BURST = 1
RETRY_AFTER = 1.0


def bench_settings(url: str, data: Path) -> Settings:
    return Settings(
        amqp_url=url,
        namespace="bench",
        data_dir=data,
        rate=RATE,
        burst=BURST,
        permit_ttl=10.0,
        concurrency=16,
        connect_timeout=2.0,
        read_timeout=2.0,
        total_timeout=2.0,
        retry_delays=(0.5, 1.0, 2.0, 5.0),
        max_attempts=5,
        use_proxy_manager=False,
        shutdown_grace=3.0,
    )


def windows(times: list[float], width: float = 1.0) -> list[int]:
    """Requests in the window [t, t + width) starting at each request's arrival t."""
    counts = []
    j = 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + width:
            j += 1
        counts.append(j - i)
    return counts


def paused_seconds(records: list[AccessRecord], start: float, end: float) -> float:
    """Length of the union of [429 arrival, + Retry-After) within [start, end]."""
    spans = sorted((r.ts, r.ts + RETRY_AFTER) for r in records if r.status == 429)
    total, cursor = 0.0, start
    for a, b in spans:
        a, b = max(a, cursor), min(b, end)
        if b > a:
            total += b - a
            cursor = b
    return total


def analyse(box: Sandbox) -> dict[str, Any]:
    limit = RATE + BURST
    rows = {}
    all_windows: list[int] = []
    for name in box.sites:
        records = sorted(box.site_log(name), key=lambda r: r.ts)
        times = [r.ts for r in records]
        counts = windows(times)
        all_windows += counts
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        unpaused = span - paused_seconds(records, times[0], times[-1])
        rows[name] = {
            "requests": len(times),
            "worst": max(counts),
            "within": sum(c <= limit for c in counts) / len(counts),
            "throttled": sum(r.status == 429 for r in records),
            "utilisation": (len(times) - 1) / (RATE * unpaused) if unpaused > 0 else 0.0,
        }
    return {
        "sites": rows,
        "worst": max(r["worst"] for r in rows.values()),
        "within": sum(c <= limit for c in all_windows) / len(all_windows),
        "utilisation_min": min(r["utilisation"] for r in rows.values()),
        "first": min(min(r.ts for r in box.site_log(n)) for n in box.sites),
        "last": max(max(r.ts for r in box.site_log(n)) for n in box.sites),
    }


async def governed_run(fetchers: int, log_dir: Path) -> dict[str, Any]:
    config = load_config(CONFIG)
    with bench_vhost("sites") as url, tempfile.TemporaryDirectory() as tmp:
        settings = bench_settings(url, Path(tmp) / "data")
        async with Sandbox(config) as box:
            env = child_env(settings, HUTCH_ALLOWED_TARGETS=",".join(box.allowed_targets()))
            log = (log_dir / f"services-{fetchers}.log").open("w")
            supervisor = Supervisor(
                env,
                fetchers=fetchers,
                services=("governor", "fetcher", "parser", "storer"),
                out=log,
                grace=3.0,
            )
            await supervisor.start()
            try:
                await supervisor.wait_ready(60)
                broker = await Broker(settings, "bench-submit").connect()
                store = await AsyncStore(settings.store_location).open()
                started = time.time()
                try:
                    await submit(broker, store, "bench", iter(box.urls()), None)
                finally:
                    await store.close()
                    await broker.close()
                done = None
                while time.time() - started < 600:
                    reader = Store(settings.store_location)
                    try:
                        (done,) = reader.counts("bench")
                    finally:
                        reader.close()
                    if done.total and done.pending == 0:
                        break
                    await asyncio.sleep(0.2)
                ended = time.time()
            finally:
                await supervisor.stop()
                log.close()
            assert done is not None
            result = analyse(box)
            result.update(
                finished=done.stored + done.dead,
                stored=done.stored,
                dead=done.dead,
                seconds=ended - started,
                pages_per_second=(done.stored + done.dead) / (ended - started),
                first_after=result["first"] - started,
                last_before=ended - result["last"],
            )
            return result


async def sequential_run() -> dict[str, Any]:
    config = load_config(CONFIG)
    async with Sandbox(config) as box:
        urls = box.urls()
        stored = 0
        started = time.time()
        async with httpx.AsyncClient(timeout=httpx.Timeout(3.0, connect=2.0)) as client:
            for url in urls:
                for _ in range(5):
                    try:
                        response = await asyncio.wait_for(client.get(url), 3.0)
                    except (TimeoutError, httpx.HTTPError):
                        continue
                    if response.status_code == 200:
                        stored += 1
                        break
                    if response.status_code == 429:
                        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
        ended = time.time()
        result = analyse(box)
        result.update(
            finished=len(urls),
            stored=stored,
            dead=len(urls) - stored,
            seconds=ended - started,
            pages_per_second=len(urls) / (ended - started),
        )
        return result


def show(label: str, result: dict[str, Any]) -> None:
    target = 0.85 * RATE * len(result["sites"])
    print(
        f"{label}: {result['finished']} URLs ({result['stored']} stored, {result['dead']} dead) in "
        f"{result['seconds']:.1f}s = {result['pages_per_second']:.2f} pages/s "
        f"(0.85 x sum of limits = {target:.1f}: {result['pages_per_second'] / target:.2f} of it); "
        f"worst 1s window {result['worst']} (limit {RATE + BURST:g}), "
        f"{100 * result['within']:.2f} % of windows within; "
        f"lowest utilisation while unpaused {result['utilisation_min']:.3f}",
        flush=True,
    )
    if "first_after" in result:
        print(
            f"    first request {result['first_after']:.2f}s after submit, job seen done "
            f"{result['last_before']:.2f}s after the last request",
            flush=True,
        )
    for name, row in result["sites"].items():
        print(
            f"    {name}: {row['requests']} requests, worst window {row['worst']}, "
            f"{100 * row['within']:.1f} % within, {row['throttled']} x 429, utilisation {row['utilisation']:.3f}",
            flush=True,
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetchers", default="1,2,4", help="fetcher process counts, comma separated")
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument("--logs", default=None, help="folder for the services' output (default: temporary)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.logs or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before anything runs)
        print(f"6 domains x 150 URLs, {RATE:g}/s burst {BURST} each, config {CONFIG.name}", flush=True)
        for count in (int(part) for part in args.fetchers.split(",")):
            show(f"governed, {count} fetcher{'s' if count > 1 else ''}", await governed_run(count, log_dir))
        if not args.no_sequential:
            show("plain sequential loop", await sequential_run())


if __name__ == "__main__":
    asyncio.run(main())
