"""RabbitMQ stopped and started again in the middle of a job, its data kept.

Every service loses its connection at once and cannot reconnect for the seconds the node takes
to boot; durable queues and persistent messages come back. Whatever was unacked when the node
went down is delivered again, so this is where at-least-once meets idempotent writes: the job
must still end with every URL stored or dead and exactly one item per stored URL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings
from hutch.store import sqlite_path
from hutch.topology import Topology

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


def pages_with_the_parsers(settings: Settings, job: str) -> int:
    """Tasks of `job` in flight whose page the fetcher sent to the parsers."""
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        query = "SELECT COUNT(*) FROM tasks WHERE job = ? AND state = 'in_flight' AND due_at IS NULL"
        return int(db.execute(query, (job,)).fetchone()[0])
    finally:
        db.close()


def messages_in(node: BrokerNode, queue: str) -> int:
    """The messages `queue` holds on `node`, ready or unacknowledged (`rabbitmqctl`)."""
    for line in node.ctl("list_queues", "name", "messages").splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    return 0


async def test_pages_the_restarted_broker_lost_are_fetched_again_long_before_the_reconciler_would(
    settings: Settings, sandbox: Sandbox, node: BrokerNode, services: Services
) -> None:
    """Pages to the parsers are transient (HUTCH_PERSIST_PAGES off): a broker that restarts
    drops them. With the parser frozen, pages pile up in `parse`; the broker restarts; the
    storer finds its marker gone and has those tasks fetched again. The reconciler's own
    deadline for a silent task (permit, fetch deadline, margin: 140 s here) is past the wait."""
    assert not settings.persist_pages
    assert settings.permit_ttl + settings.total_timeout + settings.rpc_timeout + settings.publish_timeout + (
        settings.reconcile_margin
    ) > 100
    parse = Topology(settings.namespace).parse
    urls = sandbox.urls()
    await submit_job(settings, "lost-pages", urls)
    await wait_for_progress(services, "lost-pages", stored=len(urls) // 10)
    parser = services.supervisor.child("parser").process
    assert parser is not None
    os.kill(parser.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while (held := pages_with_the_parsers(settings, "lost-pages")) < 20 or messages_in(node, parse) == 0:
            assert time.monotonic() < deadline, f"only {held} pages waited for the parser"
            await asyncio.sleep(0.2)
        await in_thread(node.restart)
        assert messages_in(node, parse) == 0, "the pages were persistent: the broker kept them"
    finally:
        os.kill(parser.pid, signal.SIGCONT)
    await services.wait_done("lost-pages", timeout=90)
    counts = check_job(settings, sandbox, "lost-pages", urls)
    assert counts.stored > len(urls) * 0.9, counts
    rescued = services.counts("lost-pages").rescued
    assert rescued >= held, f"{rescued} fetched again of the {held} pages the broker had"
