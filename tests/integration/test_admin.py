"""Deleting a namespace leaves nothing of it on the broker, domain queues included."""

from __future__ import annotations

import pytest
from aio_pika.exceptions import ChannelClosed

from hutch.admin import delete_namespace, registered_domains
from hutch.amqp import Broker, declare_queue
from hutch.models import DomainRecord
from hutch.settings import Settings

pytestmark = pytest.mark.timeout(60)


async def test_deleting_a_namespace_removes_its_static_and_domain_queues(settings: Settings) -> None:
    broker = await Broker(settings, "test").connect()
    try:
        channel = await broker.channel()
        for domain in ("a.test", "b.test:8080"):
            await declare_queue(channel, broker.topology.domain_queue(domain))
            await broker.publish("", broker.topology.domains, DomainRecord(domain=domain))
        assert await registered_domains(broker) == {"a.test", "b.test:8080"}
    finally:
        await broker.close()

    deleted = await delete_namespace(settings)
    assert deleted == len(broker.topology.queues) + 2

    probe = await Broker(settings, "probe").connect(declare=False)
    try:
        for name in broker.topology.all_queue_names(["a.test", "b.test:8080"]):
            channel = await probe.channel()
            with pytest.raises(ChannelClosed):
                await channel.declare_queue(name, passive=True)
    finally:
        await probe.close()
