"""Governors dying mid-job: a restarted one resumes every domain, a standby takes over, and
neither bursts: a governor that takes a domain over waits one permit lifetime first.

Counted at the sandbox by arrival time, over three sites with backlog.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hutch_sandbox import Sandbox

from hutch.amqp import Broker
from hutch.models import FieldRule, Spec
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.services.governor.status import domain_status
from hutch.settings import Settings
from hutch.store import AsyncStore, JobCounts, Store

from ..conftest import service_env
from ..integration.test_governor_fleet import sandbox, wait_until, worst_window
from .conftest import QUICK_BACKOFF

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SITES = [{"name": n, "pages": 60, "latency_ms": [20, 80]} for n in ("red", "green", "blue")]
# Half the backlog for the restart: killed a third of the way through, each site still has
# several seconds of work at RATE when the new governor's wait ends.
SMALL_SITES = [{**site, "pages": 30} for site in SITES]
SPEC = Spec(fields={"title": FieldRule(kind="css", expr="title::text")})
RATE = 4.0


def tuned(settings: Settings) -> Settings:
    # A governor that starts counts the releases it reads back from the released log as
    # fetches in flight until their deadline (permit lifetime and fetch deadline: 16 s here),
    # since it cannot hear the outcomes that came before it. With the default limits on
    # fetches in flight (8 per domain, 16 per fetcher) those alone would hold every domain
    # until then, and the takeover wait of one permit lifetime would never show; at RATE the
    # fetches really in flight are one or two per domain, far below these.
    return settings.model_copy(
        update={
            "rate": RATE, "burst": 1, "permit_ttl": 6.0, "max_hold": 2.0,
            "concurrency_per_domain": 64, "concurrency": 64,
        }
    )  # fmt: skip


def env(settings: Settings, box: Sandbox) -> dict[str, str]:
    return service_env(
        settings, HUTCH_ALLOWED_TARGETS=",".join(box.allowed_targets()), HUTCH_USE_PROXY_MANAGER="false"
    )


def counts(settings: Settings, job: str) -> JobCounts:
    store = Store(settings.store_location)
    try:
        found = store.counts(job)
    finally:
        store.close()
    return found[0] if found else JobCounts(job, 0, 0, 0, 0, 0)


async def submit_job(settings: Settings, job: str, urls: list[str]) -> None:
    broker = await Broker(settings, "test-control").connect()
    store = await AsyncStore(settings.store_location).open()
    try:
        await submit(broker, store, job, iter(urls), SPEC)
    finally:
        await store.close()
        await broker.close()


def page_requests(box: Sandbox, site: str) -> list:  # type: ignore[type-arg]
    return [r for r in box.site_log(site) if r.path.startswith("/page/")]


async def wait_stored(settings: Settings, job: str, at_least: int, timeout: float) -> JobCounts:
    found: list[JobCounts] = []

    def enough() -> bool:
        found[:] = [counts(settings, job)]
        return found[0].stored >= at_least

    await wait_until(enough, timeout, f"{at_least} stored in {job}")
    return found[0]


async def wait_done(settings: Settings, job: str, timeout: float) -> JobCounts:
    found: list[JobCounts] = []

    def done() -> bool:
        found[:] = [counts(settings, job)]
        return found[0].total > 0 and found[0].pending == 0

    await wait_until(done, timeout, f"{job} done")
    return found[0]


def check_quiet_then_resumed(box: Sandbox, quiet_from: float, quiet_to: float) -> None:
    for name in box.sites:
        log = page_requests(box, name)
        early = [r.ts - quiet_from for r in log if quiet_from <= r.ts < quiet_to]
        assert early == [], f"{name}: requests during the takeover wait at {early}"
        assert any(r.ts >= quiet_to for r in log), f"{name} was not resumed"
        assert worst_window(box.site_log(name)) <= RATE + 1 + 1, name


async def test_a_sigkilled_governor_is_replaced_and_the_new_one_resumes_every_domain_without_a_burst(
    settings: Settings,
) -> None:
    settings = tuned(settings)
    async with sandbox(SMALL_SITES) as box:
        supervisor = Supervisor(
            env(settings, box),
            fetchers=2,
            services=("governor", "fetcher", "parser", "storer"),
            grace=settings.shutdown_grace,
            out=None,
            quick_backoff=QUICK_BACKOFF,  # killed within 5 s of its start: no 2 s wait before the new one
        )
        await supervisor.start()
        try:
            await supervisor.wait_ready(timeout=60)
            await submit_job(settings, "resume", box.urls())
            await wait_stored(settings, "resume", 30, timeout=60)
            killed_at = time.time()
            pid = supervisor.signal("governor")
            await supervisor.wait_restarted("governor", pid)
            final = await wait_done(settings, "resume", timeout=150)
        finally:
            await supervisor.stop()
    assert final.stored + final.dead == final.total == 90
    assert final.dead == 0
    # Permits of the dead governor are used within a second (they are fresh). The new one
    # reads the dead one's releases back from the released log and releases nothing of a
    # domain until one permit lifetime after the last of them, which was at most that
    # domain's last request before the kill (less a moment for the fetch in between).
    for name in box.sites:
        before = [r.ts for r in page_requests(box, name) if r.ts < killed_at]
        assert before, name
        quiet_to = max(before) + settings.permit_ttl - 1.0
        log = page_requests(box, name)
        early = [r.ts - killed_at for r in log if killed_at + 1.5 <= r.ts < quiet_to]
        assert early == [], f"{name}: requests during the takeover wait, at {early} s after the kill"
        assert any(r.ts >= quiet_to for r in log), f"{name} was not resumed"
        assert worst_window(box.site_log(name)) <= RATE + 1 + 1, name


async def test_a_standby_governor_takes_over_when_the_active_one_dies_without_a_burst(settings: Settings) -> None:
    settings = tuned(settings)
    async with sandbox(SITES) as box:
        workers = Supervisor(
            env(settings, box), fetchers=2, services=("fetcher", "parser", "storer"), out=None
        )
        active = Supervisor(env(settings, box), services=("governor",), restart=False, out=None)
        standby = Supervisor(env(settings, box), services=("governor",), restart=False, out=None)
        try:
            await workers.start()
            await active.start()
            await asyncio.gather(workers.wait_ready(60), active.wait_ready(60))
            await submit_job(settings, "standby", box.urls())
            await wait_stored(settings, "standby", 10, timeout=60)
            await standby.start()  # subscribes after the active one: it waits as standby
            await standby.wait_ready(60)
            await asyncio.sleep(settings.permit_ttl + 1)  # the standby has heard a permit lifetime
            broker = await Broker(settings, "test-status").connect()
            try:
                rows = await domain_status(broker)
            finally:
                await broker.close()
            assert {r["domain"] for r in rows} == {s.domain for s in box.sites.values()}
            active_pid = active.child("governor").process.pid  # type: ignore[union-attr]
            assert all(f"-{active_pid}-" in (r["governor"] or "") for r in rows), rows
            assert all(r["rate"] == RATE for r in rows), rows
            before = counts(settings, "standby")
            assert before.pending > 0
            killed_at = time.time()
            active.signal("governor")
            final = await wait_done(settings, "standby", timeout=150)
        finally:
            for supervisor in (standby, active, workers):
                await supervisor.stop()
    assert final.stored + final.dead == final.total == 180
    assert final.dead == 0
    # The standby heard the last release of the dead one: it waits one permit lifetime from it.
    check_quiet_then_resumed(box, killed_at + 1.5, killed_at + settings.permit_ttl - 0.5)
