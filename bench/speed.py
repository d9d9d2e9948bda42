"""What a user gets per page: Hutch against a bare asyncio loop, on one machine, side by side.

    .venv/bin/python bench/speed.py [--runs 3] [--shapes small,large,limited,polite]
    .venv/bin/python bench/speed.py --shapes memory        # the 100,000-URL memory run

Everything runs on a RabbitMQ node of the benchmark's own (`bench/broker_node.py`), started
here and stopped at the end, so the shared broker's other traffic stays out of the figures.
It runs SCHED_BATCH, as `make broker` starts a local broker (`--broker-sched normal`: the
default policy, as a distribution's own unit starts it), and the services run as they do by
default (`HUTCH_SCHED_POLICY`, SCHED_BATCH).
Each run of each shape gets a fresh vhost, a fresh store and a fresh sandbox (in this
process), and starts the five services as processes (`hutch up`'s supervisor) on default
settings. Only what defines the workload is set: the per-domain rate (the "no limit" shapes
raise it out of the way), the sandbox's addresses, and the number of fetchers.

Shapes (each run `--runs` times; medians printed):

- `small`: 4 domains x 1,000 small pages, 20 ms latency, no limit, 1 fetcher;
- `large`: 4 domains x 530 documentation pages of about 100 KB, 20 ms latency, no limit;
- `limited`: 4 domains x 530 of those pages at 8 requests/s each (burst 1, the default), no
  faults, with 1, 2 and 4 fetchers;
- `limited4`: only the 4-fetcher case of `limited`;
- `polite`: `bench/governor_sites.yaml` (6 domains x 150 pages, 4 requests/s each, with
  hangs, 500s and 429s) on default settings otherwise;
- `bare`: the bare loop (`bench/bare_loop.py`, 16 in flight) on the small and the large pages;
- `memory` (only when asked): 100,000 small pages over 20 domains, no limit; the resident
  memory of every service at 20 % and at 100 % of the job.

Printed for each shape: pages/s (URLs finished, stored or dead, over the time from submit
to the last one finished); the ratio to the sum of the limits; the worst count any domain
received at the site within one second (a sliding window, robots.txt included); the TCP
connections the sites accepted (each record of the access log names its client's port); and the CPU
seconds per 1,000 pages of every process: each service with every process under it (the
parser's extraction workers, whose share is printed beside it), the broker's VM, and the
submitting `hutch submit` process.
The sandbox runs as a process of its own, ahead of the others in the scheduler, and is
not counted; the figures at the site are read from its access log. Where tcpdump can
capture loopback (root), the worst second is counted by the kernel's stamp of each request
(`bench/site_stamps.py`), with the sandbox's own count beside it: a busy sandbox stamps a
request after reading it, up to 130 ms after it arrived. Without a capture the run says so
at its start (Debian: `apt-get install tcpdump`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from broker_node import private_node
from governor_common import bench_vhost, child_env, use_node
from hutch_sandbox.accesslog import AccessRecord
from hutch_sandbox.config import SandboxConfig, SiteConfig, load_config
from hutch_sandbox.runner import wait_for_ready_file
from site_stamps import Capture, kernel_stamps, worst_second

from hutch.service import sched_policy_of
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import Store

ROOT = Path(__file__).resolve().parents[1]
NO_LIMIT = 100_000.0  # requests/s per domain: far above anything the sandbox can serve
SPEC_YAML = """fields:
  title: "css:title::text"
  h1: "css:h1::text"
  price: "css:span.price::text"
  description: "css:p.desc::text"
  links: {css: "ul.links a::attr(href)", many: true}
"""
JOB_LIMIT = 900.0  # seconds a job may take before the run is reported as unfinished (longer ones: 25 pages/s)


@dataclass
class Shape:
    name: str
    sites: list[SiteConfig]
    rate: float | None  # None: no limit
    fetchers: int = 1
    seed: int = 7
    bare: bool = False  # the bare loop instead of Hutch

    @property
    def pages(self) -> int:
        return sum(site.pages for site in self.sites)


@dataclass
class Run:
    pages: int
    finished: int
    stored: int
    seconds: float
    worst_second: int  # by the kernel's stamps where there was a capture, else by the sandbox's
    worst_second_sandbox: int = 0
    captured: bool = False  # the kernel's stamps were there (bench/site_stamps.py)
    cpu: dict[str, float] = field(default_factory=dict)  # process label -> CPU seconds
    workers_cpu: float = 0.0  # of `cpu["parser"]`, the seconds of its extraction workers
    rss: dict[str, tuple[int, int]] = field(default_factory=dict)  # label -> (KiB at 20 %, at 100 %)
    # Where the time went, medians over the sites: submit to a site's robots.txt request and
    # to its first page request; its page requests per second between its first and last;
    # its last request to the job's last URL finished.
    timeline: dict[str, float] = field(default_factory=dict)
    connections: int = 0  # TCP connections the sites accepted (robots.txt's included)

    @property
    def rate(self) -> float:
        return self.finished / self.seconds if self.seconds else 0.0


def sites(count: int, pages: int, page_kb: int = 0, latency: int = 20, prefix: str = "d") -> list[SiteConfig]:
    return [
        SiteConfig(name=f"{prefix}{n}", pages=pages, page_kb=page_kb, latency_ms=(latency, latency))
        for n in range(count)
    ]


def shapes(selected: list[str]) -> list[Shape]:
    polite = load_config(ROOT / "bench" / "governor_sites.yaml")
    table: dict[str, list[Shape]] = {
        "small": [Shape("small pages, no limit", sites(4, 1000), None)],
        "large": [Shape("~100 KB pages, no limit", sites(4, 530, page_kb=100), None)],
        "limited": [
            Shape(f"~100 KB pages, 8/s per domain, {n} fetcher(s)", sites(4, 530, page_kb=100), 8.0, fetchers=n)
            for n in (1, 2, 4)
        ],
        # The 4-fetcher case alone, for looking into the worst second at the site.
        "limited4": [Shape("~100 KB pages, 8/s per domain, 4 fetcher(s)", sites(4, 530, page_kb=100), 8.0, fetchers=4)],
        "polite": [Shape("polite with faults, 4/s, defaults", polite.sites, 4.0, seed=polite.seed)],
        "bare": [
            Shape("bare loop, small pages", sites(4, 1000), None, bare=True),
            Shape("bare loop, ~100 KB pages", sites(4, 530, page_kb=100), None, bare=True),
        ],
        "memory": [Shape("memory: 100,000 small pages, no limit", sites(20, 5000), None)],
    }
    unknown = set(selected) - set(table)
    if unknown:
        raise SystemExit(f"unknown shapes: {', '.join(sorted(unknown))}; known: {', '.join(table)}")
    return [shape for name in selected for shape in table[name]]


def tree_cpu(pid: int, *, under_only: bool = False) -> float:
    """CPU seconds of a process and of every process under it, the reaped ones included (the
    parser's extraction runs in worker processes of its own); `under_only`: of the processes
    under it alone."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}  # a process's own seconds and those of its reaped children
    own: dict[int, float] = {}  # a process's own seconds alone
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        own[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
        times[int(entry)] = own[int(entry)] + (int(fields[13]) + int(fields[14])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    # Under it alone: less its own seconds, keeping those of the children it reaped.
    return total - own.get(pid, 0.0) if under_only else total


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """Run a child to its end: (exit status, its CPU seconds, its output)."""
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return child.returncode, usage.ru_utime + usage.ru_stime, out.read().decode(errors="replace")


def finished_counts(store_path: Path, job: str) -> tuple[int, int, float | None]:
    """(finished, stored, when the last one finished) of the job, read from the store."""
    store = Store(store_path)
    try:
        row = store.db.execute(
            "SELECT SUM(state IN ('stored', 'dead')), SUM(state = 'stored'), "
            "MAX(CASE WHEN state IN ('stored', 'dead') THEN updated_at END) FROM tasks WHERE job = ?",
            (job,),
        ).fetchone()
    finally:
        store.close()
    return int(row[0] or 0), int(row[1] or 0), row[2]


async def run_bare(shape: Shape, box: Sites, work: Path) -> Run:
    urls = work / "urls.txt"
    urls.write_text("\n".join(box.urls()) + "\n")
    argv = [sys.executable, str(ROOT / "bench" / "bare_loop.py"), str(urls), "--concurrency", "16"]
    status, _, output = await asyncio.to_thread(run_measured, argv, dict(os.environ))
    if status != 0:
        raise SystemExit(f"the bare loop failed:\n{output}")
    result = json.loads(output.strip().splitlines()[-1])
    by_sandbox, by_kernel = await asyncio.to_thread(box.worst_seconds)
    return Run(
        pages=shape.pages,
        finished=int(result["pages"]),
        stored=int(result["pages"]),
        seconds=float(result["seconds"]),
        worst_second=by_sandbox if by_kernel is None else by_kernel,
        worst_second_sandbox=by_sandbox,
        captured=by_kernel is not None,
        cpu={"bare loop": float(result["cpu"])},
        connections=box.connections(),
    )


async def run_hutch(
    shape: Shape,
    box: Sites,
    url: str,
    node_pid: int | None,
    work: Path,
    seeds: list[str] | None = None,
    spec_yaml: str = SPEC_YAML,
    expect: int | None = None,
) -> Run:
    """One job on the five services: every page of the sites submitted (or only `seeds`, for
    a crawl whose spec finds the rest), until `expect` URLs (default: the shape's pages) are
    finished."""
    rate = NO_LIMIT if shape.rate is None else shape.rate
    settings = Settings(amqp_url=url, namespace="bench", data_dir=work / "data", rate=rate)
    env = child_env(settings, HUTCH_ALLOWED_TARGETS=",".join(box.allowed_targets()))
    (work / "urls.txt").write_text("\n".join(box.urls() if seeds is None else seeds) + "\n")
    (work / "spec.yaml").write_text(spec_yaml)
    pages = shape.pages if expect is None else expect
    log = (work / "services.log").open("w")
    supervisor = Supervisor(env, fetchers=shape.fetchers, out=log, grace=5.0)
    limit = max(JOB_LIMIT, pages / 25)
    await supervisor.start()
    job = "speed"
    try:
        await supervisor.wait_ready(60)
        pids = {c.label: c.process.pid for c in supervisor.children if c.process is not None}
        if node_pid is not None:
            pids["broker"] = node_pid
        before = {label: tree_cpu(pid) for label, pid in pids.items()}
        workers_before = tree_cpu(pids["parser"], under_only=True) if "parser" in pids else 0.0
        rss_at_20: dict[str, int] = {}
        started = time.time()
        cli = "from hutch.services.control.cli import main; main()"
        submit = [sys.executable, "-c", cli, "submit", str(work / "urls.txt"), "--job", job,
                  "--spec", str(work / "spec.yaml")]
        submitting = asyncio.create_task(asyncio.to_thread(run_measured, submit, env))
        submit_cpu: float | None = None
        finished, stored, last = 0, 0, None
        while time.time() - started < limit:
            await asyncio.sleep(0.25)
            if submitting.done() and submit_cpu is None:
                status, submit_cpu, output = submitting.result()
                if status != 0:
                    raise SystemExit(f"hutch submit failed:\n{output}")
            finished, stored, last = await asyncio.to_thread(finished_counts, settings.store_location, job)
            if not rss_at_20 and finished >= pages // 5:
                rss_at_20 = {label: rss_kib(pid) for label, pid in pids.items() if label != "broker"}
            if finished >= pages and submit_cpu is not None:
                break
        after = {label: tree_cpu(pid) for label, pid in pids.items()}
        workers_after = tree_cpu(pids["parser"], under_only=True) if "parser" in pids else 0.0
        rss = {label: (rss_at_20.get(label, 0), rss_kib(pid)) for label, pid in pids.items() if label != "broker"}
    finally:
        await supervisor.stop()
        log.close()
    if finished < pages:
        print(f"    unfinished after {limit:.0f}s: {finished}/{pages}; see {work}", flush=True)
    cpu = {label: after[label] - before[label] for label in pids}
    cpu["submit"] = submit_cpu or 0.0
    by_sandbox, by_kernel = await asyncio.to_thread(box.worst_seconds)
    seconds = (last or time.time()) - started
    return Run(
        pages=pages,
        finished=finished,
        stored=stored,
        seconds=seconds,
        worst_second=by_sandbox if by_kernel is None else by_kernel,
        worst_second_sandbox=by_sandbox,
        captured=by_kernel is not None,
        cpu=cpu,
        workers_cpu=workers_after - workers_before,
        rss=rss,
        timeline=timeline(box, started, seconds),
        connections=box.connections(),
    )


def timeline(box: Sites, started: float, seconds: float) -> dict[str, float]:
    """Medians over the sites (`Run.timeline`), from the sandbox's record of every request."""
    by_site: dict[str, list[float]] = {}
    robots: dict[str, float] = {}
    for record in box.log:
        if record.kind != "site" or record.site is None:
            continue
        if record.path == "/robots.txt":
            robots.setdefault(record.site, record.ts)
        else:
            by_site.setdefault(record.site, []).append(record.ts)
    spans = [times for times in by_site.values() if len(times) > 1]
    if not spans:
        return {}
    return {
        "robots": statistics.median(t - started for t in robots.values()) if robots else float("nan"),
        "first_request": statistics.median(times[0] - started for times in spans),
        "steady_rate": statistics.median((len(times) - 1) / (times[-1] - times[0]) for times in spans),
        "after_last_request": statistics.median(started + seconds - times[-1] for times in spans),
    }


class Sites:
    """The sandbox as a process of its own, ahead of the services in the scheduler (root only).

    The sites' record of when each request arrived is what the limits are checked against, so
    it must not be kept by a process that also polls the store and reads /proc: when that
    process stalls on a busy machine, requests that arrived apart are stamped together. Here
    the sandbox writes every arrival to its access log as it happens, and the figures are
    read from that file once the run is over.
    """

    def __init__(self, config: SandboxConfig, work: Path) -> None:
        self.config = config
        self.work = work
        self.log_path = work / "access.jsonl"
        self.process: subprocess.Popen[bytes] | None = None
        self.info: dict[str, object] = {}
        self.log: list[AccessRecord] = []
        self.capture: Capture | None = None

    async def __aenter__(self) -> Sites:
        config_path = self.work / "sandbox.yaml"
        config_path.write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        ready = self.work / "sandbox-ready.json"

        def ahead() -> None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, -10)

        argv = [
            sys.executable, "-m", "hutch_sandbox", "--config", str(config_path), "--access-log", str(self.log_path),
            "--ready-file", str(ready), "--urls-out", str(self.work / "site-urls.txt"),
        ]
        self.process = await asyncio.to_thread(
            subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=ahead
        )
        self.info = await asyncio.to_thread(wait_for_ready_file, ready, 60.0)
        if Capture.possible():
            self.capture = Capture(self.work / "get.pcap")
            await asyncio.to_thread(self.capture.start)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.capture is not None:
            self.capture.stop()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            await asyncio.to_thread(self.process.wait, 30)

    def urls(self) -> list[str]:
        return (self.work / "site-urls.txt").read_text().split()

    def allowed_targets(self) -> list[str]:
        return list(self.info["allowed_targets"])  # type: ignore[call-overload]

    def read_log(self) -> None:
        """Every request the sites received so far, from the access log."""
        self.log = [AccessRecord(**json.loads(line)) for line in self.log_path.read_text().splitlines() if line]

    def worst_seconds(self) -> tuple[int, int | None]:
        """The most requests any one site got within one second (sliding), by the sandbox's
        stamps and by the kernel's (None without a capture); stops the capture."""
        self.read_log()
        sandbox: dict[str, list[float]] = {}
        for record in self.log:
            if record.kind == "site":
                sandbox.setdefault(record.host or "", []).append(record.ts)
        by_sandbox = max((worst_second(times) for times in sandbox.values()), default=0)
        if self.capture is None:
            return by_sandbox, None
        self.capture.stop()
        kernel = kernel_stamps(self.capture.path)
        taken: dict[tuple[int, str], int] = {}
        stamped: dict[str, list[float]] = {}
        for record in self.log:
            if record.kind != "site" or record.port is None:
                continue
            key = (record.port, record.path)
            n = taken.get(key, 0)
            if n < len(kernel.get(key, [])):
                stamped.setdefault(record.host or "", []).append(kernel[key][n])
                taken[key] = n + 1
        return by_sandbox, max((worst_second(times) for times in stamped.values()), default=0)

    def connections(self) -> int:
        """The connections the sites accepted, from the access log read last: one a client
        port (a run is too short for the kernel to hand a port out twice)."""
        return len({(r.port, r.client, r.client_port) for r in self.log if r.kind == "site"})


async def run_once(shape: Shape, node_url: str | None, node_pid: int | None, keep: Path) -> Run:
    config = SandboxConfig(host="127.0.0.1", seed=shape.seed, sites=shape.sites)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(tempfile.mkdtemp(dir=keep)) if keep else Path(scratch)
        async with Sites(config, work) as box:
            if shape.bare:
                return await run_bare(shape, box, work)
            assert node_url is not None
            with bench_vhost("speed") as url:
                return await run_hutch(shape, box, url, node_pid, work)


def report(shape: Shape, runs: list[Run]) -> dict[str, object]:
    rates = [r.rate for r in runs]
    labels = sorted({label for r in runs for label in r.cpu}, key=_order)
    per_k = {
        label: statistics.median(r.cpu.get(label, 0.0) / max(r.finished, 1) * 1000 for r in runs) for label in labels
    }
    total_per_k = statistics.median(sum(r.cpu.values()) / max(r.finished, 1) * 1000 for r in runs)
    limit_sum = None if shape.rate is None else shape.rate * len(shape.sites)
    line = f"{shape.name}: {statistics.median(rates):.1f} pages/s (runs: {', '.join(f'{x:.1f}' for x in rates)})"
    print(line)
    print(f"    finished {min(r.finished for r in runs)}-{max(r.finished for r in runs)} of {runs[0].pages}, "
          f"stored {min(r.stored for r in runs)}-{max(r.stored for r in runs)}")
    if limit_sum is not None:
        ratios = [r.rate / limit_sum for r in runs]
        print(f"    ratio to the sum of the limits ({limit_sum:g}/s): {statistics.median(ratios):.3f} "
              f"(runs: {', '.join(f'{x:.3f}' for x in ratios)})")
        print(f"    worst 1-second count at the site, any domain: {worst_text(runs)} "
              f"(rate + burst = {shape.rate + 1:g})")
    else:
        print(f"    worst 1-second count at the site, any domain: {worst_text(runs)}")
    if all(r.timeline for r in runs):
        def middle(key: str) -> float:
            return statistics.median(r.timeline[key] for r in runs)

        steady = middle("steady_rate")
        of_rate = f" ({steady / shape.rate:.3f} of the rate)" if shape.rate else ""
        print(f"    per domain (medians): robots.txt {middle('robots'):.2f} s and first page "
              f"{middle('first_request'):.2f} s after submit; "
              f"{steady:.2f} requests/s from its first to its last{of_rate}; "
              f"last URL finished {middle('after_last_request'):.2f} s after its last request")
    connections = statistics.median(r.connections for r in runs)
    print(f"    connections the sites accepted: {connections:g} (runs: {', '.join(str(r.connections) for r in runs)})")
    workers_per_k = statistics.median(r.workers_cpu / max(r.finished, 1) * 1000 for r in runs)

    def cpu_text(label: str, value: float) -> str:
        own = f" (its extraction workers {workers_per_k:.2f})" if label == "parser" and workers_per_k else ""
        return f"{label} {value:.2f}{own}"

    cpu = ", ".join(cpu_text(label, value) for label, value in per_k.items())
    print(f"    CPU s per 1,000 pages: {total_per_k:.2f} in all ({cpu})")
    if any(r.rss for r in runs):
        last = runs[-1]
        for label, (at20, at100) in sorted(last.rss.items(), key=lambda kv: _order(kv[0])):
            change = (at100 - at20) / at20 * 100 if at20 else float("nan")
            print(f"    RSS {label}: {at20 / 1024:.1f} MiB at 20 %, {at100 / 1024:.1f} MiB at 100 % ({change:+.1f} %)")
    sys.stdout.flush()
    return {
        "shape": shape.name,
        "pages_per_s": statistics.median(rates),
        "runs": rates,
        "cpu_per_1000": per_k,
        "cpu_total_per_1000": total_per_k,
        "parser_workers_cpu_per_1000": workers_per_k,
        "worst_second": max(r.worst_second for r in runs),
        "worst_second_sandbox": max(r.worst_second_sandbox for r in runs),
        "worst_second_by_kernel": all(r.captured for r in runs),
        "timeline": {k: statistics.median(r.timeline[k] for r in runs) for k in runs[0].timeline}
        if all(r.timeline for r in runs) else {},
        "limit_ratio": None if limit_sum is None else statistics.median(r.rate / limit_sum for r in runs),
        "connections": connections,
    }


def worst_text(runs: list[Run]) -> str:
    """The worst second as the site received it: by the kernel's stamp of each request where
    the run was captured, with the sandbox's own stamps beside it (a busy sandbox stamps a
    request up to 100 ms or more after it arrived, enough to make 9 look like 10)."""
    worst = max(r.worst_second for r in runs)
    if not all(r.captured for r in runs):
        return f"{worst} (by the sandbox's stamps)"
    return f"{worst} by the kernel's stamps ({max(r.worst_second_sandbox for r in runs)} by the sandbox's)"


def _order(label: str) -> tuple[int, str]:
    known = ["submit", "governor", "proxy-manager", "parser", "storer", "broker"]
    return (known.index(label) if label in known else (2 if label.startswith("fetcher") else 9), label)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shapes", default="small,large,limited,polite,bare")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep", help="keep each run's folder (logs, store, the sites' access log) under this folder")
    parser.add_argument(
        "--broker-sched", choices=("batch", "normal"), default="batch",
        help="the node's scheduling policy: SCHED_BATCH, as `make broker` starts a local broker (the "
        "default), or the default policy, as a distribution's own unit starts it",
    )
    args = parser.parse_args()
    selected = shapes([s.strip() for s in args.shapes.split(",") if s.strip()])
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    results = []
    needs_node = any(not s.bare for s in selected)
    with private_node(args.broker_sched) if needs_node else contextlib.nullcontext() as node:
        if node is not None:
            use_node(node.url, node.nodename)
            beam = node.beam_pid()
            print(
                f"broker: a node of its own ({node.nodename}, port {node.port}, scheduling "
                f"{sched_policy_of(beam) if beam else 'unknown'}); services scheduling {Settings().sched_policy}",
                flush=True,
            )
        if not Capture.possible():
            print("no loopback capture (it needs root and tcpdump): the worst second at the site is "
                  "counted by the sandbox's stamps alone, which lag on a busy machine", flush=True)
        for shape in selected:
            runs = []
            for n in range(1 if shape.name.startswith("memory") else args.runs):
                main_task = asyncio.ensure_future(
                    run_once(shape, node.url if node else None, node.beam_pid() if node else None, keep)
                )
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({main_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    main_task.cancel()
                    await asyncio.gather(main_task, return_exceptions=True)
                    raise SystemExit("interrupted")
                stopper.cancel()
                run = main_task.result()
                print(f"  {shape.name} run {n + 1}: {run.finished}/{run.pages} in {run.seconds:.1f}s "
                      f"= {run.rate:.1f} pages/s; CPU {sum(run.cpu.values()):.1f}s", flush=True)
                runs.append(run)
            results.append(report(shape, runs))
    if args.json:
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
