"""A page that kills its fetcher every time ends dead, and the job ends: real processes, SIGKILL.

The fetcher is killed while it holds the task (the site has the request, no answer yet), so
the broker redelivers it to the restarted fetcher, which cannot know what happened except
through the crash count the AMQP layer keeps in the message's headers.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = pytest.mark.timeout(240)


async def test_a_page_that_kills_its_fetcher_every_time_ends_dead_as_crashed_and_the_job_ends(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    site = sandbox.sites["alpha"]
    url = f"{site.base_url}/hang"  # held until the fetcher dies (well within the fetch deadline)
    # Pages that never fail, sent after the kills: a page in flight when its fetcher is killed
    # is counted as crashed too (no process can tell which of its tasks killed it).
    good = [f"{site.base_url}/flaky/{i}?fail=0" for i in range(3)]
    # Each kill comes within 5 s of the fetcher's start, which the supervisor takes for a child
    # failing at start and backs off 2, 4, 8 s; what is tested here is the crash count.
    services.supervisor.quick_backoff = 0.25
    await submit_urls(settings, "crash", [url])

    def hits() -> int:
        return sum(1 for r in sandbox.site_log("alpha") if r.path == "/hang")

    for n in range(1, settings.max_attempts + 1):
        deadline = time.monotonic() + 60
        while hits() < n:
            assert time.monotonic() < deadline, f"attempt {n} never reached the site"
            await asyncio.sleep(0.05)
        pid = services.supervisor.signal("fetcher.1")  # SIGKILL, holding the task
        await services.supervisor.wait_restarted("fetcher.1", pid, timeout=60)
    await submit_urls(settings, "crash", good)  # the restarted fetcher goes on with other work
    counts = await services.wait_done("crash", timeout=120)
    assert (counts.stored, counts.dead, counts.pending) == (3, 1, 0)
    assert hits() == settings.max_attempts  # not fetched again after the last crash
    store = Store(settings.store_location)
    try:
        [entry] = store.dead_entries(job="crash")
    finally:
        store.close()
    assert (entry["reason"], entry["stage"], entry["url"]) == ("crashed", "fetch", url)
    assert entry["attempts"] == settings.max_attempts
