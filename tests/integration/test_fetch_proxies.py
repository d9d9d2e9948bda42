"""One fetch through the sandbox's real proxies: whose failure an answer is.

No broker: `fetch()` against the sandbox, as the fetcher calls it. A proxy's own refusal (a
407 it signs, a 407 to a CONNECT, a 502 it signs) is a `proxy_failure`; the same statuses from
the site, carried by the proxy, are the site's answers; an https page comes through a tunnel
with the sandbox's CA trusted. And the guard checks the host as it goes on the wire. A
request asked at its first byte whether it is still on time (a permit's moment, see the
fetcher's lateness) is withdrawn unsent when it is not: the site never sees it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from hutch_sandbox import Sandbox, SandboxConfig

from hutch.services.fetcher.fetch import NotSent, fetch, make_client, warm_up
from hutch.services.fetcher.guard import ForbiddenTarget, TargetGuard
from hutch.services.fetcher.policy import FetchResult, load_policy

pytestmark = pytest.mark.timeout(60)

CONFIG = {
    "sites": [{"name": "plain", "pages": 2}, {"name": "secure", "pages": 2, "tls": True}],
    "proxies": [
        {"name": "open", "tier": "datacenter", "source": "127.0.1.1"},
        {"name": "locked", "tier": "datacenter", "source": "127.0.1.2", "auth": "user:pass"},
        {"name": "broken", "tier": "datacenter", "source": "127.0.1.3", "fail": 1.0},
    ],
}
POLICY = load_policy(None, max_attempts=3, max_pause=10, default_pause=1, max_throttles=3, max_proxy_failures=3)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig.model_validate(CONFIG)) as box:
        yield box


async def get(
    sandbox: Sandbox, url: str, proxy: str | None, tmp_path: Path, on_time: Callable[[], bool] | None = None
) -> FetchResult:
    assert sandbox.ca is not None
    guard = TargetGuard(sandbox.allowed_targets())
    client = make_client(
        proxy=proxy, guard=guard, user_agent="test", connect_timeout=2, read_timeout=5,
        ca_file=str(sandbox.ca.write(tmp_path / "ca.pem")),
    )
    async with client:
        return await fetch(client, url, domain="d", guard=guard, proxy=proxy, policy=POLICY,
                           total_timeout=10, max_body_bytes=1 << 20, on_time=on_time)


def without_credentials(url: str) -> str:
    return "http://" + url.rpartition("@")[2]


async def test_a_407_signed_by_the_proxy_is_a_proxy_failure(sandbox: Sandbox, tmp_path: Path) -> None:
    proxy = without_credentials(sandbox.proxies["locked"].url)
    result = await get(sandbox, sandbox.sites["plain"].page_url(0), proxy, tmp_path)
    assert (result.outcome, result.status) == ("proxy_failure", 407)


async def test_a_407_to_a_connect_is_a_proxy_failure(sandbox: Sandbox, tmp_path: Path) -> None:
    proxy = without_credentials(sandbox.proxies["locked"].url)
    result = await get(sandbox, sandbox.sites["secure"].page_url(0), proxy, tmp_path)
    assert result.outcome == "proxy_failure"


async def test_with_its_credentials_the_locked_proxy_carries_the_page(sandbox: Sandbox, tmp_path: Path) -> None:
    for site in ("plain", "secure"):
        result = await get(sandbox, sandbox.sites[site].page_url(1), sandbox.proxies["locked"].url, tmp_path)
        assert (result.outcome, result.status) == ("ok", 200), site


async def test_a_502_signed_by_the_proxy_is_a_proxy_failure(sandbox: Sandbox, tmp_path: Path) -> None:
    result = await get(sandbox, sandbox.sites["plain"].page_url(0), sandbox.proxies["broken"].url, tmp_path)
    assert (result.outcome, result.status) == ("proxy_failure", 502)


@pytest.mark.parametrize(("path", "outcome"), [("/hostile/origin-407", "client_error"),
                                               ("/hostile/origin-proxy-status", "server_error")])
@pytest.mark.parametrize("site", ["plain", "secure"])
async def test_the_sites_own_407_or_proxy_status_is_the_sites_answer(
    sandbox: Sandbox, tmp_path: Path, site: str, path: str, outcome: str
) -> None:
    for proxy in (None, sandbox.proxies["open"].url):
        result = await get(sandbox, sandbox.sites[site].base_url + path, proxy, tmp_path)
        assert result.outcome == outcome, (proxy, result)


async def test_a_destination_the_proxy_cannot_reach_is_not_the_proxys_failure(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    guard_free = "http://127.0.0.1:1/"  # nothing listens there
    proxy = sandbox.proxies["open"].url
    guard = TargetGuard(["127.0.0.1:1"])
    async with make_client(proxy=proxy, guard=guard, user_agent="t", connect_timeout=2, read_timeout=5) as client:
        result = await fetch(client, guard_free, domain="d", guard=guard, proxy=proxy, policy=POLICY,
                             total_timeout=10, max_body_bytes=1 << 20)
    assert (result.outcome, result.status) == ("server_error", 502)


async def test_through_a_proxy_the_guard_checks_the_idna_host_that_is_sent(sandbox: Sandbox) -> None:
    seen: list[str] = []

    class Recording(TargetGuard):
        async def check(self, host: str, port: int) -> list[str]:
            seen.append(host)
            raise ForbiddenTarget(host)

    guard = Recording()
    proxy = sandbox.proxies["open"].url
    async with httpx.AsyncClient(proxy=proxy, trust_env=False) as client:
        result = await fetch(client, "http://Bücher.example/", domain="d", guard=guard, proxy=proxy, policy=POLICY,
                             total_timeout=5, max_body_bytes=1024)
    assert result.outcome == "forbidden_target"
    assert seen == ["xn--bcher-kva.example"]
    assert not sandbox.proxy_log("open")  # refused before anything was sent


def site_requests(sandbox: Sandbox, site: str) -> list[str]:
    return [r.path for r in sandbox.log if r.kind == "site" and r.site == site]


@pytest.mark.parametrize("site", ["plain", "secure"])
@pytest.mark.parametrize("via", ["direct", "proxy"])
async def test_a_request_whose_moment_passed_before_its_first_byte_is_withdrawn_unsent(
    sandbox: Sandbox, tmp_path: Path, site: str, via: str
) -> None:
    # A permit that became late between the fetcher's last look and the wire (a busy event
    # loop, a new connection): the request is withdrawn, and the site never sees it.
    proxy = sandbox.proxies["open"].url if via == "proxy" else None
    asked: list[float] = []

    def late() -> bool:
        asked.append(time.monotonic())
        return False

    with pytest.raises(NotSent):
        await get(sandbox, sandbox.sites[site].page_url(0), proxy, tmp_path, on_time=late)
    assert asked
    assert site_requests(sandbox, site) == []


@pytest.mark.parametrize("via", ["direct", "proxy"])
async def test_a_request_on_time_at_its_first_network_step_is_sent_and_answered(
    sandbox: Sandbox, tmp_path: Path, via: str
) -> None:
    proxy = sandbox.proxies["open"].url if via == "proxy" else None
    asked: list[str] = []
    for site in ("plain", "secure"):

        def on_time(site: str = site) -> bool:
            asked.append(site)
            return True

        result = await get(sandbox, sandbox.sites[site].page_url(1), proxy, tmp_path, on_time=on_time)
        assert (result.outcome, result.status) == ("ok", 200)
        assert site_requests(sandbox, site) == ["/page/1"]
    # Asked once a request, at its first step: a tunnel's CONNECT, TLS and the request inside
    # it are the network's time, not the pipeline's lateness.
    assert asked == ["plain", "secure"]


async def test_through_a_tunnel_nothing_reaches_the_proxy_when_the_first_step_is_late(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    answers = iter([False])  # asked once: a second question would raise StopIteration
    with pytest.raises(NotSent):
        await get(sandbox, sandbox.sites["secure"].page_url(0), sandbox.proxies["open"].url, tmp_path,
                  on_time=lambda: next(answers))
    assert site_requests(sandbox, "secure") == []
    assert not sandbox.proxy_log("open")


async def test_a_slow_tunnel_after_the_first_step_does_not_withdraw_the_request(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # On time at the connect to the proxy, "late" by any later step (the CONNECT's answer, the
    # site's TLS, the request inside): still sent, since a remote proxy's round trips are the
    # network's time (withdrawn there, every request on a new tunnel would be, for ever).
    answers = iter([True, False, False, False])
    result = await get(sandbox, sandbox.sites["secure"].page_url(1), sandbox.proxies["open"].url, tmp_path,
                       on_time=lambda: next(answers))
    assert (result.outcome, result.status) == ("ok", 200)
    assert site_requests(sandbox, "secure") == ["/page/1"]


async def test_the_warm_up_request_goes_to_a_listener_of_the_process_own_and_is_answered() -> None:
    # Run by every fetcher before its first permit: the whole fetch stack, on loopback only.
    result = await warm_up(POLICY, "test")
    assert (result.outcome, result.status, result.body) == ("ok", 200, b"ok")
