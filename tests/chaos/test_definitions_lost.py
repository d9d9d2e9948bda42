"""RabbitMQ coming back with its definitions lost: same address, an empty data folder.

It happens when a broker's volume is replaced (a new pod without its disk, a node reset):
every exchange, queue, binding, stream and every message are gone, and the services' robust
connections simply reconnect. They must declare the whole topology again and go on working.
Tasks that sat in the lost queues are the reconciler's business, not this test's: here the
work submitted after the wipe must end with every URL stored or dead, through every path
(the frontier's shards, delay tiers back into them, fetch, parse, store, the dead exchange
and its ledger).
"""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from hutch_sandbox import Sandbox

from hutch.amqp import topology_for
from hutch.domains import domain_of
from hutch.settings import Settings

from ..brokers import BrokerNode
from ..e2e.conftest import Services
from .conftest import check_job, in_thread, submit_job, wait_for_progress

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(150)]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # The governor started at the end reads the releases made since the wipe and waits one
    # permit lifetime after the last of them before releasing: 4 s here, not 10. It counts
    # those releases as fetches in flight until their deadline (4 s + the fetch deadline, 14 s),
    # not hearing the outcomes that came before it: limits on fetches in flight above the
    # second job's releases (122, about 40 a domain) let the permit lifetime decide, as said.
    return settings.model_copy(update={"permit_ttl": 4.0, "concurrency_per_domain": 128, "concurrency": 512})


async def missing_definitions(url: str, exchanges: list[str], consumed: list[str]) -> list[str]:
    """Which of these exchanges do not exist, and which of these queues have no consumer."""
    missing = []
    connection = await aio_pika.connect(url, timeout=10)
    try:
        for name in exchanges + consumed:
            channel = await connection.channel()
            try:
                if name in exchanges:
                    await channel.declare_exchange(name, passive=True)
                else:
                    queue = await channel.declare_queue(name, passive=True)
                    if not queue.declaration_result.consumer_count:
                        missing.append(f"{name} (no consumer)")
            except aio_pika.exceptions.ChannelClosed:
                missing.append(name)
            else:
                await channel.close()
    finally:
        await connection.close()
    return missing


async def wait_for_recovery(url: str, settings: Settings, sandbox: Sandbox, timeout: float) -> None:
    """Wait until the services alone have declared every exchange and consume every queue
    they consumed before (the frontier's shards among them); fail after `timeout` seconds."""
    topology = topology_for(settings)
    exchanges = [exchange.name for exchange in topology.exchanges]
    consumed = [
        topology.shard_queue(topology.shard_of(domain_of(site.base_url))).name for site in sandbox.sites.values()
    ]
    consumed += [topology.unrouted, topology.fetch_ready, topology.parse, topology.store]
    missing: list[str] = []
    for _ in range(int(timeout)):
        missing = await missing_definitions(url, exchanges, consumed)
        if not missing:
            return
        await asyncio.sleep(1.0)
    raise AssertionError(f"not back {timeout:.0f}s after the wipe: {missing}")


async def test_services_redeclare_everything_after_the_broker_loses_its_definitions_and_new_work_completes(
    settings: Settings, sandbox: Sandbox, node: BrokerNode, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_job(settings, "before", urls)
    await wait_for_progress(services, "before", stored=len(urls) // 6)
    await in_thread(node.wipe)  # stopped, data folder deleted, started empty on the same port
    # The services put back the whole topology on their own, before any client connects
    # (a client such as `hutch submit` declares the topology too, and could hide a failure).
    await wait_for_recovery(node.url, settings, sandbox, timeout=30)
    # The same sites (so the governor's domains are ones it knew before the wipe), as a new job,
    # and two URLs that die at once (the dead exchange and the ledger).
    missing = [sandbox.sites["south"].base_url + f"/status/404?n={i}" for i in range(2)]
    after = urls[::2] + missing
    await submit_job(settings, "after", after)
    await services.wait_done("after", timeout=100)
    counts = check_job(settings, sandbox, "after", after)
    assert counts.stored > (len(after) - len(missing)) * 0.9, counts
    assert counts.dead >= len(missing)
    assert {c.label: c.restarts for c in services.supervisor.children if c.restarts} == {}
    # The streams were lost with the rest (jobs, released log): a governor started now must
    # still find its way (it reads both before it releases anything).
    pid = services.supervisor.signal("governor")
    await services.supervisor.wait_restarted("governor", pid)
    again = urls[1::4]
    await submit_job(settings, "again", again)
    await services.wait_done("again", timeout=60)
    check_job(settings, sandbox, "again", again)
