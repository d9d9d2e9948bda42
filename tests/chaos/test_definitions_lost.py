"""RabbitMQ coming back with its definitions lost: same address, an empty data folder.

It happens when a broker's volume is replaced (a new pod without its disk, a node reset): every
exchange, queue, binding, the domain registry and every message are gone, and the services'
robust connections simply reconnect. They must declare the whole topology again, the run-time
domain queues included, and go on working. Tasks that sat in the lost queues are the
reconciler's business, not this test's: here the work submitted after the wipe must end with
every URL stored or dead, through every path (domain queues, delay tiers back into them,
fetch, parse, store, the dead exchange and its ledger).
"""

from __future__ import annotations

import pytest

from hutch.sandbox import Sandbox
from hutch.settings import Settings

from ..brokers import BrokerNode
from .conftest import Services, check_job, in_thread, submit_job, wait_for_progress

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(150)]


async def test_services_redeclare_everything_after_the_broker_loses_its_definitions_and_new_work_completes(
    settings: Settings, sandbox: Sandbox, node: BrokerNode, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_job(settings, "before", urls)
    await wait_for_progress(services, "before", stored=len(urls) // 6)
    await in_thread(node.wipe)  # stopped, data folder deleted, started empty on the same port
    # The same sites (so the governor's domains are ones it knew before the wipe), as a new job,
    # and two URLs that die at once (the dead exchange and the ledger).
    missing = [sandbox.sites["south"].base_url + f"/status/404?n={i}" for i in range(2)]
    after = urls[::2] + missing
    await submit_job(settings, "after", after)
    await services.wait_done("after", timeout=100)
    counts = check_job(settings, sandbox, "after", after)
    assert counts.stored > (len(after) - len(missing)) * 0.9, counts
    assert counts.dead >= len(missing)
    # Declared again by the services: every domain queue among them.
    queues = node.ctl("list_queues", "name")
    prefix = f"{settings.namespace}.v"
    assert sum(line.startswith(prefix) and ".frontier.d." in line for line in queues.splitlines()) == len(sandbox.sites)
    assert {c.label: c.restarts for c in services.supervisor.children if c.restarts} == {}
