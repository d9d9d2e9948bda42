"""Pausing, resuming and cancelling jobs through the five services, a real RabbitMQ and HTTP.

What a user relies on: a paused job fetches nothing while another job on the same sites goes
on, and it waits without holding a message (its tasks sit in `frontier.paused`); a resumed
job completes; a cancelled job's tasks end dead as `cancelled` and are never fetched, and a
job cancelled midway ends with every task stored or cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox, load_config

from hutch.amqp import Broker, queue_depth
from hutch.models import FieldRule, JobControl, Spec
from hutch.services.control.jobs import append_control
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HERE = Path(__file__).parent
SPEC = Spec(fields={"title": FieldRule(kind="css", expr="title::text")})


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox-clean.yaml")) as box:
        yield box


@pytest.fixture
def extra_env() -> dict[str, str]:
    return {"HUTCH_RATE": "5"}  # each site at 5/s: a job of 80 pages takes several seconds


async def control(settings: Settings, job: str, action: str) -> None:
    broker = await Broker(settings, "test-control").connect()
    try:
        await append_control(broker, JobControl(job=job, action=action))  # type: ignore[arg-type]
    finally:
        await broker.close()
    await asyncio.sleep(0.5)  # the governor follows the stream live; give it a moment


async def paused_depth(settings: Settings) -> int:
    broker = await Broker(settings, "test-depth").connect(declare=False)
    try:
        depth = await queue_depth(await broker.channel(), broker.topology.paused)
    finally:
        await broker.close()
    assert depth is not None
    return depth[0]


def pages(sandbox: Sandbox, first: int, last: int) -> list[str]:
    """Pages first..last-1 of every site."""
    return [f"{site.base_url}/page/{i}" for site in sandbox.sites.values() for i in range(first, last)]


def fetched(sandbox: Sandbox, urls: list[str]) -> list[str]:
    wanted = {(urlsplit(u).port, urlsplit(u).path) for u in urls}
    return [r.path for r in sandbox.log if (r.port, r.path) in wanted]


def states(settings: Settings, job: str) -> dict[str, str]:
    store = Store(settings.store_location)
    try:
        return {t["url"]: t["state"] for t in store.tasks(job)}
    finally:
        store.close()


async def test_a_paused_job_fetches_nothing_while_another_goes_on_and_completes_once_resumed(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    held_back, going = pages(sandbox, 0, 15), pages(sandbox, 15, 30)  # 3 s a job at 5/s a site
    await control(settings, "held-back", "pause")
    await submit_urls(settings, "held-back", held_back, SPEC)
    await submit_urls(settings, "going", going, SPEC)
    done = await services.wait_done("going", timeout=120)
    assert done.stored == len(going)
    assert fetched(sandbox, held_back) == []
    assert services.counts("held-back").stored == 0
    assert await paused_depth(settings) == len(held_back)  # waiting, no message held
    await control(settings, "held-back", "resume")
    resumed = await services.wait_done("held-back", timeout=120)
    assert resumed.stored == len(held_back)
    assert set(states(settings, "held-back").values()) == {"stored"}
    assert await paused_depth(settings) == 0


async def test_a_cancelled_job_ends_dead_as_cancelled_without_a_fetch(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = pages(sandbox, 0, 20)
    await control(settings, "dropped", "pause")
    await submit_urls(settings, "dropped", urls, SPEC)
    await services.wait_for("dropped", lambda c: c.total == len(urls), timeout=30)
    await control(settings, "dropped", "cancel")
    counts = await services.wait_done("dropped", timeout=60)
    assert counts.dead == counts.cancelled == len(urls) and counts.stored == 0
    assert fetched(sandbox, urls) == []


async def test_a_job_cancelled_midway_ends_with_every_task_stored_or_cancelled(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = pages(sandbox, 0, 80)  # 80 a site at 5/s: 16 s if left alone
    await submit_urls(settings, "midway", urls, SPEC)
    await services.wait_for("midway", lambda c: c.stored >= 10, timeout=60)
    await control(settings, "midway", "cancel")
    counts = await services.wait_done("midway", timeout=90)
    found = states(settings, "midway")
    assert counts.stored + counts.dead == len(urls)
    assert counts.dead == counts.cancelled > 0 and 10 <= counts.stored < len(urls)
    # Nothing cancelled was fetched: only the stored pages reached the sites (once each; a
    # clean site never asks for a retry).
    cancelled = [url for url, state in found.items() if state == "dead"]
    assert fetched(sandbox, cancelled) == []
