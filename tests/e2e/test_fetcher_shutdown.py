"""SIGTERM in the middle of a fetch: the task is given back unspent, never killed by the shutdown.

The site answers after 3 s; the fetcher gets SIGTERM while the request is in flight, with a
grace of half a second. The fetch is cancelled (the HTTP client is not closed under it), the
task goes back to its domain queue with no attempt spent, and the fetcher the supervisor starts
again fetches it. With one attempt allowed (`HUTCH_MAX_ATTEMPTS=1`), a shutdown that spent an
attempt would leave the task dead.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest
from hutch_sandbox import Sandbox, SandboxConfig

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"max_attempts": 1, "shutdown_grace": 0.5, "read_timeout": 8.0, "total_timeout": 10.0}
    )


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = {"seed": 1, "sites": [{"name": "slow", "pages": 2, "latency_ms": 3000}]}
    async with Sandbox(SandboxConfig.model_validate(config)) as box:
        yield box


async def test_a_fetch_in_flight_at_sigterm_is_given_back_unspent_and_finished_after_restart(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    url = sandbox.sites["slow"].page_url(0)
    await submit_urls(settings, "shutdown", [url])
    deadline = time.monotonic() + 30
    while not [r for r in sandbox.site_log("slow") if r.path == "/page/0"]:
        assert time.monotonic() < deadline, "the page was never requested"
        await asyncio.sleep(0.05)
    child = services.supervisor.child("fetcher.1")
    assert child.process is not None
    old = child.process
    pid = services.supervisor.signal("fetcher.1", signal.SIGTERM)
    # Gone well before the site answers: the grace is 0.5 s, the answer takes 3 s.
    assert await asyncio.wait_for(old.wait(), 10) == 0
    assert services.counts("shutdown").pending == 1
    await services.supervisor.wait_restarted("fetcher.1", pid, timeout=30)
    counts = await services.wait_done("shutdown", timeout=60)
    assert counts.stored == 1 and counts.dead == 0, counts
    store = Store(settings.store_location)
    try:
        (task,) = store.tasks("shutdown")
        attempts = store.attempts(task["id"])
    finally:
        store.close()
    assert task["attempts"] == 1  # only the fetch that finished was spent
    assert ("shutdown", "frontier") in [(a["outcome"], a["next"]) for a in attempts]
    requests = [r for r in sandbox.site_log("slow") if r.path == "/page/0"]
    assert len(requests) == 2  # the one cut off by the shutdown, and the one that finished
