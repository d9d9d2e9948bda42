"""Quorum queues, on the tests' own node: the v3 quorum topology is accepted as declared.

On the machine's shared broker (3.10, about 900 descriptors) a run of the whole suite that
declared a quorum topology late in the run left the node refusing every new connection, so
quorum queues are declared only on a node of these tests' own (tests/brokers.py).
"""

from __future__ import annotations

import pytest

from hutch.amqp import Broker, declare_queue
from hutch.models import DeadLetter
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
