"""A three-node RabbitMQ cluster on quorum queues, one node lost in the middle of a job.

Three nodes of the test's own (tests/brokers.py: own names, configs, ports and data, one
Erlang cookie), joined with `rabbitmqctl join_cluster`; the machine's shared broker is never
touched. The services get all three in `HUTCH_AMQP_URL` and connect to the first. Mid-job
that first node stops (`stop_app`, then the VM is killed): every service fails over to a node
that is up on its own, the quorum queues elect new leaders, and the job still ends with every
URL stored or dead, each stored URL one item. The node then starts again, rejoins, and a
second job runs on the three.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings
from hutch.store import Store

from ..brokers import BrokerNode, available, cookie_home, form_cluster
from ..e2e.conftest import Services
from .conftest import check_job, in_thread, submit_job, wait_for_progress

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(300)]
PAGES = 40  # per site: 120 URLs over the three sites
# The nodes run with what deploy/ ships for a quorum cluster (its dead-letter resend timeout).
ADVANCED = (Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq" / "advanced.config").read_text()


def running_nodes(node: BrokerNode) -> list[str]:
    return sorted(json.loads(node.ctl("cluster_status", "--formatter", "json"))["running_nodes"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[BrokerNode]]:
    why = available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="hutch-cluster-"))
    os.chmod(folder, 0o755)
    home = cookie_home(folder / "home")
    nodes = [
        BrokerNode(name=f"hutch-cluster-{os.getpid()}-{i}", home=home, parent=folder, advanced_config=ADVANCED)
        for i in range(3)
    ]
    try:
        form_cluster(nodes, 90)
        running = running_nodes(nodes[0])
        assert running == sorted(node.nodename for node in nodes), running
        yield nodes
    finally:
        for node in nodes:
            node.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def amqp_url(cluster: list[BrokerNode]) -> str:
    """Every node, the first first: the services connect there, and fail over in turn."""
    return ",".join(node.url for node in cluster)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # The reconciler is the net under whatever the broker still loses in a failover: RabbitMQ
    # 3.10.8's dead-letter worker can end up not running after leader elections in quick
    # succession (fixed in later releases: rabbitmq-server pull request 7677), and a retry's
    # dead letter then waits, unseen by queue depths, for the next election. With the
    # defaults (a 120 s margin, a sweep every 30 s) such a task is rescued about 2.5 minutes
    # after it was due; here within the test's wait.
    return settings.model_copy(update={"queue_type": "quorum", "reconcile_margin": 15.0, "reconcile_interval": 5.0})


def where_they_are(settings: Settings, node: BrokerNode, job: str) -> str:
    """For a job that did not end: its unfinished tasks with their history, and every queue of
    the namespace with what it holds, as a surviving node sees them."""
    store = Store(settings.store_location)
    try:
        lines = []
        for task in store.tasks(job):
            if task["state"] not in ("stored", "dead"):
                found = store.timeline(task["id"]) or {}
                row = store.db.execute(
                    "SELECT due_at, incarnation, rescues FROM tasks WHERE id = ?", (task["id"],)
                ).fetchone()
                lines.append(f"task {task}: due_at, incarnation, rescues={tuple(row)} attempts={found.get('attempts')}")
    finally:
        store.close()
    # (`messages_dlx`, what a quorum queue dead-lettered and its target has not confirmed, is
    # not an info key RabbitMQ 3.10's list_queues knows.)
    queues = node.ctl("list_queues", "name", "type", "messages_ready", "messages_unacknowledged", "consumers")
    lines += [line for line in queues.splitlines() if settings.namespace in line]
    return "\n".join(lines)


def urls_of(sandbox: Sandbox, pages: int) -> list[str]:
    return [url for site in sandbox.sites.values() for url in site.urls()[:pages]]


# In two of three clean-clone CI runs before deploy/rabbitmq/advanced.config and the short
# reconciler margin above, one or two tasks stayed `retrying` past the test's wait, their delay
# tier and every shard empty to a depth probe: dead-lettered, not yet confirmed by the frontier
# (`messages_dlx`). On a failure the message says where the tasks were.
async def test_a_job_on_quorum_queues_survives_losing_the_node_every_service_is_connected_to(
    settings: Settings, sandbox: Sandbox, cluster: list[BrokerNode], services: Services
) -> None:
    first, *others = cluster
    urls = urls_of(sandbox, PAGES)
    await submit_job(settings, "clustered", urls)
    before = await wait_for_progress(services, "clustered", stored=len(urls) // 4, timeout=120)
    assert before.pending > 0, "the job finished before the node went down"
    await in_thread(first.stop_app)
    await in_thread(first.kill)
    try:
        await services.wait_done("clustered", timeout=60)  # about 15 s when nothing is lost
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{where_they_are(settings, others[0], 'clustered')}") from None
    counts = check_job(settings, sandbox, "clustered", urls)
    assert counts.stored > len(urls) * 0.9, counts
    # Every service moved to a node that is up on its own: none was started again.
    assert {c.label: c.restarts for c in services.supervisor.children if c.restarts} == {}
    queues = json.loads(others[0].ctl("list_queues", "name", "type", "--formatter", "json"))
    ours = {q["name"]: q["type"] for q in queues if q["name"].startswith(settings.namespace)}
    assert ours and "quorum" in ours.values(), ours

    # The node comes back, rejoins the cluster, and a second job runs on the three.
    await in_thread(lambda: first.start(90))
    assert running_nodes(others[0]) == sorted(node.nodename for node in cluster)
    again = [url for site in sandbox.sites.values() for url in site.urls()[PAGES : PAGES + 20]]
    await submit_job(settings, "rejoined", again)
    await services.wait_done("rejoined", timeout=120)
    assert check_job(settings, sandbox, "rejoined", again).stored > len(again) * 0.9
