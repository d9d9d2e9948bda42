"""The governor's wiring: domain discovery, the events it listens to, and paced release.

- A task for a domain that has no queue yet falls through the frontier's alternate exchange
  into `frontier.unrouted`. The governor declares and binds that domain's queue, records the
  domain in the `domains` stream, and publishes the task again (now it routes).
- Every governor reads the `domains` stream from its first entry and consumes every domain
  queue in it, so a restarted or additional governor picks up every domain with backlog.
  The domain queues are single-active-consumer: with several governors the broker lets one
  release each domain and hands it to another when that one dies (see `core` for the wait
  that keeps a takeover from bursting).
- Each governor binds its own exclusive, auto-delete queue to the events exchange
  (`outcome.#`, `released.#`, `robots.#`, `fetcher.heartbeat`, `governor.status`) and
  consumes it without acks: its state is in memory, rebuilt from events after a restart, so
  an event lost with a dead governor's queue costs nothing. Binding it before consuming any
  domain queue means no release from then on goes unheard.
- Each domain queue is consumed with prefetch 1 on a shared channel: the governor holds at
  most one task per domain and asks `Core.check` what to do with it. A wait longer than
  `max_hold` (a pause, a takeover, robots.txt failing) is never spent holding the message
  (RabbitMQ's `consumer_timeout` would close the channel): the task goes back and the
  domain's consumer is cancelled until it is due. It goes back by republish and ack
  (`Requeue` without backoff), never by nack-requeue: on quorum queues every return would
  count toward `x-delivery-limit`, and a redelivery would count as a crash. (The returned
  task goes to the back of its domain's queue: order within a domain is not kept across a
  pause.)
- A domain queue is declared once on its channel and consumed again after each pause
  without declaring it again: aio-pika's robust channel keeps every queue object declared
  on it (to redeclare them all after a reconnect), so a declaration per resume would pile
  them up for as long as the governor runs. A domain whose consumer could not be started
  (the connection dropped mid-declare) is tried again until it runs. Waits for the fleet's capacity are served
  in arrival order, one held task per domain, so a domain with a huge backlog takes its turn
  like any other and never starves the rest.
- A release publishes the task with its permit to `fetch.ready` (confirms of every domain's
  release in flight together) and acks. Its `released` event goes out with the others of the
  last `RELEASE_FLUSH` seconds in one `EventBatch` (routing key `released`): one message per
  batch instead of one per permit. A governor killed between a release and the next flush
  loses those events; they only inform the storer (in flight) and standby governors, which
  wait a permit lifetime before a takeover anyway, and the outcome events follow regardless.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass, field

from aio_pika.abc import AbstractChannel, AbstractQueue

from hutch.amqp import Broker, Consumer, Dead, Delivery, PublishFailed, Requeue, declare_queue, queue_depth
from hutch.domains import routing_key
from hutch.migrate import migrate
from hutch.models import (
    DecodeError,
    DomainRecord,
    Event,
    EventBatch,
    FetcherHeartbeat,
    Rescued,
    RobotsFetched,
    Task,
    decode,
)
from hutch.service import Service
from hutch.services.governor.capacity import FleetCapacity
from hutch.services.governor.core import Core, CoreConfig, Verdict
from hutch.services.governor.limits import Limits
from hutch.services.governor.robots import RobotsCache
from hutch.services.governor.status import GovernorStatus, status_routing_key
from hutch.services.governor.suffixes import key_function

log = logging.getLogger(__name__)

READY_POLL = 0.25  # seconds between two looks at fetch.ready's depth
TICK = 0.1  # seconds between two sweeps of expired leases and capacity waits
PUBLISH_CONNECTIONS = 2  # connections releases are published on
DOMAIN_CHANNELS = 8  # channels the domain queues are consumed on (prefetch 1 per consumer)
CAPACITY_HOLD = 60.0  # longest a task is held waiting for the fetchers' capacity
SHORT_PAUSE = 1.0  # how long a domain stops consuming after a capacity or concurrency wait
RELEASE_FLUSH = 0.05  # seconds between two batches of `released` events
RELEASE_BATCH = 500  # a batch this large goes out at once
GOVERNOR_HEADER = "x-hutch-governor"
# A redelivery from a domain queue is almost always a governor that stopped or died holding
# its one task per domain (shutdown closes the channels, which returns every held task at
# once), not a task that killed it: the governor reads no page. Crashes still end there, but
# a good task must survive many governor restarts.
DOMAIN_MAX_CRASHES = 50
EVENT_KEYS = ("outcome.#", "released.#", "robots.#", "fetcher.heartbeat", "rescued.#", status_routing_key())
RESCUED_MEMORY = 100_000  # rescued tasks whose newest incarnation a governor remembers


def governor_id() -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


@dataclass
class DomainState:
    consumer: Consumer | None = None
    declared: bool = False  # its queue is declared on its channel (which redeclares it on reconnect)
    resume: asyncio.TimerHandle | None = None
    resume_on_robots: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class CapacityGate:
    """Held tasks waiting for fleet capacity, served first come, first served."""

    def __init__(self) -> None:
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def __len__(self) -> int:
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()
        return len(self._waiters)

    async def wait(self, timeout: float) -> bool:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False

    def notify(self, n: int) -> None:
        while n > 0 and self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                n -= 1


class Governor(Service):
    name = "governor"
    uvloop = True

    async def start(self) -> None:
        s = self.settings
        self.id = governor_id()
        # Work left in an older topology version's queues moves into this one first (one
        # governor does it; the others go on).
        await migrate(self.broker)
        fetch_deadline = s.total_timeout + s.rpc_timeout + 5.0
        limits = Limits.load(
            rate=s.rate,
            burst=s.burst,
            concurrency=s.concurrency_per_domain,
            path=s.limits_file,
            rate_for=s.rate_for,
        )
        robots = (
            RobotsCache(
                s.user_agent,
                ttl=s.robots_ttl,
                retry=s.robots_retry,
                attempts=s.robots_attempts,
                fetch_deadline=s.permit_ttl + fetch_deadline,
            )
            if s.respect_robots
            else None
        )
        self.core = Core(
            self.id,
            limits,
            clock=time.time,
            config=CoreConfig(
                permit_ttl=s.permit_ttl,
                fetch_deadline=fetch_deadline,
                default_pause=s.default_pause,
                max_pause=s.max_pause,
                aimd_decrease=s.aimd_decrease,
                aimd_increase=s.aimd_increase,
                aimd_streak=s.aimd_streak,
                min_rate=s.min_rate,
                max_ready=s.max_ready,
            ),
            key_of=key_function(s.domain_key, s.public_suffix_file),
            robots=robots,
            capacity=FleetCapacity(stale_after=s.heartbeat_timeout, fallback=s.concurrency),
        )
        self.domains: dict[str, DomainState] = {}
        self.gate = CapacityGate()
        self._background: set[asyncio.Task[None]] = set()
        self._lag = [0.0, 0]  # outcome events: sum of their delays on arrival, and their count
        self._releases: list[Event] = []  # released events not yet published
        # task id -> newest incarnation, of tasks the storer's reconciler rescued (oldest first).
        self.incarnations: collections.OrderedDict[str, int] = collections.OrderedDict()
        topology = self.broker.topology
        # Releases alternate between two connections (measured, bench/governor_permits.py:
        # with publishes pipelined on a channel, 2 and 16 connections give the same rate).
        self.publishers = [self.broker] + [
            await Broker(self.settings, self.name).connect(declare=False) for _ in range(PUBLISH_CONNECTIONS - 1)
        ]
        self._publisher = itertools.cycle(self.publishers)
        self.events_queue = await self._listen_events()
        self.domain_channels: list[AbstractChannel] = [
            await self.broker.channel(prefetch=1) for _ in range(DOMAIN_CHANNELS)
        ]
        self._loops = [
            asyncio.create_task(self._poll_ready_depth()),
            asyncio.create_task(self._tick()),
            asyncio.create_task(self._report()),
            asyncio.create_task(self._flush_releases_every(RELEASE_FLUSH)),
        ]
        await self.broker.consume(
            topology.domains,
            DomainRecord,
            self._on_domain_record,
            stage="governor",
            prefetch=500,
            arguments={"x-stream-offset": "first"},
        )
        await self.broker.consume(topology.unrouted, Task, self._on_unrouted, stage="governor", prefetch=64)
        assert self.broker.connection is not None
        self.broker.connection.reconnect_callbacks.add(self._register_again)
        log.info("governor %s: robots.txt %s", self.id, "respected" if robots else "ignored")

    async def shutdown(self) -> None:
        # The governor holds one message per domain. Cancelling thousands of consumers one
        # by one while each held message is requeued would have the broker redeliver them
        # straight back (a storm that outlasts any grace period); closing the domain channels
        # cancels every domain consumer and returns every held task at once.
        self.stopping.set()
        for channel in self.domain_channels:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), 5.0)
        await super().shutdown()

    async def stop(self) -> None:
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self._flush_releases()
        for state in self.domains.values():
            if state.resume is not None:
                state.resume.cancel()
        for publisher in self.publishers[1:]:
            await publisher.close()

    async def _register_again(self, *_: object) -> None:
        """Record every domain this governor watches in the registry again, after a reconnect.

        A broker that came back without its definitions has an empty registry, while the
        domain queues come back with this governor's channels, bound, so their tasks never
        fall through `unrouted` to be recorded: a governor started later would never consume
        them (tests/chaos/test_definitions_lost.py). A record of a known domain changes nothing.
        """
        topology = self.broker.topology
        records = [DomainRecord(domain=domain) for domain in self.domains]
        results = await asyncio.gather(
            *(self.broker.publish("", topology.domains, record) for record in records), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning("%d of %d domains not recorded again: %s", len(failed), len(records), failed[0])

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- events ----------------------------------------------------------------------

    async def _listen_events(self) -> AbstractQueue:
        channel = await self.broker.channel()
        topology = self.broker.topology
        queue = await channel.declare_queue(
            f"{topology.prefix}governor.{self.id}",
            exclusive=True,
            auto_delete=True,
            # A governor that cannot keep up loses the oldest events, not the broker's memory.
            arguments={"x-max-length": 200_000},
        )
        for key in EVENT_KEYS:
            await queue.bind(topology.events, key)
        await self.broker.listen(channel, queue.name, self._on_event)
        return queue

    async def _on_event(self, message: Delivery) -> None:
        key = message.routing_key or ""
        core = self.core
        try:
            if key.startswith("outcome."):
                event = decode(message.body, Event)
                self._lag[0] += time.time() - event.at
                self._lag[1] += 1
                woken = core.on_outcome(event)
                self._wake(woken)
                self._notify_gate()
            elif key == "released":
                if message.headers.get(GOVERNOR_HEADER) == self.id:
                    return  # our own releases: already counted
                for event in decode(message.body, EventBatch).events:
                    core.on_released(event)
            elif key.startswith("robots."):
                woken = core.on_robots(decode(message.body, RobotsFetched))
                self._wake(woken, robots=True)
                self._notify_gate()
            elif key.startswith("rescued."):
                self._on_rescued(decode(message.body, Rescued))
            elif key == "fetcher.heartbeat":
                core.on_heartbeat(decode(message.body, FetcherHeartbeat))
                self._notify_gate()
            elif key == status_routing_key() and message.reply_to:
                self._spawn(self._answer_status(message.reply_to, message.correlation_id))
        except DecodeError as exc:
            log.debug("ignoring an undecodable event %s: %s", key, exc)

    def _on_rescued(self, rescued: Rescued) -> None:
        self.incarnations[rescued.task_id] = max(rescued.incarnation, self.incarnations.get(rescued.task_id, 0))
        self.incarnations.move_to_end(rescued.task_id)
        while len(self.incarnations) > RESCUED_MEMORY:
            self.incarnations.popitem(last=False)

    def _stale(self, task: Task) -> bool:
        """A copy of a task the reconciler has since republished: drop it, the new one runs."""
        return task.incarnation < self.incarnations.get(task.id, 0)

    def _wake(self, key: str | None, robots: bool = False) -> None:
        if key is None:
            return
        ks = self.core.keys.get(key)
        if ks is None:
            return
        for domain in ks.queues:
            state = self.domains.get(domain)
            if state is None:
                continue
            state.changed.set()
            if robots and state.resume_on_robots and state.resume is not None:
                state.resume.cancel()
                state.resume = None
                self._spawn(self._resume(domain, state))

    def _free_capacity(self) -> int:
        core = self.core
        now = time.time()
        free = core.capacity.total(now) - core.leases.total
        return min(free, core.config.max_ready - core.ready_depth - core.released_since_look)

    def _notify_gate(self) -> None:
        if len(self.gate):
            self.gate.notify(self._free_capacity())

    async def _answer_status(self, reply_to: str, correlation_id: str | None) -> None:
        core = self.core
        now = time.time()
        answer = GovernorStatus(
            governor=self.id,
            started=core.started,
            capacity=core.capacity.total(now),
            fetchers=core.capacity.live(now),
            in_flight=core.leases.total,
            domains=core.snapshot(),
        )
        with contextlib.suppress(PublishFailed):
            await self.broker.publish(
                "", reply_to, answer, mandatory=False, correlation_id=correlation_id, persistent=False
            )

    # -- domains -------------------------------------------------------------------

    async def _on_unrouted(self, task: Task, message: Delivery) -> None:
        # The task names its domain; a routing key may be a hashed form (hutch.domains).
        domain = task.domain
        topology = self.broker.topology
        known = domain in self.domains
        channel = await self.broker.channel()
        try:
            queue = await declare_queue(channel, topology.domain_queue(domain))
            found = queue.declaration_result
        finally:
            await channel.close()
        if not known and not message.crashes and not found.message_count and not found.consumer_count:
            # A queue that did not exist: no governor can have released from it yet.
            self.core.created(domain)
        await self.broker.publish("", topology.domains, DomainRecord(domain=domain))
        await self._watch(domain)
        # Published again through the frontier, it now routes to its own queue. New headers:
        # any x-death history from a delay tier is dropped; the attempt count is in the task.
        await self.broker.publish(topology.frontier, routing_key(domain), task)

    async def _on_domain_record(self, record: DomainRecord, _: Delivery) -> None:
        await self._watch(record.domain)

    async def _watch(self, domain: str) -> None:
        """Consume this domain's queue, once per governor."""
        if self.stopping.is_set() or domain in self.domains:
            return
        state = self.domains[domain] = DomainState()
        self.core.queue(domain)
        log.debug("governing domain %s", domain)
        await self._resume(domain, state)  # on failure, tried again until it runs

    async def _consume_domain(self, domain: str, state: DomainState) -> None:
        async def on_task(task: Task, message: Delivery) -> None:
            await self._on_task(domain, task, message)

        # Declaring, binding and consuming are three round trips, one at a time on a channel:
        # the domains are spread over a few channels so that thousands start in seconds.
        channel = self.domain_channels[zlib.crc32(domain.encode()) % len(self.domain_channels)]
        state.consumer = await self.broker.consume(
            self.broker.topology.domain_queue(domain),
            Task,
            on_task,
            stage="governor",
            channel=channel,
            max_crashes=DOMAIN_MAX_CRASHES,
            declare=not state.declared,
        )
        state.declared = True

    async def _resume(self, domain: str, state: DomainState) -> None:
        if self.stopping.is_set() or state.consumer is not None:
            return
        try:
            await self._consume_domain(domain, state)
        except Exception as exc:  # the channel is reconnecting: try again shortly
            log.warning("could not resume domain %s: %s", domain, exc)
            self._pause(domain, SHORT_PAUSE)

    def _pause(self, domain: str, seconds: float, on_robots: bool = False) -> None:
        """Stop consuming a domain for `seconds`; its held task has been returned."""
        state = self.domains[domain]
        if state.resume is not None:
            return
        consumer, state.consumer = state.consumer, None
        if consumer is not None:
            self._spawn(consumer.cancel())
            # Broker keeps every consumer it started (to cancel them at shutdown); a domain is
            # consumed afresh after each pause, so forget the cancelled one or the list grows
            # for as long as the governor runs.
            with contextlib.suppress(ValueError):
                self.broker._consumers.remove(consumer)
        self.core.deactivate(domain)
        state.resume_on_robots = on_robots

        def resume() -> None:
            state.resume = None
            self._spawn(self._resume(domain, state))

        state.resume = asyncio.get_running_loop().call_later(max(seconds, 0.05), resume)

    # -- release -------------------------------------------------------------------

    async def _poll_ready_depth(self) -> None:
        channel = await self.broker.channel()
        name = self.broker.topology.fetch_ready
        while True:
            depth = await queue_depth(channel, name)
            if depth is not None:
                self.core.ready_depth = depth[0]
                self.core.released_since_look = 0
            else:  # reconnecting: keep the last figure
                with contextlib.suppress(Exception):
                    channel = await self.broker.channel()
            self._notify_gate()
            await asyncio.sleep(READY_POLL)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            for key in self.core.expire():
                self._wake(key)
            self._notify_gate()

    async def _report(self, every: float = 10.0) -> None:
        """One log line now and then: how fast permits go out and what holds the rest back."""
        last = 0
        while True:
            await asyncio.sleep(every)
            released = sum(ks.released for ks in self.core.keys.values())
            paused = sum(1 for state in self.domains.values() if state.resume is not None)
            lag_sum, lag_n = self._lag
            self._lag = [0.0, 0]
            log.info(
                "%.0f permits/s; %d domains, %d returned for now, %d waiting for fetchers; "
                "%d in flight of %d; outcomes heard %.0f ms after the fact",
                (released - last) / every,
                len(self.domains),
                paused,
                len(self.gate),
                self.core.leases.total,
                self.core.capacity.total(time.time()),
                1000 * lag_sum / lag_n if lag_n else 0.0,
            )
            last = released

    async def _on_task(self, domain: str, task: Task, message: Delivery) -> None:
        core = self.core
        state = self.domains[domain]
        core.activate(domain)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.max_hold
        served = False  # our turn came at the capacity gate
        while True:
            if self.stopping.is_set():
                raise Requeue("stopping", backoff=False)
            if self._stale(task):  # rescued meanwhile: the new copy is in the queue
                log.info("dropping stale copy %d of rescued task %s", task.incarnation, task.id)
                return
            verdict = core.check(task, domain)
            if verdict.action == "release" and not served and len(self.gate):
                # Others wait for capacity already: take a place behind them.
                verdict = Verdict("wait", time.time() + SHORT_PAUSE, "fetchers busy", gate=True)
            if verdict.action == "release":
                if verdict.robots is not None:
                    # robots.txt first: it takes this domain's token; the page waits for it.
                    await self._release(core.robots_task(verdict.robots, domain), domain)
                    continue
                await self._release(task, domain)
                return
            if verdict.action == "drop":
                return
            if verdict.action == "dead":
                raise Dead("robots", verdict.why, task)
            remaining = deadline - loop.time()
            if verdict.gate:
                # Waiting for the fetchers is no pause: hold longer than max_hold (still far
                # below consumer_timeout) rather than have every domain return its task and
                # subscribe again each few seconds while the fleet is busy.
                remaining += CAPACITY_HOLD - self.settings.max_hold
                if remaining > 0 and await self.gate.wait(remaining):
                    served = True
                    continue
                self._pause(domain, SHORT_PAUSE)
                raise Requeue("fetchers busy", backoff=False)
            wait = verdict.until - time.time()
            if wait > remaining:
                soft = verdict.why.endswith("in flight")
                robots = verdict.why.startswith(("fetching robots", "robots"))
                self._pause(domain, SHORT_PAUSE if soft else wait, on_robots=robots)
                raise Requeue(verdict.why, backoff=False)
            state.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.changed.wait(), max(wait, 0.0))

    async def _release(self, task: Task, domain: str) -> None:
        task = self.core.commit(task, domain)
        assert task.permit is not None
        topology = self.broker.topology
        publisher = next(self._publisher)
        event = Event(
            kind="released",
            task_id=task.id,
            job=task.job,
            domain=domain,
            attempt=task.attempts,
            permit_id=task.permit.id,
            at=task.permit.issued,
            incarnation=task.incarnation,
        )
        try:
            await publisher.publish(topology.work, "fetch.ready", task)
        except BaseException:
            self.core.rollback(task)
            raise
        self._releases.append(event)
        if len(self._releases) >= RELEASE_BATCH:
            self._spawn(self._flush_releases())

    async def _flush_releases_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self._flush_releases()
            except Exception:  # never let the flusher die: releases would pile up unsent
                log.exception("publishing released events failed")

    async def _flush_releases(self) -> None:
        """Publish the `released` events gathered since the last flush, in one message."""
        if not self._releases:
            return
        batch, self._releases = EventBatch(events=self._releases), []
        try:
            await self.broker.publish(
                self.broker.topology.events, "released", batch, headers={GOVERNOR_HEADER: self.id}
            )
        except PublishFailed as exc:
            log.warning("%d released events not published: %s", len(batch.events), exc)


SERVICE = Governor
