"""Moving the work that waits in a previous topology version's queues into this version's.

A change of queue arguments is a new topology version (`hutch.topology.VERSION`), because a
live broker refuses to redeclare a queue with other arguments. Tasks, pages and dead letters
that wait in the old version's queues when Hutch is upgraded must not be stranded there, so
the governor calls `migrate` once at start, before it consumes anything:

- The old queues are found by name: the fixed ones from the old topology, the domain queues
  from the old version's domain registry (the `domains` stream: AMQP cannot list queues).
- Each message is published again, as it was (body, properties, headers; without the broker's
  `x-death` history), with a confirm, and only then acked on the old queue. Tasks in a domain
  queue or a delay tier go through the new frontier under their domain's routing key (a task
  in a tier loses the rest of its delay); tasks that fell through to `unrouted` go to the new
  `unrouted` with their key kept; every other queue's messages go to its same-named queue.
- An emptied old queue is deleted, then the old exchanges and the old registry.
- The per-domain queues this version had before the frontier was sharded are emptied into
  the shards the same way (`_retire_domain_queues`), and the bindings it had are removed
  (`_retire_bindings`).

Several governors may start at once: an exclusive queue is the lock (the broker grants it to
one connection), so one of them moves, the others go on, and no queue is deleted under a
message another one is still moving. Every loop is bounded by the depth it read first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

import aiormq
from aiormq.abc import DeliveredMessage

from hutch.admin import registered_domains
from hutch.amqp import Broker, PublishFailed, message_type, queue_depth
from hutch.models import DecodeError, Parked, Task
from hutch.topology import PREVIOUS_VERSIONS, Topology

log = logging.getLogger(__name__)
BATCH = 200  # messages moved with their confirms in flight together
Route = Callable[[DeliveredMessage], tuple[str, str]]  # a message's new (exchange, routing key)


class MigrationLocked(Exception):
    """Another process is migrating this namespace now."""


async def migrate(broker: Broker, versions: Iterable[str] = PREVIOUS_VERSIONS) -> int:
    """Move every message from the previous versions' queues into this topology; how many."""
    lock = await _lock(broker)
    if lock is None:
        log.info("another process is migrating %s; not moving anything here", broker.topology.namespace)
        return 0
    try:
        moved = 0
        for version in versions:
            moved += await _migrate_version(broker, version)
        moved += await _retire_domain_queues(broker)
        await _retire_bindings(broker)
        return moved
    finally:
        await _unlock(broker, lock)


def _lock_name(broker: Broker) -> str:
    return f"{broker.topology.prefix}migrate.lock"


async def _lock(broker: Broker) -> aiormq.abc.AbstractChannel | None:
    """Take the namespace's migration lock: an exclusive queue, which the broker lets one
    connection hold and removes when that connection goes (a process that dies migrating)."""
    channel = await broker.raw_channel()
    try:
        await channel.queue_declare(_lock_name(broker), exclusive=True)
    except aiormq.exceptions.ChannelLockedResource:
        return None
    return channel


async def _unlock(broker: Broker, channel: aiormq.abc.AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        await channel.queue_delete(_lock_name(broker))
    with contextlib.suppress(Exception):
        await channel.close()


async def _migrate_version(broker: Broker, version: str) -> int:
    new = broker.topology
    old = Topology(new.namespace, new.queue_type, new.retry_delays, new.dlq_max_length, version=version)
    domains = await registered_domains(broker, stream=old.domains)
    to_frontier = (
        [old.tier_exchange(d) for d in old.retry_delays]
        + [old.park_exchange(d) for d in old.delays]  # none before v3
        + [old.domain_queue(d).name for d in domains]
    )
    same_name = {
        old.fetch_ready: new.fetch_ready,
        old.parse: new.parse,
        old.archive: new.archive,
        old.store: new.store,
        old.ledger: new.ledger,
        old.dlq: new.dlq,
        old.events_storer: new.events_storer,
        old.events_proxy: new.events_proxy,
        old.rpc_proxy: new.rpc_proxy,
        old.rpc_stored: new.rpc_stored,
    }
    moved = 0
    # Tiers first: they dead-letter into the old domain queues, which are emptied next.
    for name in to_frontier:
        moved += await _move(broker, name, lambda m: (new.frontier, _task_key(broker, m, new)), expiring=False)
    moved += await _move(broker, old.unrouted, lambda m: (new.unrouted, m.routing_key or ""))
    for name, target in same_name.items():
        moved += await _move(broker, name, _to_queue(target))
    for exchange in old.exchanges:
        await _quietly(broker, _delete_exchange(exchange.name))
    await _quietly(broker, _delete_queue(old.domains))
    if moved:
        log.info("moved %d messages from topology %s to %s", moved, version, new.version)
    return moved


async def _retire_domain_queues(broker: Broker) -> int:
    """Move what waits in this version's former per-domain queues into the frontier's shards.

    Before the shards, every domain had a queue `frontier.d.<domain>`, recorded in the
    `domains` stream. Their tasks go through the frontier under their shard key, then the
    emptied queues and the stream are deleted. Run with no governor of the old kind running:
    one would go on consuming a queue being emptied (what it releases is fetched once, what
    it returns falls through to `frontier.unrouted` and is routed again).
    """
    topology = broker.topology
    domains = await registered_domains(broker, stream=topology.domains)
    moved = 0
    for domain in sorted(domains):
        queue = topology.domain_queue(domain).name
        moved += await _move(broker, queue, lambda m: (topology.frontier, _task_key(broker, m, topology)))
    await _quietly(broker, _delete_queue(topology.domains))
    if domains:
        log.info("moved %d tasks from %d domain queues into the frontier's shards", moved, len(domains))
    return moved


async def _retire_bindings(broker: Broker) -> None:
    """Remove the bindings this version had before: the proxy-manager's queue heard every
    outcome (`outcome.#`); now only proxied ones (`PROXIED_OUTCOMES`)."""
    topology = broker.topology
    await _quietly(broker, lambda channel: channel.queue_unbind(topology.events_proxy, topology.events, "outcome.#"))


def frontier_tasks(broker: Broker, message: DeliveredMessage) -> list[Task]:
    """The tasks in a message got from a frontier, delay or park queue: one `Task`, or the
    tasks of a `Parked` (by its message type); DecodeError if it is neither."""
    properties = message.header.properties
    if properties.message_type == message_type(Parked.__name__):
        return broker.decode(message.body, properties.content_encoding, Parked).tasks
    return [broker.decode(message.body, properties.content_encoding, Task)]


def _task_key(broker: Broker, message: DeliveredMessage, topology: Topology) -> str:
    """A task's routing key now: its domain's shard (a tier or an old queue may hold another;
    a `Parked` holds one domain's tasks)."""
    try:
        domain = frontier_tasks(broker, message)[0].domain
    except DecodeError:
        return message.routing_key or ""
    return topology.shard_key(domain)


def _to_queue(name: str) -> Route:
    return lambda _: ("", name)


Action = Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]


def _delete_exchange(name: str) -> Action:
    return lambda channel: channel.exchange_delete(name)


def _delete_queue(name: str) -> Action:
    return lambda channel: channel.queue_delete(name)


async def _move(broker: Broker, queue: str, route: Route, expiring: bool = True) -> int:
    """Move `queue`'s messages to `route(message)` = (exchange, key), then delete it if empty.
    Not `expiring`: without their expiration (a park's own, which in a shard would drop it)."""
    underlay = await broker.raw_channel()
    try:
        found = await queue_depth(underlay, queue)
        if found is None:
            return 0  # no such queue: nothing to move
        depth = found[0]
        moved = 0
        while moved < depth:
            batch: list[DeliveredMessage] = []
            for _ in range(min(BATCH, depth - moved)):
                got = await underlay.basic_get(queue, no_ack=False)
                if got.delivery_tag is None:  # Basic.GetEmpty
                    break
                batch.append(got)
            if not batch:
                break
            try:
                await broker.relay(underlay, batch, route, expiring)
            except PublishFailed as exc:
                log.warning("moving %s stopped: %s; the rest stays there for the next start", queue, exc)
                return moved
            moved += len(batch)
        left = await queue_depth(underlay, queue)
        if left is not None and left[0] == 0:
            await underlay.queue_delete(queue)
        return moved
    finally:
        with contextlib.suppress(Exception):
            await underlay.close()


async def _quietly(broker: Broker, action: Action) -> None:
    """Run `action(channel)` on a channel of its own; an absent entity closes only that one."""
    channel = await broker.raw_channel()
    try:
        await action(channel)
    except aiormq.exceptions.AMQPError as exc:
        log.debug("migration: %s", exc)
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
