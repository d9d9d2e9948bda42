"""`hutch watch --once --json` names each condition when the sandbox makes it happen.

Every test runs the five services with their metrics on free ports, makes one condition
happen through real HTTP and a real broker, then runs the command a user would run (the
`hutch` script, reading the services' /metrics and the store) and reads its flags.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig

from hutch.settings import Settings

from ..conftest import service_env
from .conftest import on_ports, running_services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HUTCH = str(Path(sys.executable).parent / "hutch")


def site(name: str, pages: int = 60, latency: int = 0) -> dict[str, Any]:
    return {"name": name, "port": 0, "pages": pages, "latency_ms": [latency, latency]}


@pytest.fixture
def sites() -> list[dict[str, Any]]:
    return [site("steady"), site("other")]


@pytest.fixture
async def sandbox(sites: list[dict[str, Any]]) -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig.model_validate({"host": "127.0.0.1", "seed": 9, "sites": sites})) as box:
        yield box


@pytest.fixture
def settings(settings: Settings, metrics_ports: dict[str, int]) -> Settings:
    return on_ports(settings, metrics_ports, rate=5.0, metrics_interval=0.5)


def domain(sandbox: Sandbox, name: str) -> str:
    return urlsplit(sandbox.sites[name].base_url).netloc


async def watch(settings: Settings, ports: dict[str, int], window: float, **env: str) -> dict[str, Any]:
    """`hutch watch --once --json` as a user runs it, on this deployment's ports and store."""
    urls = [arg for port in ports.values() for arg in ("--metrics", f"http://127.0.0.1:{port}/metrics")]
    process = await asyncio.create_subprocess_exec(
        HUTCH, "watch", "--once", "--json", "--no-broker", "--window", str(window), "--interval", "1", *urls,
        env=service_env(settings, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), window + 60)
    assert process.returncode == 0, err.decode()[-2000:]
    view: dict[str, Any] = json.loads(out)
    assert len(view["sources"]["metrics"]) == len(ports), view["sources"]
    assert view["sources"]["store"] is True
    return view


def flagged(view: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["kind"], f["subject"]) for f in view["flags"]]


async def test_a_domain_that_starts_blocking_mid_job_is_flagged_as_a_retry_spike(
    settings: Settings, sandbox: Sandbox, metrics_ports: dict[str, int]
) -> None:
    steady, other = sandbox.sites["steady"].base_url, sandbox.sites["other"].base_url
    async with running_services(settings, sandbox, {}) as services:
        await submit_urls(settings, "spike", [f"{steady}/page/{n}" for n in range(40)]
                          + [f"{other}/page/{n}" for n in range(10)])
        await services.wait_for("spike", lambda c: c.stored >= 10, timeout=60)
        # The other site starts answering every request with a block page.
        await submit_urls(settings, "spike-2", [f"{other}/block?n={n}" for n in range(15)])
        view = await watch(settings, metrics_ports, 5.0, HUTCH_WATCH_SPIKE_MIN="3")
    assert ("retry_spike", domain(sandbox, "other")) in flagged(view), view["flags"]
    assert ("retry_spike", domain(sandbox, "steady")) not in flagged(view)
    row = next(r for r in view["domains"] if r["domain"] == domain(sandbox, "steady"))
    assert row["fetches"] > 0 and row["retries"] == 0


@pytest.fixture
def slow_sites() -> list[dict[str, Any]]:
    return [site(f"slow{n}", pages=40, latency=400) for n in range(3)]


async def test_a_job_with_too_few_fetchers_is_flagged_as_under_provisioned(
    settings: Settings, metrics_ports: dict[str, int], slow_sites: list[dict[str, Any]]
) -> None:
    # One fetcher with one slot, three sites that each keep 10/s x 0.4 s = 4 fetches busy.
    settings = settings.model_copy(update={"rate": 10.0, "concurrency": 1})
    async with Sandbox(SandboxConfig.model_validate({"host": "127.0.0.1", "seed": 9, "sites": slow_sites})) as box:
        urls = [f"{box.sites[s['name']].base_url}/page/{n}" for s in slow_sites for n in range(40)]
        async with running_services(settings, box, {}):
            await submit_urls(settings, "starved", urls)
            view = await watch(settings, metrics_ports, 6.0, HUTCH_WATCH_UNDER_FOR="4")
    assert ("under_provisioned", "fetchers") in flagged(view), view
    assert view["demand"]["demand"] > 1


async def test_a_domain_that_dead_letters_everything_is_flagged(
    settings: Settings, sandbox: Sandbox, metrics_ports: dict[str, int]
) -> None:
    steady, other = sandbox.sites["steady"].base_url, sandbox.sites["other"].base_url
    # The other site's 404s at 3 a second: they go on dying through the watch's window, however
    # quick the rest (at full speed all 20 could be dead before the window opens).
    async with running_services(settings, sandbox, {"HUTCH_RATE_FOR": f"{domain(sandbox, 'other')}=3/s"}) as services:
        await submit_urls(settings, "dying", [f"{steady}/page/{n}" for n in range(20)]
                          + [f"{other}/status/404?n={n}" for n in range(20)])
        await services.wait_for("dying", lambda c: c.dead >= 2, timeout=60)
        view = await watch(settings, metrics_ports, 4.0)
    assert ("dead_letters", domain(sandbox, "other")) in flagged(view), view["flags"]
    row = next(r for r in view["domains"] if r["domain"] == domain(sandbox, "other"))
    assert row["dead"] > 0


async def test_a_task_held_back_longer_than_the_threshold_is_flagged_stale(
    settings: Settings, sandbox: Sandbox, metrics_ports: dict[str, int]
) -> None:
    steady, other = sandbox.sites["steady"].base_url, sandbox.sites["other"].base_url
    async with running_services(settings, sandbox, {}) as services:
        # The other site asks for a minute's pause: its task waits, untouched.
        await submit_urls(settings, "held", [f"{steady}/page/1", f"{other}/retry-after/60"])
        await services.wait_for("held", lambda c: c.stored == 1, timeout=60)
        await asyncio.sleep(3.0)
        view = await watch(settings, metrics_ports, 2.0, HUTCH_WATCH_STALE_AFTER="2")
    assert flagged(view) == [("stale", domain(sandbox, "other"))], view["flags"]
