"""RabbitMQ stopped and started again in the middle of a job, its data kept.

Every service loses its connection at once and cannot reconnect for the seconds the node takes
to boot; durable queues and persistent messages come back. Whatever was unacked when the node
went down is delivered again, so this is where at-least-once meets idempotent writes: the job
must still end with every URL stored or dead and exactly one item per stored URL.
"""

from __future__ import annotations

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings

from ..brokers import BrokerNode
from ..e2e.conftest import Services
from .conftest import check_job, in_thread, submit_job, wait_for_progress

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(150)]


async def test_a_job_survives_rabbitmq_restarting_mid_job_without_losing_or_duplicating_a_url(
    settings: Settings, sandbox: Sandbox, node: BrokerNode, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_job(settings, "restart", urls)
    before = await wait_for_progress(services, "restart", stored=len(urls) // 5)
    assert before.pending > 0, "the job finished before the broker went down"
    await in_thread(node.restart)  # graceful stop, then start on the same port with the same data
    await services.wait_done("restart", timeout=100)
    counts = check_job(settings, sandbox, "restart", urls)
    assert counts.stored > len(urls) * 0.9, counts
    # The services reconnected on their own: none had to be started again.
    assert {c.label: c.restarts for c in services.supervisor.children if c.restarts} == {}
