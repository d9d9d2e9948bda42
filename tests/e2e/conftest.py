"""End-to-end fixtures: the sandbox in this process, the five services as child processes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from hutch_sandbox import Sandbox, load_config

from hutch.amqp import Broker
from hutch.models import Spec
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import AsyncStore, JobCounts, Store

from ..conftest import service_env

HERE = Path(__file__).parent
QUICK_BACKOFF = 0.5  # seconds before the supervisor starts again a service that died young


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox.yaml")) as box:
        yield box


async def submit_urls(settings: Settings, job: str, urls: list[str], spec: Spec | None = None) -> None:
    """Submit `urls` as job `job`, the way `hutch submit` does (recorded, then published)."""
    broker = await Broker(settings, "test-control").connect()
    store = await AsyncStore(settings.store_location).open()
    try:
        await submit(broker, store, job, iter(urls), spec)
    finally:
        await store.close()
        await broker.close()


class Services:
    """The five services for one test, with the store they write to."""

    def __init__(self, settings: Settings, supervisor: Supervisor) -> None:
        self.settings = settings
        self.supervisor = supervisor

    def counts(self, job: str) -> JobCounts:
        store = Store(self.settings.store_location)
        try:
            found = store.counts(job)
        finally:
            store.close()
        return found[0] if found else JobCounts(job, 0, 0, 0, 0, 0)

    async def wait_for(self, job: str, predicate, timeout: float) -> JobCounts:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            counts = self.counts(job)
            if predicate(counts):
                return counts
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} not there after {timeout:.0f}s: {counts}{self.unfinished(job)}")
            await asyncio.sleep(0.25)

    def unfinished(self, job: str, most: int = 5) -> str:
        """The life so far of a few tasks neither stored nor dead, for a failure's message."""
        store = Store(self.settings.store_location)
        try:
            ids = [row["id"] for row in store.tasks(job) if row["state"] not in ("stored", "dead")]
            lives = [store.timeline(task_id) for task_id in ids[:most]]
        finally:
            store.close()
        return "".join(f"\n  {life}" for life in lives)

    async def wait_done(self, job: str, timeout: float = 120.0) -> JobCounts:
        return await self.wait_for(job, lambda c: c.total > 0 and c.pending == 0, timeout)


async def drop_connections(settings: Settings, reason: str) -> None:
    """Have the broker close every connection to the test's vhost (`rabbitmqctl`)."""
    vhost = unquote(urlsplit(settings.amqp_url).path[1:]) or "/"
    dropping = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "close_all_connections", "--vhost", vhost, reason,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await asyncio.wait_for(dropping.wait(), 60) == 0


@pytest.fixture
def extra_env() -> dict[str, str]:
    """Variables added to the services' environment; a test module may override this."""
    return {}


@contextlib.asynccontextmanager
async def running_services(settings: Settings, sandbox: Sandbox, extra_env: dict[str, str]) -> AsyncIterator[Services]:
    """The five services (one fetcher) on these settings, let through to the sandbox's sites."""
    env = service_env(settings, **{"HUTCH_ALLOWED_TARGETS": ",".join(sandbox.allowed_targets()), **extra_env})
    # A service a test kills within 5 s of its start is one the supervisor takes for failing at
    # start: it would wait 2 s (`hutch up`'s backoff) before starting it again.
    supervisor = Supervisor(env, fetchers=1, grace=settings.shutdown_grace, quick_backoff=QUICK_BACKOFF)
    await supervisor.start()
    try:
        await supervisor.wait_ready(timeout=60)
        yield Services(settings, supervisor)
    finally:
        await supervisor.stop()


@pytest.fixture
async def services(settings: Settings, sandbox: Sandbox, extra_env: dict[str, str]) -> AsyncIterator[Services]:
    async with running_services(settings, sandbox, extra_env) as running:
        yield running


METRICS_SERVICES = ("governor", "proxy-manager", "parser", "storer", "fetcher")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def metrics_ports() -> dict[str, int]:
    """A free metrics port for each service (one fetcher), for a test that reads them."""
    return {name: free_port() for name in METRICS_SERVICES}


def on_ports(settings: Settings, ports: dict[str, int], **update: object) -> Settings:
    """`settings` with each service's metrics on its port of `ports`."""
    ported = {f"{name.replace('-', '_')}_metrics_port": port for name, port in ports.items()}
    return settings.model_copy(update={**ported, **update})
