"""What the governor benchmarks share: a throw-away vhost, settings, and service processes.

Every benchmark runs in its own RabbitMQ vhost, created with `rabbitmqctl` and deleted at the
end (with every queue in it), and sends HTTP only to the loopback sandbox.

The broker is the machine's shared one unless two variables name another node on this
machine (`bench/broker_node.py start` prints them): `BENCH_AMQP_URL`, its AMQP URL, and
`BENCH_RABBITMQ_NODE`, its node name for `rabbitmqctl -n`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from hutch.amqp import Broker
from hutch.models import Task
from hutch.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
BASE_URL = os.environ.get("BENCH_AMQP_URL") or os.environ.get("HUTCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NODE = os.environ.get("BENCH_RABBITMQ_NODE")  # None: the CLI's default node, the shared broker


def use_node(url: str, nodename: str) -> None:
    """Point every later benchmark call at another node (as the two variables do)."""
    global BASE_URL, NODE
    BASE_URL, NODE = url, nodename


def rabbitmqctl(*args: str, check: bool = True) -> str:
    if shutil.which("rabbitmqctl") is None:
        raise SystemExit("the benchmarks need rabbitmqctl (a local RabbitMQ) for their own vhost")
    node = ["-n", NODE] if NODE else []
    done = subprocess.run(["rabbitmqctl", *node, *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise SystemExit(f"rabbitmqctl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def bench_vhost(name: str) -> Iterator[str]:
    """A vhost of its own for one benchmark; its AMQP URL. Deleted, with its queues, at the end."""
    vhost = f"hutch-bench-{name}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    rabbitmqctl("add_vhost", vhost)
    user = urlsplit(BASE_URL).username or "guest"
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    parts = urlsplit(BASE_URL)
    try:
        yield urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    finally:
        rabbitmqctl("delete_vhost", vhost, check=False)


def broker_fd_room() -> tuple[int, int]:
    """(file descriptors in use, limit) of the local RabbitMQ node."""
    text = rabbitmqctl("status")
    at = text.find("File Descriptors")
    match = re.search(r"Total: (\d+), limit: (\d+)", text[at:]) if at >= 0 else None
    if match:
        return int(match.group(1)), int(match.group(2))
    raise SystemExit("cannot read the broker's file descriptor limit from `rabbitmqctl status`")


FDS_PER_QUEUE = 3  # measured: a classic queue v2 with messages holds 3 open files on 3.10 (v1: 1)


def check_fd_room(queues: int, margin: int = 300) -> None:
    """Refuse to fill more queues than the broker has file descriptors for.

    A classic queue with messages keeps files open (3 for a version 2 queue, which Hutch
    declares; 1 for version 1): on RabbitMQ 3.10 a node that runs out of descriptors (`emfile`)
    does not degrade, it stops, and will not boot again while the queues are still there. So
    the benchmarks check first. The frontier is a fixed number of shard queues whatever the
    number of domains, so callers pass the shard count (plus the queues around them).
    """
    used, limit = broker_fd_room()
    need = FDS_PER_QUEUE * queues + margin
    if used + need > limit:
        raise SystemExit(
            f"the broker has {limit - used} free file descriptors (limit {limit}); {queues} queues with "
            f"backlog need about {FDS_PER_QUEUE} each plus {margin} spare. Raise RabbitMQ's open-files limit "
            "(ulimit -n before rabbitmq-server starts) or run with fewer domains."
        )


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = settings.to_env(os.environ)
    env.setdefault("OTEL_SDK_DISABLED", "true")
    env.update(extra)
    return env


class Process:
    """A service (or any module) as a child process, output to a log file."""

    def __init__(self, label: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.label = label
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{label}.log"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, *self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        return self

    async def wait_ready(self, mark: str = " ready (broker ", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log_path.exists() and mark in self.log_path.read_text(errors="replace"):
                return
            assert self.process is not None
            if self.process.returncode is not None:
                raise RuntimeError(f"{self.label} exited: see {self.log_path}")
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.label} not ready: see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def last_line(self, containing: str) -> str:
        lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if containing in x]
        return lines[-1].split(": ", 1)[-1] if lines else "(nothing logged)"

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


def service(name: str, env: dict[str, str], log_dir: Path, label: str | None = None,
            profile: Path | None = None) -> Process:
    module = f"hutch.services.{name.replace('-', '_')}"
    argv = ["-m", module] if profile is None else ["-m", "cProfile", "-o", str(profile), "-m", module]
    return Process(label or name, argv, env, log_dir)


@contextlib.asynccontextmanager
async def processes(*items: Process) -> AsyncIterator[list[Process]]:
    started: list[Process] = []
    try:
        for item in items:
            started.append(await item.start())
        yield started
    finally:
        for item in reversed(started):
            await item.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, in seconds (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid() -> int | None:
    """The benchmarked node's VM process id (asked of the node: several may run here), or None."""
    text = rabbitmqctl("eval", "os:getpid().", check=False).strip().strip('"')
    return int(text) if text.isdigit() and Path(f"/proc/{text}").exists() else None


def node_memory() -> int:
    """Bytes the benchmarked node's VM has allocated (`erlang:memory(total)`)."""
    text = rabbitmqctl("eval", "erlang:memory(total).").strip()
    if not text.isdigit():
        raise SystemExit(f"cannot read the node's memory: {text!r}")
    return int(text)


def fd_count(pid: int) -> int:
    """File descriptors a process holds open right now (Linux; root or the same user)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def rss_kib(pid: int) -> int:
    """Resident memory of a process in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_tasks(domains: list[str], per_domain: int, job: str = "bench") -> Iterator[Task]:
    """`per_domain` tasks for each domain, round robin: a broad job's order (every domain's
    first page, then every second page, ...)."""
    for k in range(per_domain):
        for name in domains:
            yield Task(id=f"{job}-{name}-{k}", job=job, url=f"http://{name}/page/{k}", domain=name)


async def preload(settings: Settings, tasks: Iterable[Task], batch: int = 2000,
                  progress: Callable[[int], None] | None = None) -> int:
    """Publish tasks into the frontier as the submitter does (confirmed, under the shard key
    of their domain), `batch` confirms in flight at a time; how many were published."""
    broker = await Broker(settings, "bench-preload").connect()
    topology = broker.topology
    sent = 0
    pending: list[Awaitable[None]] = []
    try:
        for task in tasks:
            pending.append(broker.publish(topology.frontier, topology.shard_key(task.domain), task))
            if len(pending) >= batch:
                await asyncio.gather(*pending)
                sent += len(pending)
                pending = []
                if progress is not None:
                    progress(sent)
        await asyncio.gather(*pending)
        sent += len(pending)
    finally:
        await broker.close()
    return sent
