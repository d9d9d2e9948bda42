"""Deleting a namespace leaves nothing of it on the broker: the static queues (the frontier's
shards, the paused queue and the streams among them), and any per-domain queue left from
before the frontier was sharded, with the `domains` stream that recorded it."""

from __future__ import annotations

import pytest
from aio_pika.exceptions import ChannelClosed

from hutch.admin import delete_namespace, registered_domains
from hutch.amqp import Broker
from hutch.settings import Settings

from .legacy import leave_domain_queue

pytestmark = pytest.mark.timeout(60)


async def test_deleting_a_namespace_removes_its_static_queues_and_any_legacy_domain_queues(
    settings: Settings,
) -> None:
    broker = await Broker(settings, "test").connect()
    topology = broker.topology
    try:
        for domain in ("a.test", "b.test:8080"):
            await leave_domain_queue(broker, topology, domain)
        assert await registered_domains(broker) == {"a.test", "b.test:8080"}
    finally:
        await broker.close()
    static = [spec.name for spec in topology.queues]
    for name in (topology.paused, topology.jobs, topology.released_log, *(s.name for s in topology.shard_queues)):
        assert name in static

    deleted = await delete_namespace(settings)
    assert deleted == len(static) + 2 + 1  # the domain queues and their registry

    probe = await Broker(settings, "probe").connect(declare=False)
    try:
        for name in (*topology.all_queue_names(["a.test", "b.test:8080"]), topology.domains):
            channel = await probe.channel()
            with pytest.raises(ChannelClosed):
                await channel.declare_queue(name, passive=True)
    finally:
        await probe.close()


async def test_deleting_a_namespace_that_never_had_domain_queues_removes_its_static_queues(
    settings: Settings,
) -> None:
    broker = await Broker(settings, "test").connect()
    await broker.close()
    await delete_namespace(settings)
    probe = await Broker(settings, "probe").connect(declare=False)
    try:
        for name in broker.topology.all_queue_names():
            channel = await probe.channel()
            with pytest.raises(ChannelClosed):
                await channel.declare_queue(name, passive=True)
    finally:
        await probe.close()
