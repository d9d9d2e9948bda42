"""After the broker drops every connection, services reconnect and redeclare what they use,
including a frontier shard the broker lost, on the channel that consumes it."""

from __future__ import annotations

import asyncio
import shutil
from urllib.parse import unquote, urlsplit

import pytest

from hutch.amqp import Broker, Delivery, PublishFailed
from hutch.models import Task, task_id
from hutch.settings import Settings

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to drop connections"),
]


async def drop_connections(amqp_url: str) -> None:
    vhost = unquote(urlsplit(amqp_url).path[1:]) or "/"
    dropping = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "close_all_connections", "--vhost", vhost, "test: broker going away",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await asyncio.wait_for(dropping.wait(), 60) == 0


async def test_a_consumer_of_a_shard_comes_back_after_the_broker_drops_it_and_lost_the_queue(
    settings: Settings,
) -> None:
    await (await Broker(settings, "test-setup").connect()).close()  # the topology, declared once
    # Neither keeps a channel that restores the topology: the lost queue can only come back
    # through the channel that consumes it.
    broker = await Broker(settings, "test-robust").connect(declare=False)
    other = await Broker(settings, "test-admin").connect(declare=False)
    seen: list[str] = []

    async def handler(task: Task, _: Delivery) -> None:
        seen.append(task.id)

    try:
        domain = "late.example:8080"
        topology = broker.topology
        spec = topology.shard_queue(topology.shard_of(domain))
        channel = await broker.channel()
        await broker.consume(spec, Task, handler, stage="test", channel=channel)  # as the governor does
        # The broker loses the queue (as a node without its data would) and drops every connection.
        admin = await other.channel()
        await admin.queue_delete(spec.name)
        await drop_connections(settings.amqp_url)
        url = "http://late.example:8080/x"
        task = Task(id=task_id("j", url), job="j", url=url, domain=domain)
        for _ in range(150):  # until the reconnect has redeclared the queue and consumes it again
            await asyncio.sleep(0.2)
            try:
                probe = await other.channel()
                declared = await probe.declare_queue(spec.name, passive=True)
                await probe.close()
            except Exception:
                continue
            if declared.declaration_result.consumer_count:
                break
        await other.publish(topology.frontier, topology.shard_key(domain), task)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.1)
        assert seen == [task.id]
    finally:
        await broker.close()
        await other.close()


async def test_an_event_listener_is_registered_again_after_the_broker_drops_its_connection(
    settings: Settings,
) -> None:
    """`Broker.listen` consumes on aiormq's channel, under aio-pika's robust restore."""
    broker = await Broker(settings, "test-listen").connect()
    other = await Broker(settings, "test-admin").connect()
    heard: list[bytes] = []

    async def on_event(message: Delivery) -> None:
        heard.append(message.body)

    try:
        channel = await broker.channel()
        name = f"{broker.topology.prefix}listen.test"
        queue = await channel.declare_queue(name, exclusive=True, auto_delete=True)
        await queue.bind(broker.topology.events, "outcome.#")
        await broker.listen(channel, name, on_event)
        await other.publish(broker.topology.events, "outcome.a.example", b"before")
        for _ in range(50):
            if heard:
                break
            await asyncio.sleep(0.1)
        assert heard == [b"before"]

        await drop_connections(settings.amqp_url)
        for _ in range(150):  # until the exclusive queue is back with a consumer on it
            await asyncio.sleep(0.2)
            try:
                # On the listener's own connection: an exclusive queue is locked to any other.
                probe = await broker.raw_channel()
                declared = await probe.queue_declare(name, passive=True)
                await probe.close()
            except Exception:
                continue
            if declared.consumer_count:
                break
        for attempt in range(150):  # `other` was dropped too: publish once its channel is back
            try:
                await other.publish(broker.topology.events, "outcome.a.example", b"after")
                break
            except PublishFailed:
                if attempt == 149:
                    raise
                await asyncio.sleep(0.2)
        for _ in range(50):
            if len(heard) > 1:
                break
            await asyncio.sleep(0.1)
        assert heard == [b"before", b"after"]
    finally:
        await broker.close()
        await other.close()
