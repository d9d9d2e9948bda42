"""Removing a namespace from a broker: every queue and exchange Hutch declared under it.

AMQP cannot list queues, so the names come from the topology and, for the per-domain frontier
queues of before the shards, from their registry (the `domains` stream, deleted too), which
recorded every domain queue ever created. The tests use this where they cannot have a vhost
of their own, so that nothing is left on a broker that outlives the test run.
"""

from __future__ import annotations

import asyncio
import contextlib

from hutch.amqp import Broker, Delivery
from hutch.models import DecodeError, DomainRecord
from hutch.settings import Settings


async def registered_domains(broker: Broker, idle: float = 0.5, stream: str | None = None) -> set[str]:
    """Every domain in the registry stream (`stream`, or this topology's), from its first entry."""
    found: set[str] = set()
    channel = await broker.channel(prefetch=1000)
    try:
        queue = await channel.declare_queue(stream or broker.topology.domains, passive=True)
        seen = asyncio.Event()

        async def on_record(message: Delivery) -> None:
            with contextlib.suppress(DecodeError):
                found.add(broker.decode(message.body, message.content_encoding, DomainRecord).domain)
            seen.set()

        await broker.listen(channel, queue.name, on_record, arguments={"x-stream-offset": "first"}, ack=True)
        while True:
            seen.clear()
            try:
                await asyncio.wait_for(seen.wait(), idle)
            except TimeoutError:
                return found
    except Exception:
        return found  # no registry: no domain queue was ever created
    finally:
        with contextlib.suppress(Exception):
            await channel.close()


async def delete_namespace(settings: Settings) -> int:
    """Delete every queue and exchange of `settings.namespace`; returns how many queues."""
    broker = await Broker(settings, "admin").connect(declare=False)
    try:
        domains = await registered_domains(broker)
        # The registry itself is no longer in the topology (the frontier is sharded now), but
        # a namespace from before the shards may still have it.
        names = [*broker.topology.all_queue_names(domains), broker.topology.domains]
        deleted = 0
        for name in names:
            channel = await broker.channel()
            try:
                await channel.queue_delete(name)
                deleted += 1
            except Exception:
                pass  # already gone (a failed delete closes the channel)
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        for exchange in broker.topology.exchanges:
            channel = await broker.channel()
            with contextlib.suppress(Exception):
                await channel.exchange_delete(exchange.name)
            with contextlib.suppress(Exception):
                await channel.close()
        return deleted
    finally:
        await broker.close()
