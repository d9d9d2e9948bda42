"""The governor's wiring: the frontier's shards, the jobs' states, and paced release.

The frontier is a fixed number of shard queues (`HUTCH_FRONTIER_SHARDS`); a domain's tasks
all go to the shard its name hashes to, so the broker holds the same queues for ten
domains or a million, and an idle domain costs it nothing. (docs/frontier.md gives the
alternatives and the figures that chose this one.)

- Every governor consumes every shard; shards are single-active-consumer, so one governor
  at a time releases each domain and a standby takes over when it goes. Each shard is
  consumed with a window of `HUTCH_FRONTIER_WINDOW` unacked messages. A task taken from a
  shard is *held* (its message unacked) in its domain's line, per job, until the dispatcher
  releases it; at most `hold_limit` tasks per domain and job are held (a few seconds of its
  share of the rate, `HUTCH_HOLD_HORIZON`). The rest is *parked*: published to a park
  queue (the delay tiers' ladder again, the governor's alone) that brings it back when its
  turn comes (`park_slot`), then acked. So a domain with a huge backlog never fills the
  window, and the domains behind it in its shard go on.
- The dispatcher keeps every domain that holds tasks in a heap by the time it may next
  release. The domain due first goes first: `Core.check` says release, wait (rate,
  concurrency, a pause, robots.txt, a takeover) or wait for the fleet's capacity. While the
  fetchers are full the heap waits as it is, so capacity goes to domains in the order they
  became due and a huge domain takes its turn like any other. A wait longer than
  `HUTCH_MAX_HOLD` (a pause on `Retry-After`, robots.txt failing, a takeover) parks the
  domain's held tasks for about that long instead of holding them.
- Jobs share a domain by weight: the line picks the job with the least service per weight
  (stride scheduling), so a job of 100 URLs submitted behind one of a million gets its share
  from its first task on. Job states come from the `jobs` stream, read whole at start: a
  paused job's tasks go to `frontier.paused` (one queue for every job; no message is held),
  a resumed or cancelled job's are sorted out of it once, and a cancelled job's tasks end
  dead as `cancelled` where they surface.
- Before it consumes any shard, the governor reads the releases of the last permit
  lifetimes from the `released.log` stream (every governor's `released` event batches), up
  to a marker of its own, and goes on reading it: it knows every permit in flight, its own
  earlier incarnation's included, so a restart or a takeover never bursts.
- Outcomes, robots.txt results, heartbeats and rescues come on an exclusive events queue of
  its own, without acks: the governor's state is in memory and rebuilt from events.
- A release publishes the task with its permit to `fetch.ready` (confirms of many releases
  in flight together) and acks. Its `released` event goes out with the others of the last
  `RELEASE_FLUSH` seconds in one `EventBatch`. A governor killed between a release and the
  next flush loses those events (at most 50 ms of releases go unheard by the others).
- A held or parked task goes back by publish and ack, never by nack-requeue: on quorum
  queues every return would count toward `x-delivery-limit`, and a redelivery would count
  as a crash. A domain with nothing held is forgotten after `HUTCH_DOMAIN_IDLE` seconds.

Why this module is long (about 870 lines): it is one object. The shards' consumers, the
dispatcher's heap, the held tasks' futures, the events and the jobs' states share the
governor's one in-memory state on one event loop; spreading its methods over modules would
hide that, not remove it. Everything that stands alone already does: the decisions
(`core`), the limits, the fleet's capacity, robots.txt, the public suffixes and the lines
(`lines`), each pure and tested with a fake clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import heapq
import itertools
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractQueue

from hutch.amqp import Broker, Dead, Delivery, PublishFailed, Requeue, copy_properties, declare_queue, queue_depth
from hutch.frontier import PER_MESSAGE
from hutch.metrics import Metric, by_label, gauge
from hutch.migrate import frontier_tasks, migrate
from hutch.models import (
    MAX_PARKED,
    DecodeError,
    Event,
    EventBatch,
    FetcherHeartbeat,
    GovernorStatus,
    JobControl,
    Parked,
    Rescued,
    RobotsFetched,
    StatusRequest,
    Task,
)
from hutch.service import Service
from hutch.services.governor.capacity import FleetCapacity
from hutch.services.governor.core import ROBOTS_JOB, Core, CoreConfig
from hutch.services.governor.limits import Limits
from hutch.services.governor.lines import (
    PACE_MARGIN,
    PACED_PARK_MAX,
    PARK_BUDGET,
    RETURN_MARGIN,
    STATE_AFTER,
    Action,
    Copies,
    Decided,
    DomainLine,
    Held,
    JobLine,
    JobState,
    ParkBundle,
    back_by,
    let_go,
    paced,
    park_delay,
    park_slot,
    return_room,
)
from hutch.services.governor.robots import RobotsCache
from hutch.services.governor.status import select_domains
from hutch.services.governor.suffixes import key_function
from hutch.topology import FETCH_KEY, HEARTBEAT, RELEASED, STATUS

log = logging.getLogger(__name__)

READY_POLL = 0.25  # seconds between two looks at fetch.ready's depth
TICK = 0.1  # seconds between two sweeps of expired leases
PUBLISH_CONNECTIONS = 2  # connections releases are published on
RELEASE_FLUSH = 0.05  # seconds between two batches of `released` events
RELEASE_BATCH = 500  # a batch this large goes out at once
GOVERNOR_HEADER = "x-hutch-governor"
MARKER_HEADER = "x-hutch-marker"  # on an empty released batch: how a governor knows it read the log
PARKED_HEADER = "x-hutch-parked"  # a task the governor parked in a delay tier
# A redelivery from a shard is almost always a governor that stopped or died holding tasks
# (shutdown closes the shard channels, which returns every held task at once), not a task
# that killed it: the governor reads no page. Crashes still end there, but a good task must
# survive many governor restarts.
SHARD_MAX_CRASHES = 50
RESCUED_MEMORY = 100_000  # rescued tasks whose newest incarnation a governor remembers
MAX_HELD_PER_JOB = 64  # held tasks of one domain and job, however fast its rate
PASSED_KEEP = 600.0  # seconds the tasks passed on of a `Parked` given back are remembered (`_passed_of`)
COPIES_MEMORY = 100_000  # tasks out of a crashed `Parked` whose copies a governor looks out for (`_copies`)
LONG_HOLD = 600.0  # seconds a task may wait held for the fleet's capacity before it is parked
DISPATCH_SLICE = 2000  # decisions before the dispatcher lets the loop run other work
JOBS_QUIET = 0.3  # seconds without a record that mean the jobs stream is read to its end
CATCH_UP_LIMIT = 30.0  # longest wait for the released log before releasing anyway
RECALL_EVERY = 0.5  # seconds between two looks for a domain idle while its tasks wait parked
RECALL_MAX = 256  # parks taken back early in one look, at most
RECALL_MISSES = 32  # ...and from one park queue, no more once this many in a row were others' parks
PARK_GATHER = 0.02  # seconds a park waits for others of its domain, queue and second (one `Parked`)
# Tasks of `Parked` messages a governor may have held or still to place, per message its
# shards' windows allow (16,384 by default): a `Parked` is acked when its last task is
# released, so without a bound a window of 256 messages could keep 256 x 256 decoded tasks of
# each shard in memory. A task counts until it is passed on (released, parked again, ended):
# counted whole until its message was acked, a job's new tasks 256 to a message filled the
# bound with some 1,300 tasks held, and the governor spent its time decoding the messages it
# sent back whole (docs/benchmarks.md, eighteenth round).
PINNED_PER_SLOT = PER_MESSAGE  # 4: a job's new tasks come that many to a message (hutch.frontier)
# ...and the bodies of those messages, which stay until the ack (a task with a small spec is
# about 0.7 KB of body, 5 KB decoded).
PINNED_BODIES = 64 * 1024 * 1024
# Tasks past their hold stay held (nothing behind them in their shard) only while the tasks of
# `Parked` messages held or still to place are less than this share of that bound (2,048).
KEEP_SHARE = 8
SHARD_LOOK = 0.5  # seconds between two looks at how many tasks wait in each frontier shard


def governor_id() -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class Governor(Service):
    name = "governor"
    uvloop = True

    async def start(self) -> None:
        # Work left in an older topology's queues moves into this one first (one governor
        # does it; the others go on).
        await migrate(self.broker)
        self.configure()
        s = self.settings
        topology = self.broker.topology
        # Releases alternate between two connections of their own (measured,
        # bench/governor_permits.py: with publishes pipelined on a channel, 2 and 16 connections
        # give the same rate), not the one parks go out on: the broker confirms a channel's
        # publishes in order, and a release behind a flood of parks (a long job's first pass
        # through the frontier) kept its fetch slot waiting a second or more.
        self.publishers = [
            await Broker(self.settings, self.name).connect(declare=False) for _ in range(PUBLISH_CONNECTIONS)
        ]
        self._publisher = itertools.cycle(self.publishers)
        self._depths: dict[str, int] = {}
        self.metrics.collect(self._collect)
        self.events_queue = await self._listen_events()
        await self._read_jobs()
        await self._read_released_log()
        await self._read_park_queues()
        self._loops = [
            asyncio.create_task(self._poll_ready_depth()),
            asyncio.create_task(self._poll_depths()),
            asyncio.create_task(self._look_at_shards()),
            asyncio.create_task(self._tick()),
            asyncio.create_task(self._report()),
            asyncio.create_task(self._recall_every(RECALL_EVERY)),
            asyncio.create_task(self._flush_releases_every(RELEASE_FLUSH)),
            asyncio.create_task(self._dispatch()),
        ]
        # One channel per shard, each consumer with its window (prefetch is per consumer).
        # All at once: a shard's window fills as soon as it is consumed, and one at a time the
        # later shards' declarations would wait behind the first ones' deliveries.
        self.shard_channels: list[AbstractChannel] = [
            await self.broker.channel(prefetch=s.frontier_window) for _ in topology.shard_queues
        ]
        await asyncio.gather(
            *(
                self.broker.consume(
                    spec,
                    Task,
                    self._on_task,
                    stage="governor",
                    channel=channel,
                    max_crashes=SHARD_MAX_CRASHES,
                    also={Parked: self._on_parked},
                )
                for spec, channel in zip(topology.shard_queues, self.shard_channels, strict=True)
            )
        )
        await self.broker.consume(
            topology.unrouted, Task, self._on_unrouted, stage="governor", prefetch=64, also={Parked: self._on_unrouted}
        )
        if any(job.state != "running" for job in self.jobs.values()):
            self._sort_paused()
        log.info(
            "governor %s: %d shards, robots.txt %s",
            self.id,
            len(topology.shard_queues),
            "respected" if self.core.robots is not None else "ignored",
        )

    def configure(self) -> None:
        """Everything but the broker: the core (limits, buckets, robots.txt, the fleet's
        capacity) and the dispatcher's state (tests drive the handlers from here, with a
        broker that records what is published)."""
        s = self.settings
        self.id = governor_id()
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
                max_returns=s.max_returns,
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
                permit_lateness=s.permit_lateness,
                permit_lead=s.permit_lead,
            ),
            key_of=key_function(s.domain_key, s.public_suffix_file),
            robots=robots,
            capacity=FleetCapacity(stale_after=s.heartbeat_timeout, fallback=s.concurrency),
        )
        self.lines: dict[str, DomainLine] = {}
        self._backlog_at, self._backlog_count = -math.inf, 0
        self.jobs: dict[str, JobState] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count(1)
        self._kicked = asyncio.Event()
        self._gated = False  # the dispatcher waits for the fleet's capacity
        self._background: set[asyncio.Task[object]] = set()
        self._lag = [0.0, 0]  # outcome events: sum of their delays on arrival, and their count
        self._releases: list[Event] = []  # released events not yet published
        self._parks = 0  # tasks parked, and released, since the start (for the log)
        self._park_messages = 0  # ...and the messages they were parked in (`Parked`)
        # Parks being gathered: (park queue's delay, second due back, domain) -> its bundle.
        self._bundles: dict[tuple[float, int, str], ParkBundle] = {}
        self._pinned = 0  # tasks of the `Parked` messages being handled, held or still to place
        self._pinned_bytes = 0  # ...and the bodies of those messages (unacked)
        self._parked_handled: set[Delivery] = set()  # ...and those messages
        # `Parked` message id -> when it was taken, and which of its tasks (by index) this
        # governor has passed on since: a delivery of it again takes only the others.
        self._passed: dict[str, tuple[float, set[int]]] = {}
        # Task id -> what is known of its copies, for each task out of a `Parked` that a
        # governor died holding: more copies of it may follow (`_watch_copies`).
        self._copies: dict[str, Copies] = {}
        self._copies_dropped = 0  # copies let go because another was passed on (for the log)
        self._pinned_max = s.frontier_shards * s.frontier_window * PINNED_PER_SLOT
        # Shard -> messages ready in it at the last look (`_look_at_shards`), and the messages
        # of it this governor holds unacked now: a shard with nothing behind them needs no park.
        self._shard_ready: dict[int, int] = {}
        self._in_window: collections.Counter[int] = collections.Counter()
        self._kept = 0  # tasks held past their hold, their shard having nothing behind them
        self._deflected = 0  # `Parked` messages sent back to a park queue whole (`_on_parked`)
        self._returns = [0, 0]  # tasks back from a park since the start, and those parked again at once
        self._recalled = 0  # parks taken back early since the start (`_recall`)
        # Park queue (by delay) -> when the last park put in it expires (`park_slot`). Until
        # `start` finds a queue empty, what an earlier governor left in it may expire as late
        # as its whole TTL from now.
        now = time.time()
        self._park_heads: dict[float, float] = {d: now + d for d in self.broker.topology.delays}
        self._released = 0
        self._sorting: asyncio.Task[None] | None = None
        self._sort_again = False
        # task id -> newest incarnation, of tasks the storer's reconciler rescued (oldest first).
        self.incarnations: collections.OrderedDict[str, int] = collections.OrderedDict()

    async def shutdown(self) -> None:
        # Closing the shard channels returns every held task at once (cancelling the
        # consumers while each held task is returned one by one would have the broker deliver
        # them straight back); the handlers still waiting are then told to let go.
        # First no delivery and no decision more, and the handlers busy parking or releasing
        # finish: an ack sent while its channel closes makes the broker close the whole
        # connection (CHANNEL_ERROR), and the released events not yet published with it.
        self.stopping.set()
        await self.broker.stop_consuming()
        deadline = time.monotonic() + self.settings.publish_timeout + 1.0
        while self.broker.in_flight > len(self._holding()):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        await self._return_parked(deadline)
        for channel in self.shard_channels:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), 5.0)
        for line in self.lines.values():
            for job in line.jobs.values():
                for held in job.held:
                    let_go(held, "drop")
                job.held.clear()
        await super().shutdown()

    def _holding(self) -> set[Delivery]:
        """The messages of the tasks held here (a `Parked` may have many of them held)."""
        return {held.message for line in self.lines.values() for jl in line.jobs.values() for held in jl.held}

    async def _return_parked(self, deadline: float) -> None:
        """At a stop, each task held out of a `Parked` goes back to its shard alone, and the
        message is acked once they all are. Given back whole instead, the message would bring
        back as well every task of it that was parked again, and those would then be twice in
        the frontier. In a rolling upgrade (`tests/e2e/test_rolling_upgrade.py`), with 40
        tasks held out of messages of a hundred or more, the governor then released 4 tasks a
        second for two minutes, copies of stored ones, while the job's last ten waited."""
        parked = self._parked_handled
        for line in self.lines.values():
            for jl in line.jobs.values():
                returned = [held for held in jl.held if held.message in parked]
                for held in returned:
                    jl.held.remove(held)
                    let_go(held, "return", "stopping")
        while parked:  # each handler's message is acked as it returns
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await self._flush_releases()
        for publisher in self.publishers:
            await publisher.close()

    def _spawn(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- events ----------------------------------------------------------------------

    async def _listen_events(self) -> AbstractQueue:
        channel = await self.broker.channel()
        topology = self.broker.topology
        queue = await declare_queue(channel, topology.governor_events(self.id))
        await self.broker.listen(channel, queue.name, self._on_event)
        return queue

    async def _on_event(self, message: Delivery) -> None:
        key = message.routing_key or ""
        core = self.core
        try:
            if key.startswith("outcome."):
                event = self.broker.decode(message.body, message.content_encoding, Event)
                self._lag[0] += time.time() - event.at
                self._lag[1] += 1
                self._wake(core.on_outcome(event))
            elif key.startswith("robots."):
                self._wake(
                    core.on_robots(self.broker.decode(message.body, message.content_encoding, RobotsFetched)),
                    robots=True,
                )
            elif key.startswith("rescued."):
                self._on_rescued(self.broker.decode(message.body, message.content_encoding, Rescued))
            elif key == HEARTBEAT:
                core.on_heartbeat(self.broker.decode(message.body, message.content_encoding, FetcherHeartbeat))
                self._kick()
            elif key == STATUS and message.reply_to:
                self._spawn(self._answer_status(message.reply_to, message))
        except DecodeError as exc:
            log.debug("ignoring an undecodable event %s: %s", key, exc)

    async def _read_released_log(self) -> None:
        """Consume the released log from a permit lifetime and a fetch ago; wait to reach now.

        The marker, an empty batch of our own, is appended after the consumer starts: when
        it comes back, every release before it has been heard.
        """
        topology = self.broker.topology
        config = self.core.config
        since = time.time() - config.permit_ttl - config.fetch_deadline
        caught_up = asyncio.Event()
        marker = uuid.uuid4().hex

        async def on_batch(batch: EventBatch, message: Delivery) -> None:
            if message.headers.get(GOVERNOR_HEADER) == self.id:
                if message.headers.get(MARKER_HEADER) == marker:
                    caught_up.set()
                return  # our own releases: already counted
            for event in batch.events:
                self._wake(self.core.on_released(event))

        await self.broker.consume(
            topology.released_log,
            EventBatch,
            on_batch,
            stage="governor",
            prefetch=500,
            dead_letter=False,
            arguments={"x-stream-offset": datetime.datetime.fromtimestamp(since, datetime.UTC)},
        )
        await self.broker.publish(
            topology.events,
            RELEASED,
            EventBatch(events=[]),
            headers={GOVERNOR_HEADER: self.id, MARKER_HEADER: marker},
        )
        try:
            await asyncio.wait_for(caught_up.wait(), CATCH_UP_LIMIT)
        except TimeoutError:
            log.warning("the released log was not read to its end in %.0f s; releasing anyway", CATCH_UP_LIMIT)

    def _on_rescued(self, rescued: Rescued) -> None:
        self.incarnations[rescued.task_id] = max(rescued.incarnation, self.incarnations.get(rescued.task_id, 0))
        self.incarnations.move_to_end(rescued.task_id)
        while len(self.incarnations) > RESCUED_MEMORY:
            self.incarnations.popitem(last=False)

    def _stale(self, task: Task) -> bool:
        """A copy of a task the reconciler has since republished: drop it, the new one runs."""
        return task.incarnation < self.incarnations.get(task.id, 0)

    def _wake(self, key: str | None, robots: bool = False) -> None:
        """Something changed for this domain key: its domains are due now."""
        if key is not None:
            now = time.time()
            for domain in self.core.domains_of(key):
                line = self.lines.get(domain)
                if line is None:
                    continue
                if robots and line.blocked_until > now:
                    line.blocked_until = 0.0  # robots.txt answered: what comes next may go
                if line.held_count():
                    self._schedule(domain, line, now)
        self._kick()

    def _kick(self) -> None:
        self._kicked.set()

    async def _answer_status(self, reply_to: str, message: Delivery) -> None:
        core = self.core
        now = time.time()
        try:
            request = self.broker.decode(message.body, message.content_encoding, StatusRequest)
        except DecodeError:  # an older client: its defaults
            request = StatusRequest()
        rows, total = select_domains(self._rows(now), request)
        slots, fetchers, in_flight = core.fleet(now)
        answer = GovernorStatus(
            governor=self.id,
            started=core.started,
            capacity=slots,
            fetchers=fetchers,
            in_flight=in_flight,
            domains=rows,
            total_domains=total,
        )
        with contextlib.suppress(PublishFailed):
            await self.broker.publish(
                "", reply_to, answer, mandatory=False, correlation_id=message.correlation_id, persistent=False
            )

    def _rows(self, now: float) -> list[dict[str, Any]]:
        rows = self.core.snapshot()
        for row in rows:
            line = self.lines.get(str(row["domain"]))
            jobs = line.jobs.values() if line is not None else ()
            oldest = min((h.since for j in jobs for h in j.held), default=now)
            row["held"] = sum(len(j.held) for j in jobs)
            row["parked"] = sum(j.parked(now) for j in jobs)
            row["jobs"] = len(line.jobs) if line is not None else 0
            row["oldest_held"] = round(now - oldest, 3)
        return rows

    # -- jobs ------------------------------------------------------------------------

    async def _read_jobs(self) -> None:
        """Read the jobs stream whole (and keep reading it) before taking any task."""
        heard = asyncio.Event()

        async def on_record(record: JobControl, _: Delivery) -> None:
            self._apply_job(record)
            heard.set()

        await self.broker.consume(
            self.broker.topology.jobs,
            JobControl,
            on_record,
            stage="governor",
            prefetch=1000,
            dead_letter=False,
            arguments={"x-stream-offset": "first"},
        )
        while True:  # read to its end: no record for a moment
            heard.clear()
            try:
                await asyncio.wait_for(heard.wait(), JOBS_QUIET)
            except TimeoutError:
                return

    def _apply_job(self, record: JobControl) -> None:
        job = self.jobs.setdefault(record.job, JobState())
        if record.action == "weight":
            if record.at >= job.weight_at and record.weight is not None:
                job.weight, job.weight_at = record.weight, record.at
            return
        if record.at < job.state_at or job.state == "cancelled":
            return  # an older record, or after a cancel (final)
        before = job.state
        job.state = STATE_AFTER[record.action]
        job.state_at = record.at
        if job.state == before:
            return
        log.info("job %s: %s", record.job, job.state)
        if job.state != "running":
            # Its held tasks let go: to the paused queue, or dead as cancelled.
            for line in self.lines.values():
                held_line = line.jobs.get(record.job)
                if held_line is None:
                    continue
                for held in held_line.held:
                    if job.state == "paused":
                        let_go(held, "paused")
                    else:
                        let_go(held, "dead", ("cancelled", f"job {record.job} was cancelled"))
                held_line.held.clear()
        if before == "paused" or job.state == "cancelled":
            self._sort_paused()

    def _job(self, name: str) -> JobState:
        return self.jobs.get(name) or JobState()

    def _sort_paused(self) -> None:
        """Sort `frontier.paused` through once (again if asked meanwhile)."""
        if self._sorting is not None and not self._sorting.done():
            self._sort_again = True
            return
        self._sorting = asyncio.get_running_loop().create_task(self._sort_paused_queue())

    async def _sort_paused_queue(self) -> None:
        """Each task in the paused queue goes back to the frontier unless its job is still
        paused (then to the queue's end); a cancelled job's go too, to end dead there.
        Bounded by the depth read first; several governors may sort at once."""
        topology = self.broker.topology
        while True:
            self._sort_again = False
            channel = await self.broker.raw_channel()
            try:
                found = await queue_depth(channel, topology.paused)
                if found is None:
                    raise ConnectionError("the paused queue could not be read")
                for _ in range(found[0]):
                    got = await channel.basic_get(topology.paused, no_ack=False)
                    if got.delivery_tag is None:
                        break
                    try:
                        task = self.broker.decode(got.body, got.header.properties.content_encoding, Task)
                        still = self._job(task.job).state == "paused"
                        exchange, key = (
                            ("", topology.paused) if still else (topology.frontier, topology.shard_key(task.domain))
                        )
                    except DecodeError:  # the shard's consumer dead-letters it as undecodable
                        exchange, key = topology.frontier, "s.0"
                    await self.broker.forward(exchange, key, got.body, copy_properties(got.header.properties))
                    await channel.basic_ack(got.delivery_tag)
            except (PublishFailed, aiormq.exceptions.AMQPError, ConnectionError) as exc:
                log.warning("sorting the paused queue stopped: %s; tried again shortly", exc)
                await asyncio.sleep(1.0)
                self._sort_again = True
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
            if not self._sort_again or self.stopping.is_set():
                return

    # -- the frontier ------------------------------------------------------------------

    async def _on_unrouted(self, task: Task | Parked, message: Delivery) -> None:
        """A task (or parked tasks) under a key no shard is bound to (an older topology's, or
        another shard count's): published again under its shard's key."""
        topology = self.broker.topology
        await self.broker.publish(topology.frontier, topology.shard_key(task.domain), task)

    def _line(self, domain: str) -> DomainLine:
        line = self.lines.get(domain)
        if line is None:
            line = self.lines[domain] = DomainLine()
            self.core.queue(domain)
        return line

    def _share(self, domain: str, line: DomainLine, job: str) -> float:
        """This job's share of the domain's rate (tasks per second), by the weights of the
        jobs the domain has work of. A robots.txt task (a fetcher gives one back when its
        permit came late) is nobody's work: counted as a job of its own, it halved the
        share while it was held, and a job's backlog arriving then was parked twice as long
        (120 s tiers for a domain a minute from its end, in `bench/speed.py`)."""
        rate = self.core.rate_of(domain)
        now = time.time()
        weights = sum(
            self._job(name).weight
            for name, jl in line.jobs.items()
            if name == job or (name != ROBOTS_JOB and (jl.held or jl.parked(now)))
        )
        return rate * self._job(job).weight / max(weights, 1e-9)

    def _hold_limit(self, domain: str, line: DomainLine, job: str) -> int:
        wanted = self._share(domain, line, job) * self.settings.hold_horizon
        return max(1, min(MAX_HELD_PER_JOB, math.ceil(wanted)))

    def _park_delay(self, domain: str, line: DomainLine, job: str, now: float, margin: float = PACE_MARGIN) -> float:
        rate = self.core.rate_of(domain)
        share = self._share(domain, line, job)
        longest = max(PACED_PARK_MAX, self._backlog(now) / PARK_BUDGET)
        return park_delay(line.jobs[job], now, share, rate, line.pace(now), line.blocked_until, longest, margin)

    def _backlog(self, now: float) -> int:
        """Every task held here and parked by this governor, counted again at most once a second."""
        if now - self._backlog_at >= 1.0:
            self._backlog_at = now
            self._backlog_count = sum(
                len(jl.held) + jl.parked(now) for line in self.lines.values() for jl in line.jobs.values()
            )
        return self._backlog_count

    async def _read_park_queues(self) -> None:
        """Which park queues are empty: a park in one of them waits behind nothing."""
        topology = self.broker.topology
        channel = await self.broker.raw_channel()
        try:
            for delay in topology.delays:
                if channel.is_closed:
                    channel = await self.broker.raw_channel()
                depth = await queue_depth(channel, topology.park_exchange(delay))
                if depth is not None and depth[0] == 0:
                    self._park_heads[delay] = 0.0
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _park(self, task: Task, line: DomainLine, job: JobLine, delay: float, exact: bool = True) -> None:
        """Park `task` for about `delay` seconds (`park_slot`): returned once the broker has
        it, in a `Parked` with the other parks of its domain due back from the same park queue
        in the same second, gathered for `PARK_GATHER` seconds."""
        now = time.time()
        tier, away = park_slot(self.broker.topology.delays, self._park_heads, now, delay, exact)
        back = back_by(now, away)
        job.returns[back] = job.returns.get(back, 0) + 1  # before the await: the next park counts it
        line.parked_at(tier, now + away)
        key = (tier, back, task.domain)
        bundle = self._bundles.get(key)
        if bundle is None:
            bundle = self._bundles[key] = ParkBundle(tier, away, back, asyncio.get_running_loop().create_future())
            asyncio.get_running_loop().call_later(PARK_GATHER, self._send_parks, key, bundle)
        bundle.add(task, away)
        if len(bundle.tasks) >= MAX_PARKED:
            self._send_parks(key, bundle)
        try:
            await asyncio.shield(bundle.sent)
        except BaseException:
            job.returns[back] -= 1
            raise
        self._parks += 1

    def _send_parks(self, key: tuple[float, int, str], bundle: ParkBundle) -> None:
        """Publish a gathered bundle of parks (once): alone, a task goes as itself."""
        if self._bundles.get(key) is bundle:
            del self._bundles[key]
        if bundle.sending:
            return
        bundle.sending = True
        self._spawn(self._publish_parks(bundle))

    async def _publish_parks(self, bundle: ParkBundle) -> None:
        topology = self.broker.topology
        body: Task | Parked = bundle.tasks[0] if len(bundle.tasks) == 1 else Parked(tasks=bundle.tasks)
        try:
            await self.broker.publish(
                topology.park_exchange(bundle.tier),
                topology.shard_key(bundle.tasks[0].domain),
                body,
                headers={PARKED_HEADER: bundle.back},
                expiration=None if bundle.away == bundle.tier else bundle.away,
            )
        except asyncio.CancelledError:
            bundle.sent.cancel()
            raise
        except Exception as exc:
            bundle.sent.set_exception(exc)
        else:
            bundle.sent.set_result(None)
            self._park_messages += 1

    def _starved(self, now: float) -> tuple[int, list[float], set[str]]:
        """How many parks to take back early, from which park queues (longest first), for
        which domains: those idle for want of their own parked tasks (`DomainLine.starved`).
        Also while the fleet is full: the idle domain's share went to the others meanwhile,
        but its own work was late, and when the others finished it was left with a long
        tail (a small-page run ended 1.6-1.8 s after its median domain, against 0.1-0.2,
        docs/benchmarks.md, eighth round). Taking parks back costs a publish per `Parked`."""
        want, tiers, starved = 0, set[float](), set[str]()
        for domain, line in self.lines.items():
            if not line.parked_in or not line.starved(now, self.core.rate_of(domain)):
                continue
            parked = sum(
                jl.parked(now)
                for name, jl in line.jobs.items()
                if name != ROBOTS_JOB and self._job(name).state == "running"
            )
            out = line.parks_out(now + RECALL_EVERY)
            if parked and out:
                want += min(parked, MAX_HELD_PER_JOB)
                tiers.update(out)
                starved.add(domain)
        return min(want, RECALL_MAX), sorted(tiers, reverse=True), starved

    async def _recall_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self.stopping.is_set():  # its holds let go: every domain looks idle
                continue
            try:
                want, tiers, starved = self._starved(time.time())
                if want:
                    self._recalled += await self._recall(tiers, want, starved)
            except Exception:  # never let it die: an idle domain would wait out its parks again
                log.exception("recalling parks failed")

    async def _recall(self, tiers: list[float], want: int, starved: set[str]) -> int:
        """Take up to `want` parks out of these park queues early, into their shards, as their
        expiry would (without their own expiration, which in a shard would drop them), and
        return how many. A domain's parks are timed by its pace, a guess: when the domains
        sharing the fetchers finish, its pace rises and its last tasks sat parked at the old
        one, the fetchers idle (a domain waited 3-16 s in small-page runs, docs/benchmarks.md,
        seventh round). A park queue holds every domain's parks in the order they were put in:
        what is taken for another domain is held or parked again where it arrives, and a
        queue is left once `RECALL_MISSES` in a row were others'. A crash between the copy's
        confirm and the ack leaves a task twice in the frontier, as a park's own would."""
        topology = self.broker.topology
        channel = await self.broker.raw_channel()
        taken = 0  # tasks (a `Parked` holds many)
        try:
            for tier in tiers:
                batch: list[aiormq.abc.DeliveredMessage] = []
                misses = 0
                while taken < want and misses < RECALL_MISSES:
                    got = await channel.basic_get(topology.park_exchange(tier), no_ack=False)
                    if got.delivery_tag is None:  # Basic.GetEmpty
                        break
                    batch.append(got)
                    tasks = self._parked_tasks(got)
                    taken += max(len(tasks), 1)
                    misses = 0 if tasks and tasks[0].domain in starved else misses + 1

                # Unacked on a failure: the channel's close gives them back to their park queue.
                await self.broker.relay(channel, batch, lambda m: (topology.frontier, m.routing_key or ""), False)
                if taken >= want:
                    break
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        if taken:
            log.debug("%d parks taken back early for %d idle domains", taken, len(starved))
        return taken

    def _parked_tasks(self, message: aiormq.abc.DeliveredMessage) -> list[Task]:
        """The tasks in a park (none if it does not decode: it is moved all the same)."""
        try:
            return frontier_tasks(self.broker, message)
        except DecodeError:
            return []

    async def _to_paused(self, task: Task) -> None:
        await self.broker.publish("", self.broker.topology.paused, task)

    async def _on_parked(self, parked: Parked, message: Delivery) -> None:
        """Tasks parked together, back in their shard: each is held or parked again as if it
        came alone, and the message is acked (by the layer, once this returns) when every
        one of them has been released, parked again or ended. A task whose job was cancelled
        becomes a dead letter of its own, and one to return goes back to its shard alone. A
        failure to pass any of them on, or a closed channel, returns the whole message; this
        governor takes again only the tasks it had not passed on (`_passed_of`). A stop gives
        back the tasks it holds alone (`_return_parked`). The next governor after a crash
        knows nothing of what was passed on: it takes one copy of each task and lets the
        others go (`_watch_copies`), and a fetcher asks the store before fetching that copy.

        The message stays unacked until its last task is released, but a task released is
        not kept for it: the list is emptied as the tasks are taken, so what stays in memory
        is the body and the tasks still held (a decoded task with a spec is about 5 KB). Those
        tasks, and the bodies, are bounded (`PINNED_PER_SLOT`, `PINNED_BODIES`); a message
        that would go past either goes back to the shortest park queue whole. On a failure
        the list is decoded again from the body, for the dead letters the layer makes at the
        end of those not passed on.
        """
        if self.stopping.is_set():
            raise Requeue("stopping", backoff=False)
        topology = self.broker.topology
        if message.crashes and message.message_id not in self._passed:
            self._watch_copies(parked.tasks)
        passed = self._passed_of(message)
        left = [(i, task) for i, task in enumerate(parked.tasks) if i not in passed]
        count, size = len(left), len(message.body)
        if not left or (self._pinned and (
            self._pinned + count > self._pinned_max or self._pinned_bytes + size > PINNED_BODIES
        )):
            if left:
                # Its tasks would stay in memory until the last of them is released: back to
                # the shortest park queue, for when the messages handled now are done.
                delay = topology.delays[0]
                await self.broker.publish(
                    topology.park_exchange(delay),
                    topology.shard_key(parked.domain),
                    Parked(tasks=[task for _, task in left]),
                    headers={PARKED_HEADER: back_by(time.time(), delay)},
                )
                self._deflected += 1
            if message.message_id is not None:
                self._passed.pop(message.message_id, None)
            return
        taking = [self._take_parked(task, message, passed, i) for i, task in left]
        del left
        self._pinned += count
        self._pinned_bytes += size
        self._parked_handled.add(message)
        shard = topology.shard_of(parked.domain)
        self._in_window[shard] += 1
        parked.tasks.clear()
        done = False
        try:
            outcomes = await asyncio.gather(*taking, return_exceptions=True)
            failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            failures.sort(key=lambda failure: not isinstance(failure, asyncio.CancelledError))
            if failures:
                raise failures[0]
            done = not message.channel_closed  # acked next: it will not come back
        except BaseException:
            tasks = self.broker.decode(message.body, message.content_encoding, Parked).tasks
            parked.tasks[:] = [task for i, task in enumerate(tasks) if i not in passed]
            raise
        finally:
            self._pinned_bytes -= size
            self._parked_handled.discard(message)
            self._in_window[shard] -= 1
            if message.message_id is not None:
                if done:
                    self._passed.pop(message.message_id, None)
                else:  # given back: remembered from now
                    self._passed[message.message_id] = (time.time(), passed)

    def _watch_copies(self, tasks: list[Task]) -> None:
        """Look out for copies of these tasks, out of a `Parked` a governor died holding.

        That governor had passed some of them on (released, parked again) before it died, and
        what it knew (`_passed`) died with it, so this message brings back a copy of each of
        those; a task parked again and again may have several, in several messages, some
        unacked (all back now) and some still in park queues. Each copy released was a page
        fetched again: 116-358 extra fetches in a 160-page job at 2 pages a second, some pages
        eight times (`tests/e2e/test_rolling_upgrade.py`). Here the first copy of each that
        this governor takes is the one that goes on, marked `maybe_done`, and the others
        (unmarked) are let go (`_take`), unless it is let go without being passed on (its
        channel closed, a return). Marked, it is known again wherever it comes back from (a
        park of this governor's, a retry). A copy the dead governor had released may be in
        flight or stored already, which nothing here can see: the fetcher asks the store
        before fetching a marked task.

        Remembered for the longest park and a minute, at most `COPIES_MEMORY` tasks (the
        oldest forgotten first: then a copy is fetched again, never lost)."""
        log.info("a Parked of %d tasks came back from a governor that died holding it: one copy of each goes on",
                 len(tasks))
        now = time.time()
        for task in tasks:
            if task.id not in self._copies:
                self._copies[task.id] = Copies(now)
        while len(self._copies) > COPIES_MEMORY:
            del self._copies[next(iter(self._copies))]

    def _passed_of(self, message: Delivery) -> set[int]:
        """The tasks of this `Parked` (by index) passed on by an earlier delivery of it, and
        the set this one adds to. A `Parked` stays unacked while any of its tasks is held,
        and meanwhile the others are released or parked again; when its channel closes (a
        lost connection) or its handling fails, the broker or the layer delivers it again,
        whole. Taking every task again then put those parked again twice in the frontier,
        and those released twice in fetch.ready: after the broker closed every connection,
        a job of 160 pages fetched 120-170 pages again (`tests/e2e/test_rolling_upgrade.py`).
        What a governor that dies knew dies with it: the next one looks out for copies
        instead (`_watch_copies`)."""
        key = message.message_id
        if key is None:
            return set()
        known = self._passed.get(key)
        if known is None:
            known = self._passed[key] = (time.time(), set())
        return known[1]

    async def _take_parked(self, task: Task, message: Delivery, passed: set[int], index: int) -> None:
        """One task of a `Parked`: taken as if it came alone; a dead one becomes a dead letter
        of its own, and one to return goes back to its shard alone. Once passed on, its index
        goes into `passed`. Counted in `_pinned` until this returns."""
        topology = self.broker.topology
        try:
            if not await self._take(task, message):
                return
        except Dead as outcome:
            queue = topology.shard_queue(topology.shard_of(task.domain)).name
            about = outcome.about or task
            await self.broker.publish_dead(about.dead_letter("governor", outcome.reason, outcome.detail, queue))
        except Requeue:
            if message.channel_closed:  # all of it comes back
                raise
            await self.broker.publish(topology.frontier, topology.shard_key(task.domain), task)
        finally:
            self._pinned -= 1
        passed.add(index)

    async def _on_task(self, task: Task, message: Delivery) -> None:
        """A task from a shard: one message of the shard's window until it is released,
        parked or ended (the layer acks it when this returns)."""
        shard = self.broker.topology.shard_of(task.domain)
        self._in_window[shard] += 1
        try:
            await self._take(task, message)
        finally:
            self._in_window[shard] -= 1

    async def _take(self, task: Task, message: Delivery) -> bool:
        """Hold, park or end a task from a shard; False when it was let go without being
        passed on (its channel closed: the broker has it again)."""
        if self.stopping.is_set():
            raise Requeue("stopping", backoff=False)
        if self._stale(task):  # rescued meanwhile: the new copy is in the frontier
            log.info("dropping stale copy %d of rescued task %s", task.incarnation, task.id)
            return True
        copy = self._copies.get(task.id) if self._copies else None
        if copy is None or task.maybe_done:  # not watched, or the copy that went on, back
            return await self._hold_or_park(task, message)
        if copy.passed or (copy.holder is not None and not copy.holder.channel_closed):
            self._copies_dropped += 1  # another copy of it is held here or went on
            return True
        copy.holder = message
        try:
            passed = await self._hold_or_park(task.model_copy(update={"maybe_done": True}), message)
        except Dead:
            copy.passed = True  # a dead letter now
            raise
        finally:
            if copy.holder is message:  # not taken over by a copy redelivered meanwhile
                copy.holder = None
        copy.passed = copy.passed or passed
        return passed

    async def _hold_or_park(self, task: Task, message: Delivery) -> bool:
        """`_take` for a task that is no stale copy."""
        domain = task.domain
        line = self._line(domain)
        now = time.time()
        line.touched = now
        jl = line.jobs.get(task.job)
        if jl is None:
            jl = line.jobs[task.job] = JobLine(served=min((j.served for j in line.jobs.values()), default=0.0))
        back = message.headers.get(PARKED_HEADER)
        if isinstance(back, int):
            jl.came_back(back)  # counted as still to come no longer
            self._returns[0] += 1
        if not await self._to_hold(task, line, jl, now, returned=isinstance(back, int)):
            self._returns[1] += isinstance(back, int)
            return True
        self.core.activate(domain)
        held = Held(task, message, now, asyncio.get_running_loop().create_future())
        jl.held.append(held)
        if line.busy_since is None:
            line.busy_since = now
        if not line.scheduled:
            self._schedule(domain, line, now)
        self._kick()
        try:
            action, value = await held.decided
        finally:
            if not held.decided.done():  # cancelled (shutdown): no longer held
                with contextlib.suppress(ValueError):
                    jl.held.remove(held)
        await self._carry_out(task, line, jl, action, value)
        return action != "drop"

    async def _to_hold(self, task: Task, line: DomainLine, jl: JobLine, now: float, returned: bool = False) -> bool:
        """Whether a task that arrived is to be held; otherwise it has gone where its job's
        state or its domain's backlog sends it."""
        state = self._job(task.job).state
        if state == "cancelled":
            raise Dead("cancelled", f"job {task.job} was cancelled", about=task)
        if state == "paused":
            await self._to_paused(task)
            return False
        blocked, held = line.blocked_until > now, len(jl.held)
        limit = self._hold_limit(task.domain, line, task.job)
        if not blocked and held < limit:
            return True
        # Full (the pace is looked at only here, off the path of a task that is held).
        pace = line.pace(now)
        if not blocked and held < limit + self._room_alone(pace, limit) and self._nothing_behind(task.domain):
            self._kept += 1
            return True
        margin = RETURN_MARGIN if returned else PACE_MARGIN
        exact = not paced(self.core.rate_of(task.domain), pace, margin)
        if not blocked and returned and not exact:
            assert pace is not None  # paced
            if held < limit + return_room(pace, self.settings.hold_horizon):
                return True
        await self._park(task, line, jl, self._park_delay(task.domain, line, task.job, now, margin), exact)
        return False

    def _room_alone(self, pace: float | None, limit: int) -> int:
        """How many tasks past its hold a domain with nothing behind it in its shard may
        hold: what it drains over `HUTCH_HOLD_HORIZON` seconds at its measured pace (the
        hold again while that is unknown). Parks come back faster than a paced domain drains
        (the margins that keep it from idling), so without a bound its held tasks grew to
        the bound on `Parked` memory on the 100,000-URL run (16,000 of them), and the parks
        back past that bound went round the shortest park queue again and again."""
        return math.ceil(pace * self.settings.hold_horizon) if pace else limit

    def _nothing_behind(self, domain: str) -> bool:
        """Whether a task of `domain` past its hold may stay held rather than be parked: its
        shard had no task waiting at the last look, this governor holds fewer than half of
        the shard's window of its messages, and the tasks of `Parked` messages it holds or
        has still to place are less than an eighth of their bound (`KEEP_SHARE`, 2,048 by
        default): with no such bound the 100,000-URL run held 16,000 tasks (`_room_alone`).

        A park is how the governor looks past one domain's backlog to the domains behind it
        in the shard: the window is a few hundred messages, the backlog may be millions.
        With nothing behind, a park only sends the task away to have it back, and tasks
        back early found their hold full and went away again: on small pages 504-635 of
        the 767-834 tasks a second back from a park, against 236-300 permits
        (docs/benchmarks.md, ninth round). The half of the window left free still takes
        what comes into the shard before the next look, and parks it as before once its
        tasks pass the hold. A task in a `Parked` message takes no slot of its own."""
        shard = self.broker.topology.shard_of(domain)
        if self._shard_ready.get(shard, 1) > 0 or KEEP_SHARE * self._pinned >= self._pinned_max:
            return False
        return self._in_window[shard] < self.settings.frontier_window // 2

    async def _look_at_shards(self) -> None:
        """Read how many tasks wait in each frontier shard, every `SHARD_LOOK` seconds (for
        `_nothing_behind`, and summed for `hutch_queue_depth{queue="frontier"}`)."""
        topology = self.broker.topology
        channel: aiormq.abc.AbstractChannel | None = None
        try:
            while True:
                for shard, spec in enumerate(topology.shard_queues):
                    if channel is None or channel.is_closed:  # a failed look closes it, so does a reconnect
                        channel = None
                        with contextlib.suppress(Exception):
                            channel = await self.broker.raw_channel()
                    found = None if channel is None else await queue_depth(channel, spec.name)
                    if found is None:
                        self._shard_ready.pop(shard, None)  # unknown: parks as before
                    else:
                        self._shard_ready[shard] = found[0]
                await asyncio.sleep(SHARD_LOOK)
        finally:
            if channel is not None:
                with contextlib.suppress(Exception):
                    await channel.close()

    async def _carry_out(self, task: Task, line: DomainLine, jl: JobLine, action: Action, value: Any) -> None:
        """What the scheduler decided for a held task."""
        if action == "release":
            await self._publish_release(value, task.domain)
        elif action == "park":
            await self._park(task, line, jl, value)
        elif action == "paused":
            await self._to_paused(task)
        elif action == "dead":
            raise Dead(value[0], value[1], about=task)
        elif action == "return":
            raise Requeue(str(value), backoff=False)

    def _schedule(self, domain: str, line: DomainLine, at: float) -> None:
        line.seq = next(self._seq)
        line.scheduled = True
        heapq.heappush(self._heap, (at, line.seq, domain))

    def _next_held(self, line: DomainLine) -> tuple[str, JobLine, Held] | None:
        """The held task of the job with the least service per weight; drops what a closed
        channel has returned to the broker already."""
        best: tuple[float, str, JobLine] | None = None
        for name, jl in line.jobs.items():
            while jl.held and (jl.held[0].message.channel_closed or jl.held[0].decided.done()):
                let_go(jl.held.popleft(), "drop")
            if jl.held and (best is None or jl.served < best[0]):
                best = (jl.served, name, jl)
        if best is None:
            return None
        return best[1], best[2], best[2].held[0]

    async def _dispatch(self) -> None:
        while True:
            try:
                timeout = None if self.stopping.is_set() else self._dispatch_due()
            except Exception:  # never let the dispatcher die: every held task would wait
                log.exception("dispatching failed")
                timeout = TICK
            self._kicked.clear()
            # A timer handle, not `wait_for`: this loop turns on every kick, and `wait_for`
            # makes a task each time.
            timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, self._kicked.set)
            await self._kicked.wait()
            if timer is not None:
                timer.cancel()

    def _dispatch_due(self) -> float | None:
        """Decide for every domain due now; seconds until the next one is due (None: none is)."""
        heap = self._heap
        now = time.time()
        decided = 0
        while heap and heap[0][0] <= now:
            due, seq, domain = heap[0]
            line = self.lines.get(domain)
            if line is None or line.seq != seq:
                heapq.heappop(heap)
                continue
            if self._decide(domain, line, due, now) == "gate":
                return TICK  # the fleet is full: the order stands until capacity comes back
            decided += 1
            if decided >= DISPATCH_SLICE:
                return 0.0
        return max(heap[0][0] - now, 0.0) if heap else None

    def _decide(self, domain: str, line: DomainLine, due: float, now: float) -> Decided:
        core = self.core
        heapq.heappop(self._heap)
        line.scheduled = False
        picked = self._next_held(line)
        if picked is None:
            return "empty"
        job_name, jl, held = picked
        verdict = core.check(held.task, domain)
        if verdict.action == "release":
            if verdict.robots is not None:
                # robots.txt first: it takes this domain's token; the page waits for it.
                robots = core.commit(core.robots_task(verdict.robots, domain), domain)
                self._spawn(self._publish_release(robots, domain, quiet=True))
            else:
                jl.held.popleft()
                jl.served += 1.0 / self._job(job_name).weight
                let_go(held, "release", core.commit(held.task, domain))
                line.released(now)
                self.metrics.count(self.metrics.permits, domain)
                self.metrics.permit_wait.observe(max(0.0, now - held.since))
                if not jl.held and not line.held_count():
                    line.busy_since = None
            self._schedule(domain, line, now)
            return "release"
        if verdict.action in ("dead", "drop"):
            jl.held.popleft()
            if verdict.action == "dead":
                let_go(held, "dead", ("robots", verdict.why))
            else:
                let_go(held, "drop")
            self._schedule(domain, line, now)
            return verdict.action
        if verdict.gate:
            self._schedule(domain, line, due)  # keeps its place in the order
            return "gate"
        wait = verdict.until - now
        if verdict.in_flight:
            # Its `until` is the first lease's expiry, the worst case: an outcome ends a lease
            # (and wakes the domain) long before, so this is no long wait to park for.
            self._schedule(domain, line, min(verdict.until, now + 1.0))
            return "wait"
        if wait > self.settings.max_hold:
            # A long wait is not spent holding messages: every held task is parked for it.
            line.blocked_until = verdict.until
            for jl_each in line.jobs.values():
                for each in jl_each.held:
                    let_go(each, "park", wait)
                jl_each.held.clear()
            line.busy_since = None
            log.debug("domain %s waits %.1f s (%s): its tasks parked", domain, wait, verdict.why)
            return "parked"
        self._schedule(domain, line, verdict.until)
        return "wait"

    async def _publish_release(self, task: Task, domain: str, quiet: bool = False) -> None:
        assert task.permit is not None
        # Issued as it goes out, not when it was decided: a fetcher times a permit by its
        # transit from here (`hutch.services.fetcher.lateness`), and this loop's own delays
        # before the publish would otherwise count as transit and vary from permit to permit.
        assert task.permit is not None  # a released task carries its permit
        permit = task.permit.model_copy(update={"issued": time.time()})
        task = task.model_copy(update={"permit": permit})
        event = Event(
            kind="released",
            task_id=task.id,
            job=task.job,
            domain=domain,
            attempt=task.attempts,
            permit_id=permit.id,
            at=permit.issued,
            incarnation=task.incarnation,
        )
        try:
            await next(self._publisher).publish(self.broker.topology.work, FETCH_KEY, task)
        except BaseException as exc:
            self.core.rollback(task)
            if not quiet:
                raise
            log.warning("releasing %s failed: %s", task.url, exc)
            return
        self._releases.append(event)
        self._released += 1
        if len(self._releases) >= RELEASE_BATCH:
            self._spawn(self._flush_releases())

    # -- housekeeping ------------------------------------------------------------------

    async def _poll_ready_depth(self) -> None:
        channel = await self.broker.channel()
        name = self.broker.topology.fetch_ready
        while True:
            depth = await queue_depth(channel, name)
            if depth is not None:
                self.core.saw_ready_depth(depth[0])
            else:  # reconnecting: keep the last figure
                with contextlib.suppress(Exception):
                    channel = await self.broker.channel()
            self._kick()
            await asyncio.sleep(READY_POLL)

    async def _poll_depths(self) -> None:
        """Read every fixed queue's depth for `hutch_queue_depth`, the frontier's shards as one."""
        topology = self.broker.topology
        # fetch.ready's depth is read four times a second already (`_poll_ready_depth`).
        fixed = [topology.parse, topology.store, topology.dlq, topology.ledger,
                 topology.paused, topology.unrouted, *topology.delay_queues]
        channel = await self.broker.channel()
        while True:
            depths: dict[str, int] = {}
            for name in fixed:
                found = await queue_depth(channel, name)
                if found is not None:
                    depths[name.removeprefix(topology.prefix)] = found[0]
            # The shards' depths are read every `SHARD_LOOK` already (`_look_at_shards`).
            if len(self._shard_ready) == len(topology.shard_queues):
                depths["frontier"] = sum(self._shard_ready.values())
            self._depths = depths
            if channel.is_closed:  # a failed declare closes it, and so does a reconnect
                with contextlib.suppress(Exception):
                    channel = await self.broker.channel()
            await asyncio.sleep(self.settings.metrics_interval)

    def _collect(self) -> Iterator[Metric]:
        """The governor's gauges, read from its state at each scrape."""
        now = time.time()
        label = self.metrics.domains.peek
        topology = self.broker.topology
        depths = {topology.fetch_ready.removeprefix(topology.prefix): self.core.ready_depth, **self._depths}
        yield gauge("hutch_queue_depth", "Messages ready in a queue (frontier: all shards)", ["queue"],
                    (((name,), float(n)) for name, n in depths.items()))
        backlog: dict[str, int] = {}
        oldest: list[tuple[str, float]] = []
        for domain, line in self.lines.items():
            backlog[domain] = line.held_count() + sum(jl.parked(now) for jl in line.jobs.values())
            submitted = [h.task.submitted_at for jl in line.jobs.values() for h in jl.held]
            if submitted:
                oldest.append((label(domain), max(0.0, now - min(submitted))))
        yield gauge("hutch_oldest_task_age_seconds", "Age of the oldest task waiting for a permit, by domain",
                    ["domain"], (((d,), v) for d, v in by_label(oldest, max).items()))
        yield gauge("hutch_domain_backlog", "Tasks waiting for a permit (held and parked), by domain", ["domain"],
                    (((d,), v) for d, v in by_label(((label(d), float(n)) for d, n in backlog.items()),
                                                    lambda a, b: a + b).items()))
        rates = ((label(domain), self.core.rate_of(domain)) for domain in self.core.queues)
        yield gauge("hutch_domain_rate", "Current fetch rate allowed, requests per second, by domain", ["domain"],
                    (((d,), v) for d, v in by_label(rates, lambda a, b: a + b).items()))
        wanted, in_flight = self.core.demand(backlog)
        yield gauge("hutch_fetch_slots_wanted", "Fetch slots the limits would keep busy now, over domains with backlog",
                    [], [((), wanted)])
        yield gauge("hutch_fetches_in_flight", "Fetches in flight for the domains with backlog", [],
                    [((), float(in_flight))])
        yield gauge("hutch_fetch_demand", "Slots wanted minus fetches in flight: above 0, the fleet holds limits back",
                    [], [((), wanted - in_flight)])

    async def _tick(self) -> None:
        sweeps = 0
        while True:
            await asyncio.sleep(TICK)
            for key in self.core.expire():
                self._wake(key)
            self._kick()
            sweeps += 1
            if sweeps % 50 == 0:
                self._sweep(time.time())

    def _sweep(self, now: float) -> None:
        """Let go of what a closed channel returned, park what waited too long for capacity;
        forget domains idle for `domain_idle` (those only heard of from others' releases too),
        the `Parked` messages given back more than `PASSED_KEEP` seconds ago, and the copies
        looked out for since before the longest park (`_watch_copies`)."""
        idle_after = self.settings.domain_idle
        for key in [key for key, (at, _) in self._passed.items() if now - at > PASSED_KEEP]:
            if not any(message.message_id == key for message in self._parked_handled):
                del self._passed[key]
        copies_keep = self.broker.topology.delays[-1] + 60.0  # the longest park and a minute
        while self._copies:
            key = next(iter(self._copies))
            copy = self._copies[key]
            if now - copy.first <= copies_keep or copy.holder is not None:
                break
            del self._copies[key]
        for domain, line in list(self.lines.items()):
            for jl in line.jobs.values():
                if any(h.message.channel_closed for h in jl.held):
                    for gone in [h for h in jl.held if h.message.channel_closed]:
                        jl.held.remove(gone)
                        let_go(gone, "drop")  # the broker has given it to a consumer again
                while jl.held and now - jl.held[0].since > LONG_HOLD:
                    let_go(jl.held.popleft(), "park", self.broker.topology.retry_delays[0])
            for name in [name for name, jl in line.jobs.items() if not jl.held and not jl.parked(now)]:
                del line.jobs[name]  # done here (or its parked estimate ran out)
            if line.held_count() or now - line.touched < idle_after or not self.core.idle(domain):
                continue
            del self.lines[domain]
            self.core.forget(domain)
        self.core.forget_idle(self.lines, idle_after, now)

    async def _report(self, every: float = 10.0) -> None:
        """One log line now and then: how fast permits go out and what holds the rest back."""
        last = parks = messages = recalled = kept = 0
        returns = [0, 0]
        while True:
            await asyncio.sleep(every)
            released = self._released  # a forgotten domain takes its own count with it
            lag_sum, lag_n = self._lag
            self._lag = [0.0, 0]
            held = sum(line.held_count() for line in self.lines.values())
            slots, _, in_flight = self.core.fleet(time.time())
            back, again = (now - before for now, before in zip(self._returns, returns, strict=True))
            log.info(
                "%.0f permits/s; %d domains, %d tasks held, %.0f parked/s in %.0f messages/s (%.0f/s back from a park, "
                "%.0f/s of them parked again at once, %.0f/s taken back early for an idle domain; "
                "%.0f/s held past the hold, nothing behind them in their shard; %d tasks of Parked "
                "messages held or being placed); %d in flight of %d; outcomes heard %.0f ms after the fact",
                (released - last) / every,
                len(self.lines),
                held,
                (self._parks - parks) / every,
                (self._park_messages - messages) / every,
                back / every,
                again / every,
                (self._recalled - recalled) / every,
                (self._kept - kept) / every,
                self._pinned,
                in_flight,
                slots,
                1000 * lag_sum / lag_n if lag_n else 0.0,
            )
            last, parks, returns, recalled = released, self._parks, list(self._returns), self._recalled
            messages, kept = self._park_messages, self._kept
            if self._copies_dropped:
                log.info(
                    "%d copies let go of tasks out of Parked messages a governor died holding (%d such tasks watched)",
                    self._copies_dropped,
                    len(self._copies),
                )
                self._copies_dropped = 0

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
                self.broker.topology.events, RELEASED, batch, headers={GOVERNOR_HEADER: self.id}
            )
        except PublishFailed as exc:
            log.warning("%d released events not published: %s", len(batch.events), exc)


SERVICE = Governor
