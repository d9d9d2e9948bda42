"""The sharded frontier on quorum queues, on the tests' own node: jobs run, pause and resume.

Quorum shards are single-active-consumer with an explicit delivery limit, the delay tiers
(where parked and retried tasks wait) dead-letter at least once, and the `jobs` and
`released.log` streams are streams whatever the queue type. A job over faulty sites must end
with every URL stored or dead and no duplicate item, and a paused job must wait in the
paused queue and complete once resumed, on quorum queues as on classic ones.
"""

from __future__ import annotations

import asyncio

import pytest
from hutch_sandbox import Sandbox

from hutch.amqp import Broker
from hutch.models import JobControl
from hutch.services.control.jobs import append_control
from hutch.settings import Settings

from ..e2e.conftest import Services
from .conftest import check_job, submit_job

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(200)]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"queue_type": "quorum"})


async def test_jobs_run_pause_and_resume_on_a_quorum_frontier(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    broker = await Broker(settings, "test-control").connect()
    try:
        assert broker.topology.queue(broker.topology.shard_queue(0).name).arguments["x-queue-type"] == "quorum"
        await append_control(broker, JobControl(job="later", action="pause"))
    finally:
        await broker.close()
    await asyncio.sleep(0.5)
    urls = sandbox.urls()[::3]  # 80 over the three faulty sites: enough for every path
    await submit_job(settings, "now", urls[::2])
    await submit_job(settings, "later", urls[1::2])
    await services.wait_done("now", timeout=120)
    check_job(settings, sandbox, "now", urls[::2])
    assert services.counts("later").stored == 0
    broker = await Broker(settings, "test-control").connect()
    try:
        await append_control(broker, JobControl(job="later", action="resume"))
    finally:
        await broker.close()
    await services.wait_done("later", timeout=120)
    check_job(settings, sandbox, "later", urls[1::2])
