"""The proxy-manager with every service, a real RabbitMQ and the sandbox's real proxies.

What is checked is what the sites saw (the sandbox's access log, by client address: each
sandbox proxy leaves from its own), not what the services say they did: a retry after a 403
comes from another address; a dead proxy stops carrying requests and is probed back once it
works again; a restarted manager keeps its bans and the tiers it learned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from hutch_sandbox import AccessRecord, Sandbox, SandboxConfig

from hutch.services.proxy_manager.pool import proxy_id
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = {
    "seed": 3,
    "sites": [
        {"name": "gate", "pages": 20},
        {"name": "open", "pages": 80, "latency_ms": [5, 20]},
        {"name": "guarded", "pages": 40, "block": {"datacenter_probability": 1.0}},
        {"name": "probe", "pages": 1},
    ],
    "proxies": [
        {"name": "dc1", "tier": "datacenter", "source": "127.0.1.1"},
        {"name": "dc2", "tier": "datacenter", "source": "127.0.1.2"},
        {"name": "dc3", "tier": "datacenter", "source": "127.0.1.3"},
        {"name": "dc4", "tier": "datacenter", "source": "127.0.1.4"},
        {"name": "down", "tier": "datacenter", "source": "127.0.1.9", "down": True},
        {"name": "res1", "tier": "residential", "source": "127.0.2.1"},
    ],
}
PROBE_PATH = "/status/204"


@dataclass(frozen=True)
class Pool:
    """Which sandbox proxies a test's pool file lists, and the manager's settings for it."""

    proxies: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig.model_validate(CONFIG)) as box:
        yield box


@pytest.fixture
def extra_env(request: pytest.FixtureRequest, sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    pool: Pool = request.param
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / "proxies.txt"
    path.write_text("".join(f"{sandbox.proxies[name].url} {sandbox.proxies[name].tier}\n" for name in pool.proxies))
    probe = sandbox.sites["probe"].base_url + PROBE_PATH
    return {"HUTCH_PROXY_FILE": str(path), "HUTCH_PROXY_PROBE_URL": probe, **pool.env}


async def run_job(settings: Settings, services: Services, job: str, urls: list[str], timeout: float = 90) -> None:
    await submit_urls(settings, job, urls)
    counts = await services.wait_done(job, timeout=timeout)
    assert counts.stored == len(urls), counts


def states(settings: Settings, job: str) -> dict[str, str]:
    store = Store(settings.store_location)
    try:
        return {t["url"]: t["state"] for t in store.tasks(job)}
    finally:
        store.close()


def attempts(settings: Settings, job: str) -> list[dict[str, object]]:
    store = Store(settings.store_location)
    try:
        return [a for t in store.tasks(job) for a in store.attempts(t["id"])]
    finally:
        store.close()


def source_of(sandbox: Sandbox) -> dict[str, str]:
    """Client address -> proxy name."""
    return {proxy.source: name for name, proxy in sandbox.proxies.items()}


def pages(records: list[AccessRecord]) -> list[AccessRecord]:
    return [r for r in records if r.path != PROBE_PATH]


@pytest.mark.parametrize(
    "extra_env",
    [Pool(("dc1", "dc2", "dc3", "dc4"), {"HUTCH_PROXY_BAN_SECONDS": "1"})],
    ids=["four-datacenter-proxies"],
    indirect=True,
)
async def test_a_retry_after_a_403_arrives_from_another_proxy_address(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    gate = sandbox.sites["gate"].base_url
    urls = [f"{gate}/flaky/{k}?fail=1&code=403" for k in range(1, 5)]
    await run_job(settings, services, "blocked-once", urls)
    by_proxy = source_of(sandbox)
    for url in urls:
        target = url.removeprefix(gate)
        seen = [r for r in sandbox.site_log("gate") if r.path == target]
        assert [r.status for r in seen] == [403, 200], target
        first, retry = seen
        assert first.client in by_proxy and retry.client in by_proxy  # never direct
        assert retry.client != first.client, target


@pytest.mark.parametrize(
    "extra_env",
    [Pool(("dc1", "down"), {"HUTCH_PROXY_DEAD_AFTER": "2", "HUTCH_PROXY_PROBE_INTERVAL": "0.5"})],
    ids=["one-proxy-down"],
    indirect=True,
)
async def test_a_dead_proxy_is_skipped_and_probed_back_when_it_works_again(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    site = sandbox.sites["open"].base_url
    await run_job(settings, services, "while-down", [f"{site}/page/{i}" for i in range(30)])
    down_id = proxy_id(sandbox.proxies["down"].url)
    tried = [a for a in attempts(settings, "while-down") if a["proxy_id"] == down_id]
    # Declared dead after 2 x 2 attempts with no answer while dc1 got answers; a few more were in flight.
    assert 1 <= len(tried) <= 8, tried
    assert all(a["outcome"] in ("reset", "proxy_failure") for a in tried)
    assert len(sandbox.proxy_log("down")) >= len(tried)  # they did reach it (as did the probes)
    assert len(pages(sandbox.proxy_log("dc1"))) >= 30

    down = sandbox.proxies["down"]
    down.config = down.config.model_copy(update={"down": False})
    healed_at = time.time()
    deadline = time.monotonic() + 20
    while not any(r.client == down.source and r.status == 204 for r in sandbox.site_log("probe")):
        assert time.monotonic() < deadline, "the healed proxy was never probed"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # the manager hears the probe's answer

    await run_job(settings, services, "after", [f"{site}/page/{i}" for i in range(30, 60)])
    back = [r for r in sandbox.site_log("open") if r.ts > healed_at and r.client == down.source]
    assert len(back) >= 5, len(back)  # it carries its share again


@pytest.mark.parametrize(
    "extra_env",
    [Pool(("dc1", "dc2", "res1"), {"HUTCH_PROXY_ESCALATE_BLOCKS": "2", "HUTCH_PROXY_BAN_SECONDS": "600"})],
    ids=["two-datacenter-one-residential"],
    indirect=True,
)
async def test_a_restarted_manager_keeps_its_bans_and_learned_tiers(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    guarded, opened = sandbox.sites["guarded"].base_url, sandbox.sites["open"].base_url
    first = [f"{guarded}/page/{i}" for i in range(6)] + [f"{opened}/flaky/7?fail=1&code=403"]
    await run_job(settings, services, "learn", first)
    by_proxy = source_of(sandbox)
    blocked = [r for r in sandbox.site_log("open") if r.status == 403]
    assert len(blocked) == 1
    banned = blocked[0].client
    assert by_proxy[banned] in ("dc1", "dc2")
    assert any(r.client == sandbox.proxies["res1"].source for r in sandbox.site_log("guarded"))

    await asyncio.sleep(1.0)  # the state file is written within a quarter second of a change
    pid = services.supervisor.signal("proxy-manager")  # SIGKILL: no chance to save on the way out
    await services.supervisor.wait_restarted("proxy-manager", pid)
    restarted_at = time.time()

    second = [f"{guarded}/page/{i}" for i in range(6, 16)] + [f"{opened}/page/{i}" for i in range(20)]
    await run_job(settings, services, "remember", second)
    later_guarded = [r for r in sandbox.site_log("guarded") if r.ts > restarted_at]
    later_open = [r for r in sandbox.site_log("open") if r.ts > restarted_at]
    assert len(later_guarded) >= 10 and len(later_open) >= 20
    # The tier it learned: not one datacenter request to the guarded site, so not one block.
    assert {by_proxy[r.client] for r in later_guarded} == {"res1"}
    assert all(r.status == 200 for r in later_guarded)
    # The ban: the open site never saw the banned proxy again; the other one did the work.
    assert banned not in {r.client for r in later_open}
    assert {by_proxy[r.client] for r in later_open} <= {"dc1", "dc2"}
