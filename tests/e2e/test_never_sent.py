"""A task that a fetcher keeps giving back unsent ends: dead as `never_sent`, not a loop.

A fetcher gives a task back to the frontier, spending nothing, when its permit expired
or came late, or no proxy lease came. Permits that live a microsecond make every permit
expired on arrival, so every task (and every robots.txt task) is given back each time:
the count in the task, and the governor's count for robots.txt, are what end them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def respect_robots() -> bool:
    return True


@pytest.fixture
def settings(settings: Settings, respect_robots: bool) -> Settings:
    # A microsecond: no permit can reach a fetcher in time. With a millisecond, one robots.txt
    # permit once did (a fast moment), its 404 allowed every page, and the pages ended
    # `never_sent` instead of `robots`.
    update = {"permit_ttl": 1e-6, "max_returns": 3, "robots_attempts": 1, "respect_robots": respect_robots}
    return settings.model_copy(update=update)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 7, "sites": [{"name": "site", "port": 0, "pages": 10}]}
    )
    async with Sandbox(config) as box:
        yield box


def dead_of(settings: Settings, job: str) -> dict[str, dict]:  # type: ignore[type-arg]
    store = Store(settings.store_location)
    try:
        assert {t["state"] for t in store.tasks(job)} == {"dead"}
        return {d["url"]: d for d in store.dead_entries(job=job)}
    finally:
        store.close()


@pytest.mark.parametrize("respect_robots", [False])
async def test_pages_whose_permits_always_expire_end_dead_as_never_sent_and_reach_no_site(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["site"].base_url
    urls = [f"{base}/page/{n}" for n in range(1, 5)]
    await submit_urls(settings, "unsent", urls)
    await services.wait_done("unsent", timeout=90)
    dead = dead_of(settings, "unsent")
    assert set(dead) == set(urls)
    for letter in dead.values():
        assert (letter["stage"], letter["reason"]) == ("fetch", "never_sent")
        assert "3 times" in letter["detail"] and "permit_expired" in letter["detail"]
    assert [r.path for r in sandbox.log] == []


async def test_a_robots_txt_never_sent_counts_as_unreachable_and_its_pages_end_dead(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["site"].base_url
    urls = [f"{base}/page/{n}" for n in range(1, 4)]
    await submit_urls(settings, "unsent-robots", urls)
    await services.wait_done("unsent-robots", timeout=90)
    dead = dead_of(settings, "unsent-robots")
    assert set(dead) == set(urls)
    for letter in dead.values():
        assert letter["reason"] == "robots"
        assert "unreachable" in letter["detail"]
    assert [r.path for r in sandbox.log] == []
