"""The reconciler through the real services and RabbitMQ: a task whose message is lost is
rescued and ends stored; one lost again and again ends dead as `stalled`; a task waiting in
a delay tier or in its domain's backlog is never touched.

Messages are lost the way a dead consumer would lose them: the test itself consumes
`fetch.ready` for a while (a "black hole" fetcher) and acks every task it takes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox, load_config

from hutch.amqp import Broker, Consumer, Delivery
from hutch.models import Task
from hutch.services.control.supervisor import SERVICES, Supervisor
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import service_env
from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
HERE = Path(__file__).parent


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox-cli.yaml")) as box:  # two well-behaved sites
        yield box


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Deadlines short enough for a test: a task in flight is lost after
    # permit_ttl + total_timeout + rpc_timeout + publish_timeout + margin = 2 + 2 + 1 + 2 + 3 s.
    return settings.model_copy(
        update={
            "permit_ttl": 2.0,
            "total_timeout": 2.0,
            "rpc_timeout": 1.0,
            "publish_timeout": 2.0,
            "reconcile_interval": 0.5,
            "reconcile_margin": 3.0,
            "max_rescues": 2,
            "max_hold": 0.5,
            "respect_robots": False,  # no robots.txt task for the black hole to swallow
        }
    )


class BlackHole:
    """Consumes fetch.ready and acks every task unfetched: each message it takes is lost."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen: list[tuple[str, int]] = []  # (task id, incarnation)
        self.consumer: Consumer | None = None

    async def __aenter__(self) -> BlackHole:
        self.broker = await Broker(self.settings, "test-black-hole").connect()
        self.consumer = await self.broker.consume(
            self.broker.topology.fetch_ready, Task, self._swallow, stage="test", prefetch=100
        )
        return self

    async def _swallow(self, task: Task, _: Delivery) -> None:
        self.seen.append((task.id, task.incarnation))

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.cancel()
            self.consumer = None

    async def __aexit__(self, *_: object) -> None:
        await self.stop()
        await self.broker.close()

    async def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count:
            assert time.monotonic() < deadline, f"the black hole took {len(self.seen)} of {count} tasks"
            await asyncio.sleep(0.1)


async def start(settings: Settings, sandbox: Sandbox, services: tuple[str, ...], fetchers: int) -> Supervisor:
    env = service_env(settings, HUTCH_ALLOWED_TARGETS=",".join(sandbox.allowed_targets()))
    supervisor = Supervisor(env, fetchers=fetchers, services=services, grace=settings.shutdown_grace)
    await supervisor.start()
    await supervisor.wait_ready(timeout=60)
    return supervisor


def reconciler_view(settings: Settings, job: str) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    store = Store(settings.store_location)
    try:
        return store.tasks(job), store.dead_entries(job=job)
    finally:
        store.close()


async def test_a_task_whose_message_was_lost_is_rescued_and_ends_stored(
    settings: Settings, sandbox: Sandbox
) -> None:
    site = sandbox.sites["north"]
    urls = site.urls()[:4]
    without_fetcher = tuple(s for s in SERVICES if s != "fetcher")
    supervisor = await start(settings, sandbox, without_fetcher, fetchers=0)
    fetcher: Supervisor | None = None
    try:
        async with BlackHole(settings) as hole:
            await submit_urls(settings, "lost", urls)
            await hole.wait_for(len(urls), 30)  # released, then lost with the black hole
            await hole.stop()
        assert {inc for _, inc in hole.seen} == {0}
        fetcher = await start(settings, sandbox, ("fetcher",), fetchers=1)
        counts = await Services(settings, supervisor).wait_done("lost", timeout=90)
    finally:
        if fetcher is not None:
            await fetcher.stop()
        await supervisor.stop()
    assert (counts.stored, counts.dead, counts.rescued, counts.stalled) == (len(urls), 0, len(urls), 0)
    tasks, dead = reconciler_view(settings, "lost")
    assert dead == [] and [(t["state"], t["attempts"]) for t in tasks] == [("stored", 1)] * len(urls)
    # Each page was fetched once: by its rescued copy (the lost one never reached the site).
    hits = sorted(r.path for r in sandbox.site_log("north"))
    assert hits == sorted(url.removeprefix(site.base_url) for url in urls)


async def test_a_task_lost_again_and_again_ends_dead_as_stalled_after_its_rescues(
    settings: Settings, sandbox: Sandbox
) -> None:
    # No fetcher ever runs here, so the fetch deadlines can be shorter still: a task in flight
    # is lost after 1 + 0.5 + 0.5 + 2 + 1 = 5 s, and each of its three incarnations waits that long.
    settings = settings.model_copy(
        update={"permit_ttl": 1.0, "total_timeout": 0.5, "rpc_timeout": 0.5, "reconcile_margin": 1.0}
    )
    urls = sandbox.sites["south"].urls()[:3]
    without_fetcher = tuple(s for s in SERVICES if s != "fetcher")
    supervisor = await start(settings, sandbox, without_fetcher, fetchers=0)
    try:
        async with BlackHole(settings) as hole:
            await submit_urls(settings, "doomed", urls)
            services = Services(settings, supervisor)
            counts = await services.wait_done("doomed", timeout=120)
            await asyncio.sleep(1)  # two sweeps more (one each 0.5 s): nothing is rescued after the end
            seen = list(hole.seen)
    finally:
        await supervisor.stop()
    assert (counts.stored, counts.dead, counts.stalled, counts.rescued) == (0, 3, 3, 3)
    # Released three times each, as incarnations 0, 1 and 2 (max_rescues = 2), and no more.
    assert sorted(seen) == sorted((tid, inc) for tid in {t for t, _ in seen} for inc in (0, 1, 2))
    _, dead = reconciler_view(settings, "doomed")
    assert sorted((d["stage"], d["reason"]) for d in dead) == [("reconcile", "stalled")] * 3  # one letter each
    assert sandbox.site_log("south") == []
    # `hutch status` shows them, as text and as JSON.
    env = service_env(settings)
    as_json, as_text = await asyncio.gather(hutch(env, "status", "doomed", "--json"), hutch(env, "status", "doomed"))
    (row,) = json.loads(as_json)
    assert (row["stalled"], row["rescued"], row["dead"], row["pending"]) == (3, 3, 3, 0)
    table = as_text.splitlines()
    assert table[0].split()[-2:] == ["stalled", "rescued"]
    assert table[1].split() == ["doomed", "finished", "3", "0", "3", "0", "0", "0", "3", "3"]  # 0 cancelled


async def hutch(env: dict[str, str], *args: str) -> str:
    """Run the `hutch` command line; its standard output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from hutch.services.control.cli import main; main()", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_tasks_waiting_in_a_delay_tier_or_in_their_domains_backlog_are_not_touched(
    settings: Settings, sandbox: Sandbox
) -> None:
    site = sandbox.sites["north"]
    # Each URL fails once and waits 6 s in the broker's delay tier, twice the reconciler's
    # margin of 3 s; then all come back at once to a domain released at one page every 2 s
    # (after a burst of 3), so the last ones wait in its backlog well past their due time.
    slow = settings.model_copy(update={"retry_delays": (6.0,), "rate": 0.5, "burst": 6})
    urls = [f"{site.base_url}/flaky/{i}?fail=1&code=500" for i in range(6)]
    supervisor = await start(slow, sandbox, SERVICES, fetchers=1)
    try:
        await submit_urls(slow, "patient", urls)
        counts = await Services(slow, supervisor).wait_done("patient", timeout=120)
    finally:
        await supervisor.stop()
    assert (counts.stored, counts.dead, counts.rescued) == (len(urls), 0, 0)
    hits = [r for r in sandbox.site_log("north") if r.path.startswith("/flaky/")]
    assert len(hits) == 2 * len(urls)  # one failure and one success each: no extra copy
