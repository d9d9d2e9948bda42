"""Removing a namespace from a broker: every queue and exchange Hutch declared under it.

AMQP cannot list queues, so the names come from the topology and, for the per-domain frontier
queues of before the shards, from their registry (the `domains` stream, deleted too), which
recorded every domain queue ever created (`read_stream` reads a stream, here and for the
proxy-manager's saved state). The tests use this where they cannot have a vhost
of their own, so that nothing is left on a broker that outlives the test run.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from pydantic import BaseModel

from hutch.amqp import Broker, Delivery
from hutch.models import DecodeError, DomainRecord
from hutch.settings import Settings

M = TypeVar("M", bound=BaseModel)


async def read_stream(
    broker: Broker, stream: str, model: type[M], offset: str = "first", idle: float = 0.5, prefetch: int = 1000
) -> list[M]:
    """The records of a stream from `offset` ("first", "last", ...) until none came for `idle`
    seconds, decoded as `model` (a record that does not decode is skipped). Raises what the
    broker raises (no such stream, a lost connection)."""
    found: list[M] = []
    channel = await broker.channel(prefetch=prefetch)
    try:
        queue = await channel.declare_queue(stream, passive=True)
        seen = asyncio.Event()

        async def on_record(message: Delivery) -> None:
            with contextlib.suppress(DecodeError):
                found.append(broker.decode(message.body, message.content_encoding, model))
            seen.set()

        await broker.listen(channel, queue.name, on_record, arguments={"x-stream-offset": offset}, ack=True)
        while True:
            seen.clear()
            try:
                await asyncio.wait_for(seen.wait(), idle)
            except TimeoutError:
                return found
    finally:
        with contextlib.suppress(Exception):
            await channel.close()


async def registered_domains(broker: Broker, idle: float = 0.5, stream: str | None = None) -> set[str]:
    """Every domain in the registry stream (`stream`, or this topology's), from its first entry."""
    try:
        records = await read_stream(broker, stream or broker.topology.domains, DomainRecord, idle=idle)
    except Exception:
        return set()  # no registry: no domain queue was ever created
    return {record.domain for record in records}


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
