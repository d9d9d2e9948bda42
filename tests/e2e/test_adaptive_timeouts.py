"""Adaptive timeouts through all five services, a real RabbitMQ and the sandbox's HTTP.

A site answers its pages in milliseconds and never answers `/hang`. After the pages, the
hanging URL is retried after about the domain's adaptive timeout (the floor, here 1 s), then
twice and four times that, and ends dead as `timeout`, instead of waiting out the configured
10 s read timeout on each attempt. The waits are read from the details of the task's attempts
(each names the deadline it ran into), so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

READ_TIMEOUT = 10.0
FLOOR = 1.0
PAGES = 12
WAIT = re.compile(r"(?:within|for) ([0-9.e+]+)s")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "read_timeout": READ_TIMEOUT,
            "total_timeout": 15.0,
            "adaptive_timeouts": True,
            "adaptive_timeout_floor": FLOOR,
            "adaptive_timeout_samples": 3,
            "max_attempts": 3,
        }
    )


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 3, "sites": [{"name": "quick", "port": 0, "pages": PAGES, "latency_ms": [5, 20]}]}
    )
    async with Sandbox(config) as box:
        yield box


def timeout_history(settings: Settings, job: str) -> list[dict[str, object]]:
    store = Store(settings.store_location)
    try:
        (letter,) = store.db.execute("SELECT letter FROM dead WHERE job = ? AND reason = 'timeout'", (job,)).fetchone()
    finally:
        store.close()
    history: list[dict[str, object]] = json.loads(letter)["task"]["history"]
    return [attempt for attempt in history if attempt["outcome"] == "timeout"]


async def test_a_hang_on_a_fast_domain_is_retried_after_the_adaptive_timeout_not_the_configured_one(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["quick"].base_url
    await submit_urls(settings, "pages", [f"{base}/page/{n}" for n in range(PAGES)])
    pages = await services.wait_done("pages")
    assert pages.stored == PAGES

    await submit_urls(settings, "hang", [f"{base}/hang"])
    hang = await services.wait_done("hang")
    assert hang.pending == 0 and hang.dead == 1

    spent = timeout_history(settings, "hang")
    assert len(spent) == 3
    waits = [float(WAIT.search(str(attempt["detail"]))[1]) for attempt in spent]  # type: ignore[index]
    first = waits[0]
    assert FLOOR <= first < READ_TIMEOUT
    assert waits == [pytest.approx(min(first * 2**n, READ_TIMEOUT), rel=1e-4) for n in range(3)]  # shown to 6 digits
    assert all(float(attempt["elapsed"]) < READ_TIMEOUT for attempt in spent[:2])  # type: ignore[arg-type]
    assert sum(1 for record in sandbox.log if record.path == "/hang") == 3
