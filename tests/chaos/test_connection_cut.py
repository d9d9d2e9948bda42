"""The network between the services and RabbitMQ cut twice in the middle of a job.

Unlike a broker restart, the broker keeps everything: queues, messages, and the deliveries the
services held unacked, which it requeues when it sees their connections die. The services see
their sockets reset and their reconnects refused for a few seconds, then reconnect through the
same address (a TCP proxy in front of the test's own node), redeclare, resubscribe, and finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings

from ..brokers import BrokerNode
from ..e2e.conftest import Services
from ..tcpproxy import TcpProxy
from .conftest import check_job, submit_job, wait_for_progress

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(150)]

CUT_SECONDS = 4.0


@pytest.fixture
async def proxy(node: BrokerNode) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(node.port) as running:
        yield running


@pytest.fixture
def amqp_url(proxy: TcpProxy) -> str:
    return proxy.url  # every service and the submitting client go through the proxy


async def test_a_job_survives_its_broker_connections_cut_twice_without_losing_or_duplicating_a_url(
    settings: Settings, sandbox: Sandbox, proxy: TcpProxy, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_job(settings, "cut", urls)
    stored = (await wait_for_progress(services, "cut", stored=len(urls) // 6)).stored
    for _ in range(2):
        connected = proxy.connections
        await proxy.cut()  # every connection reset; reconnects refused
        await asyncio.sleep(CUT_SECONDS)
        during = services.counts("cut")
        assert during.pending > 0, "the job finished while cut off: the cut proved nothing"
        await proxy.restore()
        # Work moves again only through new connections.
        stored = (await wait_for_progress(services, "cut", stored=stored + len(urls) // 8)).stored
        assert proxy.connections > connected
    await services.wait_done("cut", timeout=100)
    counts = check_job(settings, sandbox, "cut", urls)
    assert counts.stored > len(urls) * 0.9, counts
    assert {c.label: c.restarts for c in services.supervisor.children if c.restarts} == {}
