"""Two jobs on one domain: a small job started behind a large one finishes first, and the
domain's limit holds for both together.

    .venv/bin/python bench/frontier_two_jobs.py [--large 1000] [--small 100] [--rate 20]
        [--small-after 100] [--limit 300]

In a fresh vhost: the large job's tasks, all on one domain, go into the frontier; a governor
and the stand-in fetcher (`governor_standin.py`, logging every task it takes) start; once the
stand-in has taken `--small-after` of the large job's tasks, the small job's go in. The
domain runs at `--rate` requests/s, burst 1; robots.txt off (nothing serves one); every
other setting at its default. Printed: when each job finished (seconds after the small one
was submitted, and after the start), and the most tasks of the domain in any 1-second window
(sliding: one starts at each task), by the time the stand-in took them and by their permit's
issue time, against rate + burst. Bounded by `--limit` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from governor_common import Process, bench_tasks, bench_vhost, child_env, preload, service

from hutch.settings import Settings

HERE = Path(__file__).resolve().parent
DOMAIN = "shared.bench.example"


def worst_window(times: list[float], width: float = 1.0) -> int:
    """The most events in any half-open window [t, t + width) that starts at an event."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + width) - i for i, t in enumerate(times)), default=0)


def per_second(times: list[float], start: float) -> dict[int, int]:
    counts: dict[int, int] = {}
    for t in times:
        counts[int(t - start)] = counts.get(int(t - start), 0) + 1
    return counts


def read_log(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def main(args: argparse.Namespace) -> None:
    with bench_vhost("twojobs") as url, tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        settings = Settings(
            amqp_url=url, namespace="bench", data_dir=work / "data", rate=args.rate, burst=1, respect_robots=False
        )
        await preload(settings, bench_tasks([DOMAIN], args.large, job="large"))
        task_log, counts = work / "tasks.jsonl", work / "counts.jsonl"
        env = child_env(settings, BENCH_COUNTS=str(counts), BENCH_TASK_LOG=str(task_log))
        standin = Process("standin", [str(HERE / "governor_standin.py")], env, work)
        governor = service("governor", env, work)
        await standin.start()
        await standin.wait_ready()
        started = time.time()
        await governor.start()
        small_at: float | None = None
        finished: dict[str, float] = {}
        try:
            deadline = time.monotonic() + args.limit
            while time.monotonic() < deadline and len(finished) < 2:
                await asyncio.sleep(0.2)
                rows = read_log(task_log)
                taken = {"large": 0, "small": 0}
                for row in rows:
                    job = str(row["job"])
                    taken[job] += 1
                    wanted = args.large if job == "large" else args.small
                    if taken[job] == wanted and job not in finished:
                        finished[job] = float(str(row["t"]))
                if small_at is None and taken["large"] >= args.small_after:
                    small_at = time.time()
                    await preload(settings, bench_tasks([DOMAIN], args.small, job="small"))
                    print(f"small job submitted {small_at - started:.1f}s after the start, "
                          f"the large one at {taken['large']} taken", flush=True)
        finally:
            await governor.stop(timeout=60)
            await standin.stop()
        rows = read_log(task_log)
    took = [float(str(r["t"])) for r in rows]
    issued = [float(str(r["issued"])) for r in rows if r.get("issued") is not None]
    limit = int(args.rate) + 1
    print(f"one domain at {args.rate:g}/s burst 1 (rate + burst = {limit}); large {args.large} tasks, "
          f"small {args.small} submitted after {args.small_after} of the large were taken")
    for job in ("small", "large"):
        if job in finished:
            since = f"{finished[job] - small_at:.1f}s after the small job's submit, " if small_at else ""
            print(f"  {job}: finished {since}{finished[job] - started:.1f}s after the start")
        else:
            print(f"  {job}: not finished within {args.limit:.0f}s")
    order = sorted(finished, key=lambda j: finished[j])
    print(f"  finished first: {order[0] if order else 'neither'}")
    print(f"  tasks taken: {len(rows)} ({sum(1 for r in rows if r['job'] == 'large')} large, "
          f"{sum(1 for r in rows if r['job'] == 'small')} small)")
    print(f"  worst 1-second window, both jobs: {worst_window(took)} by the stand-in's take, "
          f"{worst_window(issued)} by permit issue (limit {limit})")
    if small_at is not None:
        small_rows = [r for r in rows if float(str(r["t"])) >= small_at]
        both_end = finished.get("small", small_at)
        shared = [r for r in small_rows if float(str(r["t"])) <= both_end]
        mine = sum(1 for r in shared if r["job"] == "small")
        share = mine / max(len(shared), 1)
        print(f"  while both ran: {len(shared)} tasks, {mine} of them the small job's ({share:.0%})")
    seconds = per_second(issued, started)
    print("  permits issued per second since the start: " + " ".join(str(seconds.get(s, 0)) for s in
          range(max(seconds, default=-1) + 1)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--small-after", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds before giving up")
    parser.add_argument("--keep", help="folder for the processes' logs (default: a temporary one)")
    asyncio.run(main(parser.parse_args()))
