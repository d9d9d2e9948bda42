"""robots.txt per RFC 9309 through all five services, a real RabbitMQ and the sandbox's HTTP.

The site's robots.txt uses what the stdlib parser got wrong: a `$`-anchored wildcard
(`/*.pdf$`), a wildcard before a query (`/*?sort=`), and an early `Allow: /` that a longer
`Disallow: /private` must beat. Disallowed URLs end dead with reason `robots` and are never
requested; the allowed pages are stored.
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

ROBOTS = """User-agent: *
Allow: /
Disallow: /private
Disallow: /*.pdf$
Disallow: /*?sort=
"""


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {
            "host": "127.0.0.1",
            "seed": 5,
            "sites": [{"name": "polite", "port": 0, "pages": 10, "robots_txt": ROBOTS}],
        }
    )
    async with Sandbox(config) as box:
        yield box


async def test_wildcard_and_longest_match_rules_deny_what_they_say_and_allow_the_rest(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["polite"].base_url
    denied = [f"{base}/files/report.pdf", f"{base}/page/3?sort=price", f"{base}/private/page/4"]
    allowed = [f"{base}/page/1", f"{base}/page/2", f"{base}/page/5?page=2"]
    await submit_urls(settings, "robots", denied + allowed)
    counts = await services.wait_done("robots", timeout=120)
    assert counts.pending == 0
    store = Store(settings.store_location)
    try:
        states = {t["url"]: t["state"] for t in store.tasks("robots")}
        dead = {d["url"]: d for d in store.dead_entries(job="robots")}
    finally:
        store.close()
    for url in denied:
        assert states[url] == "dead", url
        assert dead[url]["reason"] == "robots", url
    for url in allowed:
        assert states[url] == "stored", url
    requested = {record.path for record in sandbox.log}
    assert "/robots.txt" in requested
    assert not requested & {"/files/report.pdf", "/page/3?sort=price", "/private/page/4"}
    assert {"/page/1", "/page/2"} <= {path.partition("?")[0] for path in requested}
