"""Benchmark: `hutch submit` on large URL files — throughput and peak memory by file size.

The submit streams its file in batches (record in the store, publish with confirms in flight
together, mark queued), so its memory should not grow with the file. This runs the real
`hutch submit` as a child process on files of increasing size, against the local broker in a
vhost of its own (created and deleted with rabbitmqctl), with no services running: the tasks
stay in `frontier.unrouted`, and no HTTP request is made at all. It prints, per size, the
wall time, lines per second and the child's peak RSS, each the median of the runs.

    .venv/bin/python bench/submit_bench.py                 # 10k and 100k lines, 3 runs each
    .venv/bin/python bench/submit_bench.py --sizes 10000,1000000 --runs 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def write_urls(path: Path, lines: int) -> None:
    with path.open("w") as handle:
        for i in range(lines):
            # 1,000 made-up domains; nothing is fetched, the names only route the tasks.
            handle.write(f"http://site-{i % 1000}.test/item/{i}\n")


def one_run(urls: Path, vhost: str, data_dir: Path) -> tuple[float, int]:
    env = dict(os.environ)
    env.update(
        HUTCH_AMQP_URL=f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
        HUTCH_NAMESPACE=f"bench-{uuid.uuid4().hex[:6]}",
        HUTCH_DATA_DIR=str(data_dir),
        OTEL_SDK_DISABLED="true",
    )
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [sys.executable, "-c", "from hutch.services.control.cli import main; main()", "submit", str(urls)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"submit failed: {err.read().decode().strip()}")
    return elapsed, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="line counts, comma separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    vhost = f"hutch-bench-{os.getpid()}"
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{'lines':>9} {'median s':>9} {'lines/s':>9} {'peak RSS MiB':>13}")
            for lines in sizes:
                urls = Path(tmp) / f"urls-{lines}.txt"
                write_urls(urls, lines)
                times, peaks = [], []
                for run in range(args.runs):
                    elapsed, peak = one_run(urls, vhost, Path(tmp) / f"data-{lines}-{run}")
                    times.append(elapsed)
                    peaks.append(peak)
                median = statistics.median(times)
                print(f"{lines:>9} {median:>9.2f} {lines / median:>9.0f} {max(peaks) / 1024:>13.1f}", flush=True)
    finally:
        rabbitmqctl("delete_vhost", vhost)


if __name__ == "__main__":
    main()
