"""The governor's wiring: domain discovery, the domain registry, and paced release.

- A task for a domain that has no queue yet falls through the frontier's alternate exchange
  into `frontier.unrouted`. The governor declares and binds that domain's queue, records the
  domain in the `domains` stream, and publishes the task again (now it routes).
- Every governor reads the `domains` stream from its first entry and consumes every domain
  queue in it, so a restarted or additional governor picks up every domain with backlog.
  The domain queues are single-active-consumer: with several governors the broker lets one
  release each domain and hands it to another when that one dies.
- Each domain queue is consumed with prefetch 1 on a shared channel: the governor holds at
  most one task per domain, waits for that domain's token and for room in `fetch.ready`,
  then publishes the task with a permit and acks the frontier copy. A wait longer than
  `max_hold` is never spent holding the message (RabbitMQ's `consumer_timeout` would close
  the channel): the task goes back and the domain's consumer pauses until it is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from hutch.amqp import Consumer, Requeue, declare_queue
from hutch.domains import domain_from_routing_key, routing_key
from hutch.models import DomainRecord, Event, Permit, Task
from hutch.service import Service
from hutch.services.governor.buckets import Buckets

log = logging.getLogger(__name__)

READY_POLL = 0.25  # seconds between two looks at fetch.ready's depth


@dataclass
class DomainState:
    consumer: Consumer | None = None
    resume: asyncio.TimerHandle | None = None
    released: int = 0


class Governor(Service):
    name = "governor"

    async def start(self) -> None:
        topology = self.broker.topology
        self.buckets = Buckets(self.settings.rate, self.settings.burst)
        self.domains: dict[str, DomainState] = {}
        self._domain_lock = asyncio.Lock()
        self.ready_depth = 0
        self._released_since_poll = 0
        self.domain_channel: AbstractChannel = await self.broker.channel(prefetch=1)
        self._poller = asyncio.create_task(self._poll_ready_depth())
        await self.broker.consume(
            topology.domains,
            DomainRecord,
            self._on_domain_record,
            stage="governor",
            prefetch=500,
            arguments={"x-stream-offset": "first"},
        )
        await self.broker.consume(
            topology.unrouted, Task, self._on_unrouted, stage="governor", prefetch=64
        )

    async def stop(self) -> None:
        self._poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._poller
        for state in self.domains.values():
            if state.resume is not None:
                state.resume.cancel()

    # -- domains -------------------------------------------------------------------

    async def _on_unrouted(self, task: Task, message: AbstractIncomingMessage) -> None:
        domain = domain_from_routing_key(message.routing_key or "")
        topology = self.broker.topology
        channel = await self.broker.channel()
        try:
            await declare_queue(channel, topology.domain_queue(domain))
        finally:
            await channel.close()
        await self.broker.publish("", topology.domains, DomainRecord(domain=domain))
        await self._watch(domain)
        # Published again through the frontier, it now routes to its own queue. New headers:
        # any x-death history from a delay tier is dropped; the attempt count is in the task.
        await self.broker.publish(topology.frontier, routing_key(domain), task)

    async def _on_domain_record(self, record: DomainRecord, _: AbstractIncomingMessage) -> None:
        await self._watch(record.domain)

    async def _watch(self, domain: str) -> None:
        """Consume this domain's queue, once per governor."""
        async with self._domain_lock:
            if domain in self.domains:
                return
            state = self.domains[domain] = DomainState()
            log.info("governing domain %s", domain)
            await self._consume_domain(domain, state)

    async def _consume_domain(self, domain: str, state: DomainState) -> None:
        state.consumer = await self.broker.consume(
            self.broker.topology.domain_queue(domain),
            Task,
            self._on_task,
            stage="governor",
            channel=self.domain_channel,
        )

    def _pause(self, domain: str, seconds: float) -> None:
        """Stop consuming a domain for `seconds`; its held task has been returned."""
        state = self.domains[domain]
        if state.consumer is None or state.resume is not None:
            return
        consumer, state.consumer = state.consumer, None
        asyncio.get_running_loop().create_task(consumer.cancel())

        def resume() -> None:
            state.resume = None
            if not self.stopping.is_set():
                asyncio.get_running_loop().create_task(self._consume_domain(domain, state))

        state.resume = asyncio.get_running_loop().call_later(seconds, resume)

    # -- release -------------------------------------------------------------------

    async def _poll_ready_depth(self) -> None:
        channel = await self.broker.channel()
        name = self.broker.topology.fetch_ready
        while True:
            try:
                queue = await channel.declare_queue(name, passive=True, robust=False)
                self.ready_depth = queue.declaration_result.message_count or 0
                self._released_since_poll = 0
            except Exception as exc:  # reconnecting: keep the last figure
                log.debug("fetch.ready depth unknown: %s", exc)
                with contextlib.suppress(Exception):
                    channel = await self.broker.channel()
            await asyncio.sleep(READY_POLL)

    def _ready_full(self) -> bool:
        return self.ready_depth + self._released_since_poll >= self.settings.max_ready

    async def _on_task(self, task: Task, message: AbstractIncomingMessage) -> None:
        domain = task.domain
        bucket = self.buckets[domain]
        deadline = time.monotonic() + self.settings.max_hold
        while True:
            if self.stopping.is_set():
                raise Requeue()
            if self._ready_full():
                wait = READY_POLL
            else:
                wait = bucket.wait_time()
                if wait == 0.0 and bucket.take():
                    break
            if time.monotonic() + wait > deadline:
                self._pause(domain, max(wait, READY_POLL))
                raise Requeue()
            await asyncio.sleep(wait)
        now = time.time()
        task = task.model_copy(
            update={
                "permit": Permit(
                    id=uuid.uuid4().hex, issued=now, expires=now + self.settings.permit_ttl
                )
            }
        )
        self._released_since_poll += 1
        topology = self.broker.topology
        await asyncio.gather(
            self.broker.publish(topology.work, "fetch.ready", task),
            self.broker.publish(
                topology.events,
                f"released.{domain}",
                Event(kind="released", task_id=task.id, job=task.job, domain=domain, attempt=task.attempts),
            ),
        )
        self.domains[domain].released += 1


SERVICE = Governor
