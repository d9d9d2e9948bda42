"""Making sure a RabbitMQ broker is reachable before a demo or a test run.

`plan` decides, from what this machine has, what to do: use a reachable broker; else start
a local `rabbitmq-server` if one is installed; else `docker compose up -d rabbitmq` where a
Docker engine runs; else, on Debian as root, install `rabbitmq-server` and start it; else
say exactly what to do. `ensure` carries the plan out. `python -m
hutch.services.control.broker` is what `make demo` and `make test` call.

A broker started here shares this machine's cores with the services, so it starts under
SCHED_BATCH where `chrt` is installed, as the services run (`HUTCH_SCHED_POLICY`): woken by
a frame, it no longer takes the CPU from the service writing it, and it reads what has
gathered when that one blocks. On small pages that was about a third less of the broker's
CPU a page (docs/benchmarks.md, twenty-second round).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hutch.settings import Settings, redact_url


@dataclass(frozen=True)
class Machine:
    reachable: bool
    local_url: bool
    has_server: bool
    has_docker_engine: bool
    debian_root: bool
    has_chrt: bool = False  # util-linux's chrt, to start a local broker under SCHED_BATCH


@dataclass(frozen=True)
class Plan:
    action: str  # use | start-local | docker | install | manual
    commands: tuple[tuple[str, ...], ...] = ()
    message: str = ""


def plan(machine: Machine, url: str) -> Plan:
    safe = redact_url(url)
    start: tuple[str, ...] = ("rabbitmq-server", "-detached")
    if machine.has_chrt:
        start = ("chrt", "--batch", "0", *start)
    if machine.reachable:
        return Plan("use", message=f"RabbitMQ is reachable at {safe}")
    if not machine.local_url:
        return Plan(
            "manual",
            message=f"RabbitMQ at {safe} does not answer; it is not on this machine, so start it "
            "there or point HUTCH_AMQP_URL at a running broker",
        )
    if machine.has_server:
        return Plan("start-local", (start,), "starting the local rabbitmq-server")
    if machine.has_docker_engine:
        return Plan(
            "docker",
            (("docker", "compose", "up", "-d", "rabbitmq"),),
            "starting RabbitMQ with docker compose",
        )
    if machine.debian_root:
        return Plan(
            "install",
            (
                ("apt-get", "update"),
                ("apt-get", "install", "-y", "rabbitmq-server"),
                start,
            ),
            "installing rabbitmq-server with apt-get (Debian, running as root) and starting it",
        )
    return Plan(
        "manual",
        message="no RabbitMQ reachable and none can be started here: install RabbitMQ "
        "(https://www.rabbitmq.com/docs/download) or run `docker compose up -d rabbitmq`, "
        "or set HUTCH_AMQP_URL to a running broker",
    )


def reachable(url: str, timeout: float = 2.0) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=timeout):
            return True
    except OSError:
        return False


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def inspect(url: str) -> Machine:
    host = urlsplit(url).hostname or "127.0.0.1"
    return Machine(
        reachable=reachable(url),
        local_url=host in ("127.0.0.1", "localhost", "::1"),
        has_server=shutil.which("rabbitmq-server") is not None,
        has_docker_engine=_docker_engine(),
        debian_root=Path("/etc/debian_version").exists() and hasattr(os, "geteuid") and os.geteuid() == 0,
        has_chrt=shutil.which("chrt") is not None,
    )


def ensure(url: str, wait: float = 90.0) -> Plan:
    chosen = plan(inspect(url), url)
    print(f"broker: {chosen.message}", file=sys.stderr)
    if chosen.action == "manual":
        raise SystemExit(f"broker: {chosen.message}")
    for command in chosen.commands:
        print(f"broker: $ {' '.join(command)}", file=sys.stderr)
        subprocess.run(command, check=False, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + wait
    while not reachable(url):
        if time.monotonic() > deadline:
            raise SystemExit(f"broker: RabbitMQ at {redact_url(url)} did not come up within {wait:.0f}s")
        time.sleep(1)
    if chosen.action != "use":
        print(f"broker: RabbitMQ is up at {redact_url(url)}", file=sys.stderr)
    return chosen


if __name__ == "__main__":
    ensure(Settings().amqp_urls[0])
