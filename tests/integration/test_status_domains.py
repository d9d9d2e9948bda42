"""`hutch status --domains` through a real RabbitMQ: the query travels in the request, a
governor answers with its selection and its total, and the frontier's depths come from the
shard queues and the paused queue."""

from __future__ import annotations

import json
import os

import pytest
from aio_pika import Message
from aio_pika.abc import AbstractIncomingMessage

from hutch.amqp import Broker
from hutch.models import GovernorStatus, StatusRequest, Task, decode, encode, task_id
from hutch.services.control.cli import main
from hutch.services.governor.status import domain_report, select_domains
from hutch.settings import Settings
from hutch.topology import STATUS

pytestmark = pytest.mark.timeout(60)
DOMAINS = 500


def rows() -> list[dict[str, object]]:
    return [
        {
            "domain": f"d{n:03}.example",
            "key": f"d{n:03}.example",
            "rate": 1.0,
            "ceiling": 1.0,
            "burst": 1,
            "concurrency": 2,
            "in_flight": n % 3,
            "paused_for": 5.0 if n % 50 == 0 else 0.0,
            "pause_reason": "retry-after" if n % 50 == 0 else "",
            "takeover_wait": 0.0,
            "active": True,
            "released": n,
            "throttled": 0,
            "robots_cap": None,
            "held": n % 10,
            "parked": 0,
            "jobs": 1,
            "oldest_held": 0.0,
        }
        for n in range(DOMAINS)
    ]


async def stand_in_governor(broker: Broker, asked: list[StatusRequest]) -> None:
    """Answers status requests as a governor does: its rows through `select_domains`."""
    channel = await broker.channel()
    queue = await channel.declare_queue("", exclusive=True, auto_delete=True)
    await queue.bind(broker.topology.events, STATUS)

    async def on_request(message: AbstractIncomingMessage) -> None:
        request = decode(message.body, StatusRequest)
        asked.append(request)
        selected, total = select_domains(rows(), request)
        answer = GovernorStatus(
            governor="g1", started=1.0, capacity=1, fetchers=1, in_flight=0, domains=selected, total_domains=total
        )
        assert message.reply_to is not None
        await channel.default_exchange.publish(
            Message(encode(answer), correlation_id=message.correlation_id), routing_key=message.reply_to
        )

    await queue.consume(on_request, no_ack=True)


async def test_a_governor_answers_the_query_with_its_selection_and_the_frontier_depths_are_read(
    settings: Settings,
) -> None:
    broker = await Broker(settings, "test-status-domains").connect()
    try:
        topology = broker.topology
        for n in range(7):
            url = f"http://d{n:03}.example/"
            task = Task(id=task_id("j", url), job="j", url=url, domain=f"d{n:03}.example")
            await broker.publish(topology.frontier, topology.shard_key(task.domain), task)
        await broker.publish("", topology.paused, Task(id="p", job="p", url="http://p.example/", domain="p.example"))
        asked: list[StatusRequest] = []
        await stand_in_governor(broker, asked)
        request = StatusRequest(top=5, sort="released", match="d0*", paused_only=True)
        report = await domain_report(broker, request)
    finally:
        await broker.close()
    assert [(a.top, a.sort, a.match, a.paused_only) for a in asked] == [(5, "released", "d0*", True)]
    assert [r["domain"] for r in report.rows] == ["d050.example", "d000.example"]
    assert all(r["governor"] == "g1" and "active" not in r for r in report.rows)
    assert (report.total, report.governors) == (DOMAINS, 1)
    assert len(report.frontier.shards) == settings.frontier_shards
    assert (report.frontier.waiting, report.frontier.paused) == (7, 1)


def test_status_domains_json_is_one_document_with_the_frontier_and_no_governor(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in settings.to_env(os.environ).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as done:
        main(["status", "--domains", "--json"])
    assert done.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["domains"] == [] and document["governors"] == 0
    assert document["frontier"]["waiting"] == 0 and document["frontier"]["paused"] == 0
