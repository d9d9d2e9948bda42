"""Hostile bodies, headers and proxy look-alikes, through all five services and the real broker.

Each test submits one hostile URL of the sandbox (`hutch_sandbox.hostile.bodies`) as a job and
checks where the task ended and why, and that the job has nothing pending. The bombs must end
`too_large` (the fetcher decodes in bounded steps), a bogus charset must still be stored, a
huge header must end cleanly. Through a forward proxy, a 407 or a `Proxy-Status` that the site
sends is the site's answer: the proxy is not blamed (no `proxy_failure`), and an https page
comes through a CONNECT tunnel to the sandbox's TLS site, trusted through `HUTCH_CA_FILE`.

The tests only submit jobs and read their own: the sandbox and the five services are started
once for the module per route (direct, or through the proxy), each test's job of its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hutch_sandbox import Sandbox, SandboxConfig

from hutch.services.proxy_manager.pool import proxy_id
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import module_settings
from .conftest import Services, running_services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150), pytest.mark.asyncio(loop_scope="module")]

CONFIG = {
    "seed": 5,
    "sites": [{"name": "hostile", "pages": 2}, {"name": "secure", "pages": 3, "tls": True}],
    "proxies": [{"name": "dc1", "tier": "datacenter", "source": "127.0.1.1"}],
}
DIRECT, PROXIED = "direct", "proxied"
BOTH_ROUTES = pytest.mark.parametrize("route", [DIRECT, PROXIED], indirect=True)
ONLY_DIRECT = pytest.mark.parametrize("route", [DIRECT], indirect=True)


@pytest.fixture(scope="module")
def route(request: pytest.FixtureRequest) -> str:
    """How the services reach the sites: directly, or through a pool of one proxy, dc1."""
    return str(getattr(request, "param", DIRECT))


@pytest.fixture(scope="module")
def settings(
    amqp_url: str, route: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """The tests' usual settings, on a namespace and store of this route's own."""
    yield from module_settings(amqp_url, f"bodies-{route}", tmp_path_factory, request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox(route: str) -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig.model_validate(CONFIG)) as box:
        yield box


def extra_env(route: str, sandbox: Sandbox, data_dir: Path) -> dict[str, str]:
    """The sandbox's CA is trusted; `proxied` adds a pool of one proxy, dc1."""
    data_dir.mkdir(parents=True, exist_ok=True)
    assert sandbox.ca is not None
    env = {"HUTCH_CA_FILE": str(sandbox.ca.write(data_dir / "sandbox-ca.pem"))}
    if route == PROXIED:
        pool = data_dir / "proxies.txt"
        pool.write_text(f"{sandbox.proxies['dc1'].url} datacenter\n")
        env["HUTCH_PROXY_FILE"] = str(pool)
    return env


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(settings: Settings, sandbox: Sandbox, route: str) -> AsyncIterator[Services]:
    async with running_services(settings, sandbox, extra_env(route, sandbox, settings.data_dir)) as running:
        yield running


async def run_one(settings: Settings, services: Services, name: str, url: str) -> dict[str, Any]:
    """Submit `url` alone as a job of its own; its task row, its dead letter (if any) and its attempts."""
    job = f"{name}-{uuid.uuid4().hex[:6]}"
    await submit_urls(settings, job, [url])
    counts = await services.wait_done(job, timeout=90)
    assert counts.pending == 0 and counts.total == 1, counts
    deadline = time.monotonic() + 15
    while True:
        store = Store(settings.store_location)
        try:
            (task,) = store.tasks(job)
            dead = store.dead_entries(job=job)
            items = list(store.items(job))
            attempts = store.attempts(task["id"])
        finally:
            store.close()
        # The last attempt's event travels apart from the task's end: wait for it.
        if any(a["next"] in ("dead", "parse") for a in attempts) or time.monotonic() > deadline:
            return {**task, "dead": dead[0] if dead else None, "items": items, "attempts": attempts}
        await asyncio.sleep(0.2)


@ONLY_DIRECT
@pytest.mark.parametrize(
    "path",
    ["/hostile/gzip-bomb?gib=2", "/hostile/stacked-bomb?gib=2", "/hostile/deflate-bomb?gib=2"],
    ids=["gzip", "stacked", "deflate"],
)
async def test_a_compression_bomb_ends_dead_too_large(
    settings: Settings, sandbox: Sandbox, services: Services, path: str
) -> None:
    ended = await run_one(settings, services, "bomb", sandbox.sites["hostile"].base_url + path)
    assert ended["state"] == "dead"
    assert ended["dead"]["reason"] == "too_large"
    assert "over" in ended["dead"]["detail"]


@ONLY_DIRECT
async def test_a_header_of_a_mebibyte_ends_dead_too_large(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    ended = await run_one(settings, services, "header", sandbox.sites["hostile"].base_url + "/hostile/huge-header")
    assert ended["state"] == "dead"
    assert ended["dead"]["reason"] == "too_large"
    assert "head" in ended["dead"]["detail"]


@ONLY_DIRECT
async def test_a_bogus_charset_is_stored_with_a_fallback_decode(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    ended = await run_one(settings, services, "charset", sandbox.sites["hostile"].base_url + "/hostile/bogus-charset")
    assert ended["state"] == "stored"
    assert [item["title"] for item in ended["items"]] == ["bogus"]


@BOTH_ROUTES
async def test_a_407_from_the_site_is_the_sites_answer_with_or_without_a_proxy(
    settings: Settings, sandbox: Sandbox, services: Services, route: str
) -> None:
    ended = await run_one(settings, services, "auth", sandbox.sites["hostile"].base_url + "/hostile/origin-407")
    assert ended["state"] == "dead"
    assert ended["dead"]["reason"] == "client_error"
    assert_proxy_not_blamed(ended, sandbox, "/origin-407", proxied=route == PROXIED)


@BOTH_ROUTES
async def test_a_proxy_status_from_the_site_is_the_sites_answer_with_or_without_a_proxy(
    settings: Settings, sandbox: Sandbox, services: Services, route: str
) -> None:
    url = sandbox.sites["hostile"].base_url + "/hostile/origin-proxy-status"
    ended = await run_one(settings, services, "status", url)
    # A 502 is a server error: retried, each try spending an attempt, then dead.
    assert ended["state"] == "dead"
    assert ended["dead"]["reason"] == "server_error"
    answered = [a for a in ended["attempts"] if a["status"] is not None]
    assert [a["outcome"] for a in answered] == ["server_error"] * settings.max_attempts
    assert_proxy_not_blamed(ended, sandbox, "/origin-proxy-status", proxied=route == PROXIED)


def assert_proxy_not_blamed(ended: dict[str, Any], sandbox: Sandbox, path: str, proxied: bool) -> None:
    outcomes = [a["outcome"] for a in ended["attempts"]]
    assert "proxy_failure" not in outcomes, outcomes
    tried = [a for a in ended["attempts"] if a["status"] is not None]
    expected = proxy_id(sandbox.proxies["dc1"].url) if proxied else None
    assert tried and all(a["proxy_id"] == expected for a in tried), tried
    relayed = [r for r in sandbox.proxy_log("dc1") if r.path.endswith(path)]
    assert bool(relayed) == proxied


@BOTH_ROUTES
async def test_an_https_page_is_stored_directly_and_through_a_proxy_tunnel(
    settings: Settings, sandbox: Sandbox, services: Services, route: str
) -> None:
    site = sandbox.sites["secure"]
    assert site.base_url.startswith("https://")
    ended = await run_one(settings, services, "tls", site.page_url(1))
    assert ended["state"] == "stored", ended
    fetched = [r for r in sandbox.site_log("secure") if r.path == "/page/1"]
    tunnels = [r for r in sandbox.proxy_log("dc1") if r.method == "CONNECT" and r.site == "secure"]
    if route == PROXIED:
        assert tunnels and all(r.status == 200 for r in tunnels)
        assert fetched and all(r.client == "127.0.1.1" for r in fetched)  # left from the proxy's address
    else:
        assert not tunnels
        assert fetched and all(r.client == "127.0.0.1" for r in fetched)


@ONLY_DIRECT
async def test_a_trickle_that_never_ends_is_cut_at_the_deadline_and_ends_dead_as_timeout(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    # Headers, then one byte a second for ever: no read timeout ever fires, only the total deadline.
    ended = await run_one(settings, services, "trickle", sandbox.sites["hostile"].base_url + "/trickle")
    assert ended["state"] == "dead"
    assert ended["dead"]["reason"] == "timeout"
    timed_out = [a for a in ended["attempts"] if a["outcome"] == "timeout"]
    assert len(timed_out) == settings.max_attempts
    assert all(a["elapsed"] < settings.total_timeout + 2 for a in timed_out), timed_out
