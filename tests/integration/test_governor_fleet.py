"""The governor with real fetcher processes, a real RabbitMQ and the sandbox's real HTTP.

Counted at the site, by arrival time: what the limit is for.

The helpers here (a sandbox, services as processes, window counts) serve the governor's
e2e tests too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hutch_sandbox import Sandbox, SandboxConfig
from hutch_sandbox.accesslog import AccessRecord

from hutch.amqp import Broker
from hutch.models import Task, task_id
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings

from ..conftest import service_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
SKEWED_CLOCK = Path(__file__).resolve().parents[1] / "skewed_clock"  # a sitecustomize that moves time.time


@asynccontextmanager
async def sandbox(sites: list[dict[str, Any]]) -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig.model_validate({"sites": sites})) as box:
        yield box


@asynccontextmanager
async def running(
    settings: Settings,
    box: Sandbox,
    services: tuple[str, ...] = ("governor", "fetcher"),
    fetchers: int = 1,
    **extra: str,
) -> AsyncIterator[Supervisor]:
    env = service_env(
        settings,
        HUTCH_ALLOWED_TARGETS=",".join(box.allowed_targets()),
        HUTCH_USE_PROXY_MANAGER="false",
        **extra,
    )
    supervisor = Supervisor(env, fetchers=fetchers, services=services, grace=settings.shutdown_grace, out=None)
    await supervisor.start()
    try:
        await supervisor.wait_ready(timeout=60)
        yield supervisor
    finally:
        await supervisor.stop()


async def publish_tasks(settings: Settings, job: str, urls: Sequence[str], domain: str) -> None:
    broker = await Broker(settings, "test-submit").connect()
    try:
        topology = broker.topology
        await asyncio.gather(
            *(
                broker.publish(
                    topology.frontier,
                    topology.shard_key(domain),
                    Task(id=task_id(job, url), job=job, url=url, domain=domain),
                )
                for url in urls
            )
        )
    finally:
        await broker.close()


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        await asyncio.sleep(0.2)


def worst_window(records: Sequence[AccessRecord], width: float = 1.0) -> int:
    """The most requests that arrived within any `width`-second window (sliding)."""
    times = sorted(r.ts for r in records)
    worst = 0
    j = 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + width:
            j += 1
        worst = max(worst, j - i)
    return worst


def pages(box: Sandbox, site: str) -> list:  # type: ignore[type-arg]
    return [r for r in box.site_log(site) if r.path.startswith("/page/")]


async def test_two_fetchers_on_one_domain_stay_within_rate_plus_burst_plus_one_in_every_second(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"rate": 4.0, "burst": 1})
    async with sandbox([{"name": "one", "pages": 48, "latency_ms": [50, 250]}]) as box:
        site = box.sites["one"]
        async with running(settings, box, fetchers=2):
            await publish_tasks(settings, "rate", site.urls(), site.domain)
            await wait_until(lambda: len(pages(box, "one")) >= 48, 60, "every page fetched")
        records = box.site_log("one")  # robots.txt included: it takes a permit too
        assert any(r.path == "/robots.txt" for r in records)
        assert worst_window(records) <= 4 + 1 + 1
        clients = {r.client for r in records}
        assert clients  # both fetchers fetch directly, from 127.0.0.1
        span = max(r.ts for r in records) - min(r.ts for r in records)
        assert span >= (len(records) - 2) / 4.0  # never faster than the rate on average


async def test_a_429_pauses_the_domain_for_every_fetcher_for_its_retry_after(settings: Settings) -> None:
    settings = settings.model_copy(update={"rate": 10.0, "burst": 1, "max_hold": 1.0})
    async with sandbox([{"name": "one", "pages": 60, "latency_ms": [10, 30]}]) as box:
        site = box.sites["one"]
        urls = site.urls()
        throttling = site.base_url + "/flaky/pause?fail=1&code=429&retry_after=3"
        async with running(settings, box, fetchers=2):
            await publish_tasks(settings, "pause", [*urls[:10], throttling, *urls[10:]], site.domain)
            await wait_until(lambda: len(pages(box, "one")) >= 60, 90, "every page fetched")
        records = box.site_log("one")
        (throttled,) = [r for r in records if r.path.startswith("/flaky/") and r.status == 429]
        # Permits released before the 429's outcome reached the governor may still land just
        # after it; from then on no fetcher sends anything until Retry-After has passed.
        during = [r for r in records if throttled.ts + 0.5 <= r.ts < throttled.ts + 2.9]
        assert during == []
        after = [r for r in records if throttled.ts + 2.9 <= r.ts < throttled.ts + 5.0]
        assert after, "the domain resumed after its pause"


async def test_fetchers_whose_clocks_are_50_ms_either_side_of_the_governors_keep_rate_plus_burst_at_the_site(
    settings: Settings,
) -> None:
    # Permits are issued ahead with the moment their token is due (HUTCH_PERMIT_LEAD), on
    # the governor's clock; each fetcher holds its permits until then, read on its own clock
    # against the quickest transit it has seen, so the two clocks' offsets cancel out.
    settings = settings.model_copy(update={"rate": 8.0, "burst": 1})
    skewed = str(SKEWED_CLOCK)
    path = os.pathsep.join(p for p in (skewed, os.environ.get("PYTHONPATH", "")) if p)
    async with sandbox([{"name": "one", "pages": 96, "latency_ms": [20, 80]}]) as box:
        site = box.sites["one"]
        async with (
            running(settings, box, services=("governor",)),
            running(settings, box, services=("fetcher",), PYTHONPATH=path, SKEWED_CLOCK_SECONDS="0.05"),
            running(settings, box, services=("fetcher",), PYTHONPATH=path, SKEWED_CLOCK_SECONDS="-0.05"),
        ):
            await publish_tasks(settings, "skew", site.urls(), site.domain)
            await wait_until(lambda: len(pages(box, "one")) >= 96, 90, "every page fetched")
        records = box.site_log("one")
        assert any(r.path == "/robots.txt" for r in records)
        assert worst_window(records) <= 8 + 1
        span = max(r.ts for r in records) - min(r.ts for r in records)
        assert span >= (len(records) - 2) / 8.0
