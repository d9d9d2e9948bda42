"""The proxy-manager against a real RabbitMQ (and, for probes, the sandbox's real proxies):
the lease RPC under many concurrent calls, health learned from outcome events on the events
exchange, pool reloads without a restart, probes that bring a dead proxy back, state that
survives a restart, and credentials that never reach a log or the state file."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox, SandboxConfig

from hutch.amqp import Broker, RpcClient
from hutch.models import Event, Lease, LeaseRequest
from hutch.services.proxy_manager import state
from hutch.services.proxy_manager.app import ProxyManager
from hutch.services.proxy_manager.pool import proxy_id
from hutch.settings import Settings
from hutch.topology import outcome_key

pytestmark = pytest.mark.timeout(60)

SECRET = "hunter2-not-for-logs"


def pool_text(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


class Harness:
    """A proxy-manager running in this process, and a client that asks it for leases."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.manager: ProxyManager | None = None
        self.client: Broker | None = None
        self.rpc: RpcClient | None = None

    async def start(self) -> ProxyManager:
        self.manager = ProxyManager(self.settings)
        await self.manager.connect(wait=False)
        await self.manager.start()
        if self.client is None:
            self.client = await Broker(self.settings, "test-fetcher").connect()
            self.rpc = await RpcClient(self.client).start()
        return self.manager

    async def stop_manager(self) -> None:
        assert self.manager is not None
        await self.manager.shutdown()
        self.manager = None

    async def lease(self, domain: str = "shop", task: str = "t", **fields: object) -> Lease:
        assert self.rpc is not None and self.client is not None
        request = LeaseRequest(task_id=task, domain=domain, **fields)  # type: ignore[arg-type]
        return await self.rpc.call(self.client.topology.rpc_proxy, request, Lease, 5.0)

    async def outcome(self, lease: Lease, outcome: str, domain: str = "shop", task: str = "t") -> None:
        assert self.client is not None
        event = Event(
            kind="outcome", task_id=task, job="j", domain=domain, attempt=1,
            outcome=outcome, proxy_id=lease.proxy_id, tier=lease.tier, cost=lease.cost,
        )
        key = outcome_key(domain, proxied=lease.proxy_id is not None)
        await self.client.publish(self.client.topology.events, key, event)

    async def close(self) -> None:
        if self.manager is not None:
            await self.stop_manager()
        if self.client is not None:
            await self.client.close()


async def eventually(check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.fixture
def pool_file(settings: Settings) -> Path:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = settings.data_dir / "proxies.txt"
    path.write_text(
        pool_text(
            f"http://alice:{SECRET}@10.9.1.1:8080 datacenter",
            f"http://alice:{SECRET}@10.9.1.2:8080 datacenter",
            f"http://alice:{SECRET}@10.9.2.1:8080 residential",
        )
    )
    return path


def with_pool(settings: Settings, pool_file: Path, **more: object) -> Settings:
    return settings.model_copy(
        update={"proxy_file": pool_file, "proxy_escalate_blocks": 2, "proxy_reload_interval": 0.1, **more}
    )


@pytest.fixture
async def harness(settings: Settings, pool_file: Path) -> AsyncIterator[Harness]:
    h = Harness(with_pool(settings, pool_file))
    yield h
    await h.close()


async def test_without_a_pool_every_lease_is_direct(settings: Settings) -> None:
    h = Harness(settings)
    await h.start()
    try:
        lease = await h.lease()
        assert lease.direct and lease.proxy_id is None and lease.url is None
        # No pool can appear while this manager runs: the fetcher may go direct a while.
        assert lease.valid_for == settings.direct_lease_seconds
    finally:
        await h.close()


async def test_many_concurrent_lease_calls_from_one_client_are_all_answered(harness: Harness) -> None:
    await harness.start()
    leases = await asyncio.gather(*(harness.lease(domain=f"d{i % 50}", task=f"t{i}") for i in range(300)))
    granted = [lease for lease in leases if lease.proxy_id]
    assert len(granted) >= 100  # 50 domains x 2 datacenter proxies, then their caps
    assert all(lease.tier == "datacenter" and lease.url and SECRET in lease.url for lease in granted)
    waiting = [lease for lease in leases if not lease.proxy_id]
    assert all(lease.retry_in and lease.retry_in > 0 and not lease.direct for lease in waiting)


async def test_outcome_events_ban_a_blocked_proxy_and_escalate_the_domain(harness: Harness) -> None:
    manager = await harness.start()
    first = await harness.lease(task="a")
    await harness.outcome(first, "blocked", task="a")
    await eventually(lambda: manager.selector.health.banned_until(first.proxy_id, "shop", time.time()))
    for i in range(3):
        await asyncio.sleep(0.5)  # the default rate cap is 20/s x 0.5 = 10/s per proxy and domain
        assert (await harness.lease(task=f"b{i}")).proxy_id not in (first.proxy_id, None)
    await asyncio.sleep(0.5)
    second = await harness.lease(task="c")
    assert second.proxy_id is not None
    await harness.outcome(second, "blocked", task="c")
    await eventually(lambda: manager.selector.tiers.level("shop") == 1)
    assert (await harness.lease(task="d")).tier == "residential"
    assert (await harness.lease(domain="news", task="e")).tier == "datacenter"


async def test_bans_and_tiers_survive_a_restart_of_the_manager(harness: Harness, settings: Settings) -> None:
    manager = await harness.start()
    blocked = []
    for task in ("a", "b"):
        await asyncio.sleep(0.2)
        lease = await harness.lease(task=task)
        blocked.append(lease.proxy_id)
        await harness.outcome(lease, "blocked", task=task)
    await eventually(lambda: manager.selector.tiers.level("shop") == 1)
    ban = await harness.lease(domain="news", task="n")
    await harness.outcome(ban, "blocked", domain="news", task="n")
    await eventually(lambda: manager.selector.health.banned_until(ban.proxy_id, "news", time.time()))
    await asyncio.sleep(0.6)  # the state is written within a quarter second of a change
    await harness.stop_manager()
    assert (settings.data_dir / state.FILENAME).exists()

    await harness.start()
    assert (await harness.lease(task="after")).tier == "residential"
    for i in range(4):
        await asyncio.sleep(0.15)
        lease = await harness.lease(domain="news", task=f"n{i}")
        assert lease.tier == "datacenter" and lease.proxy_id != ban.proxy_id


async def test_a_manager_re_created_without_its_disk_gets_its_bans_and_tiers_from_the_broker(
    harness: Harness, settings: Settings, tmp_path: Path
) -> None:
    manager = await harness.start()
    for task in ("a", "b"):
        await asyncio.sleep(0.2)
        lease = await harness.lease(task=task)
        await harness.outcome(lease, "blocked", task=task)
    await eventually(lambda: manager.selector.tiers.level("shop") == 1)
    ban = await harness.lease(domain="news", task="n")
    await harness.outcome(ban, "blocked", domain="news", task="n")
    await eventually(lambda: manager.selector.health.banned_until(ban.proxy_id, "news", time.time()))
    await harness.stop_manager()  # publishes its last snapshot

    # Another pod, on another node: a data folder of its own, empty.
    harness.settings = harness.settings.model_copy(update={"data_dir": tmp_path / "elsewhere"})
    again = await harness.start()
    assert not (tmp_path / "elsewhere" / state.FILENAME).exists()
    assert again.selector.tiers.level("shop") == 1
    assert (await harness.lease(task="after")).tier == "residential"
    for i in range(3):
        await asyncio.sleep(0.15)
        lease = await harness.lease(domain="news", task=f"n{i}")
        assert lease.proxy_id != ban.proxy_id


async def test_a_standby_that_never_answered_publishes_nothing_and_takes_the_state_over_when_it_does(
    harness: Harness, settings: Settings, tmp_path: Path
) -> None:
    active = await harness.start()
    standby = ProxyManager(harness.settings.model_copy(update={"data_dir": tmp_path / "standby"}))
    await standby.connect(wait=False)
    await standby.start()  # waits behind the active one on the lease queue
    try:
        for task in ("a", "b"):
            await asyncio.sleep(0.2)
            lease = await harness.lease(task=task)
            await harness.outcome(lease, "blocked", task=task)
        await eventually(lambda: active.selector.tiers.level("shop") == 1)
        await asyncio.sleep(0.5)
        assert not standby._active and standby._published_version == -1  # a standby publishes nothing
        await harness.stop_manager()  # the active one goes; the standby answers from now on
        await harness.lease(task="after")  # answered by the standby, which takes over
        await eventually(lambda: standby._restored_at > 0)  # the state its predecessor published
        assert standby._active and standby.selector.tiers.level("shop") == 1
        assert (await harness.lease(task="after-2")).tier == "residential"
    finally:
        await standby.shutdown()


async def test_a_changed_pool_file_is_used_without_a_restart(harness: Harness, pool_file: Path) -> None:
    manager = await harness.start()
    await asyncio.to_thread(pool_file.write_text, pool_text("http://10.9.3.1:8080 mobile 0.01"))
    await eventually(lambda: len(manager.selector.proxies) == 1)
    lease = await harness.lease()
    assert (lease.tier, lease.cost, lease.url) == ("mobile", 0.01, "http://10.9.3.1:8080")


async def test_sighup_reloads_the_pool_at_once(settings: Settings, pool_file: Path) -> None:
    h = Harness(with_pool(settings, pool_file, proxy_reload_interval=3600))
    manager = await h.start()
    try:
        await asyncio.sleep(0.1)
        await asyncio.to_thread(pool_file.write_text, pool_text("http://10.9.3.1:8080 mobile"))
        os.kill(os.getpid(), signal.SIGHUP)
        await eventually(lambda: len(manager.selector.proxies) == 1, timeout=5)
    finally:
        await h.close()


async def test_a_broken_pool_file_keeps_the_pool_and_no_credential_reaches_the_log(
    harness: Harness, pool_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # aiormq logs whole frames at DEBUG, lease bodies included; every service runs it at ERROR
    # (hutch.telemetry.setup_logging), as here.
    aiormq = logging.getLogger("aiormq")
    level = aiormq.level
    aiormq.setLevel(logging.ERROR)
    try:
        await _break_the_pool_file_and_stop(harness, pool_file, caplog)
    finally:
        aiormq.setLevel(level)
    assert "px-" in caplog.text
    for secret in (SECRET, "alice", "10.9.1.1"):
        assert secret not in caplog.text
        assert secret not in (pool_file.parent / state.FILENAME).read_text()


async def _break_the_pool_file_and_stop(harness: Harness, pool_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = await harness.start()
    for i in range(3):
        await asyncio.sleep(0.15)
        lease = await harness.lease(task=f"p{i}")
        await harness.outcome(lease, "proxy_failure", task=f"p{i}")
        lease = await harness.lease(domain="x", task=f"b{i}")
        await harness.outcome(lease, "blocked", domain="x", task=f"b{i}")
    broken = f"http://alice:{SECRET}@10.9.1.1:8080 gold\nhttp://bob:{SECRET}@10.9.1.9:bad\n"
    await asyncio.to_thread(pool_file.write_text, broken)
    await eventually(lambda: "not reloaded" in caplog.text)
    assert len(manager.selector.proxies) == 3
    await asyncio.sleep(0.5)
    await harness.stop_manager()


async def test_a_dead_proxy_is_probed_back_once_it_answers_again(settings: Settings, tmp_path: Path) -> None:
    config = SandboxConfig.model_validate(
        {
            "sites": [{"name": "probe", "pages": 1}],
            "proxies": [
                {"name": "dc1", "tier": "datacenter", "source": "127.0.1.1", "down": True},
                {"name": "dc2", "tier": "datacenter", "source": "127.0.1.2"},
            ],
        }
    )
    async with Sandbox(config) as sandbox:
        pool_file = tmp_path / "proxies.txt"
        pool_file.write_text(sandbox.proxy_file_text())
        probe_url = sandbox.sites["probe"].base_url + "/status/204"
        h = Harness(
            with_pool(
                settings, pool_file, proxy_dead_after=2, proxy_probe_url=probe_url, proxy_probe_interval=0.5
            )
        )
        manager = await h.start()
        try:
            down = sandbox.proxies["dc1"]
            dead = proxy_id(down.url)
            for i in range(2):  # failures from two domains: the proxy's, not one site's
                await asyncio.sleep(0.2)
                lease = await h.lease(domain=f"d{i}", task=f"t{i}", exclude=[proxy_id(sandbox.proxies["dc2"].url)])
                assert lease.proxy_id == dead
                await h.outcome(lease, "proxy_failure", domain=f"d{i}", task=f"t{i}")
            await eventually(lambda: manager.selector.health.is_dead(dead))
            for i in range(5):
                await asyncio.sleep(0.15)
                assert (await h.lease(task=f"u{i}")).proxy_id != dead
            await asyncio.sleep(1.5)  # probes go on failing while it is down
            assert manager.selector.health.is_dead(dead)
            assert any(r.fault == "down" for r in sandbox.proxy_log("dc1"))
            down.config = down.config.model_copy(update={"down": False})
            await eventually(lambda: not manager.selector.health.is_dead(dead), timeout=10)
            probes = [r for r in sandbox.site_log("probe") if r.path == "/status/204"]
            assert probes and probes[-1].client == "127.0.1.1"
            seen = set()
            for i in range(6):
                await asyncio.sleep(0.15)
                seen.add((await h.lease(task=f"v{i}")).proxy_id)
            assert dead in seen
        finally:
            await h.close()
