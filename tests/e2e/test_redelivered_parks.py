"""A governor's `Parked` messages given back by the broker, with real services.

A domain with more work than the governor holds goes round through park queues in `Parked`
messages, and each stays unacked while any of its tasks is held. When the broker closes
every connection, those messages come back whole, and the governor, reconnected, takes each
again: only the tasks of it that it had not passed on may be taken again, or the tasks
parked again since would be twice in the frontier and their pages fetched twice (120-170
pages of this 160-page job were, before).
"""

from __future__ import annotations

import asyncio
import collections
import shutil
from collections.abc import AsyncIterator
from urllib.parse import unquote, urlsplit

import pytest
from hutch_sandbox import Sandbox, load_config

from hutch.settings import Settings

from .conftest import HERE, Services, submit_urls

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to drop connections"),
]

# A fetch whose ack the drop lost is fetched again once the fetcher reconnects (its page may
# not be stored yet, so the store cannot say): a few such are at-least-once, not this.
AGAIN_AT_MOST = 4


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox-clean.yaml")) as box:
        yield box


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # 2 pages a second per site: 80 a site take 40 s, most of them parked meanwhile.
    return settings.model_copy(update={"rate": 2.0})


async def test_parked_messages_given_back_by_lost_connections_bring_back_only_what_was_not_passed_on(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_urls(settings, "dropped", urls)
    await services.wait_for("dropped", lambda c: c.stored >= 30, timeout=60)
    vhost = unquote(urlsplit(settings.amqp_url).path[1:]) or "/"
    dropping = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "close_all_connections", "--vhost", vhost, "test: connections lost",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await asyncio.wait_for(dropping.wait(), 60) == 0
    counts = await services.wait_done("dropped", timeout=150)
    assert counts.stored == len(urls) and counts.dead == 0, counts
    fetched = collections.Counter(
        (r.site, r.path) for r in sandbox.log if r.kind == "site" and r.path.startswith("/page/")
    )
    again = sum(fetched.values()) - len(urls)
    assert again <= AGAIN_AT_MOST, sorted(fetched.items(), key=lambda item: -item[1])[:10]
    assert all(child.restarts == 0 for child in services.supervisor.children)
