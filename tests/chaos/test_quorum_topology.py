"""Quorum queues, on the tests' own node: the v3 quorum topology is accepted as declared.

On the machine's shared broker (3.10, about 900 descriptors) a run of the whole suite that
declared a quorum topology late in the run left the node refusing every new connection, so
quorum queues are declared only on a node of these tests' own (tests/brokers.py).
"""

from __future__ import annotations

import asyncio

import pytest
from aio_pika.abc import AbstractIncomingMessage

from hutch.amqp import Broker, declare_queue
from hutch.models import DeadLetter, Task
from hutch.settings import Settings

from ..integration.test_amqp import depth

pytestmark = pytest.mark.timeout(90)


async def test_the_quorum_topology_with_its_limits_and_dead_letter_targets_is_accepted_by_the_broker(
    settings: Settings,
) -> None:
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    broker = await Broker(quorum, "test-quorum").connect()  # declares every exchange and queue
    try:
        channel = await broker.channel()
        await declare_queue(channel, broker.topology.domain_queue("127.0.0.1:9"))
        await broker.declare_topology()  # the same arguments again: no PRECONDITION_FAILED
        await broker.publish_dead(DeadLetter.of("parse", "parse", "x"))
        assert await depth(broker, broker.topology.dlq) == 1
    finally:
        await broker.close()


async def test_retries_in_a_quorum_delay_tier_come_back_to_their_shard_in_the_order_they_went_in(
    settings: Settings,
) -> None:
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    broker = await Broker(quorum, "test-quorum-tiers").connect()
    try:
        topology = broker.topology
        delay = topology.delays[0]
        domain = "ordered.test"
        tasks = [
            Task(id=f"{n:032x}", job="order", url=f"http://{domain}/{n}", domain=domain, attempts=1) for n in range(40)
        ]
        for task in tasks:  # one at a time, each confirmed: the order they entered the tier
            await broker.publish(topology.tier_exchange(delay), topology.shard_key(domain), task)
        shard = topology.shard_queue(topology.shard_of(domain)).name
        channel = await broker.channel()
        queue = await channel.declare_queue(shard, passive=True)
        back: list[str] = []
        all_back = asyncio.Event()

        async def on_message(message: AbstractIncomingMessage) -> None:
            back.append(broker.decode(message.body, message.content_encoding, Task).id)
            if len(back) == len(tasks):
                all_back.set()

        # A consumer, not basic.get: a quorum queue with a single active consumer refuses gets.
        await queue.consume(on_message, no_ack=True)
        await asyncio.wait_for(all_back.wait(), 30)  # the tier's TTL, then dead-lettering
        assert back == [task.id for task in tasks]
        await channel.close()
    finally:
        await broker.close()
