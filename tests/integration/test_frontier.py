"""The sharded frontier through a real broker and a real governor in this process.

A stand-in for the fetchers takes every release from `fetch.ready`, notes it, and answers
with an `ok` outcome naming its permit (so the governor's leases end, as with real
fetchers); it fetches nothing. Release times are the permits' `issued`, the governor's own
clock when it released. Every load here is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage
from pamqp.commands import Basic

from hutch.amqp import CRASHES, Broker, Delivery, message_type
from hutch.frontier import PER_MESSAGE
from hutch.models import DeadLetter, Event, EventBatch, FetcherHeartbeat, JobControl, Parked, Task, decode, task_id
from hutch.services.control.submit import submit as submit_job
from hutch.services.governor.app import Governor
from hutch.services.governor.lines import PACE_MARGIN, RETURN_MARGIN
from hutch.settings import Settings
from hutch.store import AsyncStore
from hutch.topology import event_key

from .test_amqp import depth, get_one

pytestmark = pytest.mark.timeout(60)

RATE = 2.0
BURST = 1


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """One shard, so that every domain of a test shares it; a slow default rate."""
    return settings.model_copy(update={"frontier_shards": 1, "rate": RATE, "burst": BURST, "respect_robots": False})


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker(settings, "test").connect()
    yield b
    await b.close()


StartGovernor = Callable[..., Awaitable[Governor]]


@pytest.fixture
async def start_governor(settings: Settings) -> AsyncIterator[StartGovernor]:
    """Start a governor with these settings (and overrides); each is shut down after the test."""
    started: list[Governor] = []

    async def start(prepare: Callable[[Governor], None] | None = None, **overrides: Any) -> Governor:
        service = Governor(settings.model_copy(update=overrides))
        if prepare is not None:
            prepare(service)
        await service.connect()
        await service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        await stop_governor(service)


async def stop_governor(service: Governor) -> None:
    if not service.stopping.is_set():
        service.stopping.set()
        await service.shutdown()


class StandIn:
    """Takes releases from fetch.ready and answers each with an `ok` outcome."""

    def __init__(self, broker: Broker, outcomes: bool = True) -> None:
        self.broker = broker
        self.outcomes = outcomes
        self.released: list[Task] = []  # in arrival order, each with its permit

    async def start(self) -> StandIn:
        topology = self.broker.topology
        channel = await self.broker.channel(prefetch=1000)
        queue = await channel.get_queue(topology.fetch_ready, ensure=False)
        await queue.consume(self._on_task)
        # A fleet with room to spare: the governor's capacity gate stays open.
        beat = FetcherHeartbeat(fetcher="standin", concurrency=1000, busy=0)
        await self.broker.publish(topology.events, "fetcher.heartbeat", beat, mandatory=False)
        return self

    async def _on_task(self, message: AbstractIncomingMessage) -> None:
        task = decode(message.body, Task)
        assert task.permit is not None
        self.released.append(task)
        if self.outcomes:
            event = Event(
                kind="outcome",
                task_id=task.id,
                job=task.job,
                domain=task.domain,
                attempt=task.attempts + 1,
                permit_id=task.permit.id,
                fetcher="standin",
                outcome="ok",
                status=200,
                next="parse",
            )
            await self.broker.publish(self.broker.topology.events, event_key("outcome", task.domain), event)
        await message.ack()

    def of(self, domain: str) -> list[Task]:
        return [t for t in self.released if t.domain == domain]

    def issued(self, domain: str) -> list[float]:
        return sorted(t.permit.issued for t in self.of(domain) if t.permit is not None)


def make_task(domain: str, n: int, job: str = "job") -> Task:
    url = f"http://{domain}/{job}/{n}"
    return Task(id=task_id(job, url), job=job, url=url, domain=domain)


async def submit(broker: Broker, tasks: list[Task]) -> None:
    topology = broker.topology
    for i in range(0, len(tasks), 100):
        batch = tasks[i : i + 100]
        await asyncio.gather(*(broker.publish(topology.frontier, topology.shard_key(t.domain), t) for t in batch))


async def wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def most_in_a_second(times: list[float]) -> int:
    """The most releases in any closed window of one second."""
    best = 0
    for i, start in enumerate(times):
        best = max(best, sum(1 for t in times[i:] if t - start <= 1.0))
    return best


BIG = "big.test"
SMALL = [f"small-{n}.test" for n in range(20)]


async def big_and_small(broker: Broker, start_governor: StartGovernor) -> tuple[Governor, StandIn]:
    """300 tasks of one domain, then one task each of 20 others, all in the one shard."""
    assert {broker.topology.shard_key(d) for d in [BIG, *SMALL]} == {"s.0"}
    await submit(broker, [make_task(BIG, n) for n in range(300)])
    await submit(broker, [make_task(domain, 0) for domain in SMALL])
    standin = await StandIn(broker).start()
    governor = await start_governor()
    return governor, standin


async def test_a_domain_with_a_backlog_does_not_hold_up_the_domains_behind_it_in_its_shard(
    broker: Broker, start_governor: StartGovernor
) -> None:
    governor, standin = await big_and_small(broker, start_governor)
    await wait_for(lambda: all(standin.of(domain) for domain in SMALL), timeout=20)
    last_small = max(t for domain in SMALL for t in standin.issued(domain))
    big_before = [t for t in standin.issued(BIG) if t <= last_small]
    assert len(big_before) < 10, f"{len(big_before)} of {BIG} released before the last small domain"
    # The backlog beyond what the governor holds waits parked in the delay tiers.
    assert governor._parks > 0
    line = governor.lines[BIG]
    assert line.held_count() <= governor._hold_limit(BIG, line, "job")


async def test_a_domain_is_released_at_its_rate_however_big_its_backlog(
    broker: Broker, start_governor: StartGovernor
) -> None:
    _, standin = await big_and_small(broker, start_governor)
    await wait_for(lambda: len(standin.of(BIG)) >= 14, timeout=20)
    issued = standin.issued(BIG)
    assert most_in_a_second(issued) <= RATE + BURST, issued


async def test_a_task_back_from_a_park_to_a_full_hold_is_parked_again_at_the_return_margin(
    broker: Broker, start_governor: StartGovernor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 50/s with 400 tasks, 64 are held and the rest parked; tiers are whole seconds, so
    some come back before the hold has room and are parked again: those, and only those,
    are counted at `RETURN_MARGIN` times the pace. As in a shard where other domains' tasks
    always wait (here the shard empties once the backlog is parked, and a task back to a
    full hold would stay held: the next test)."""
    monkeypatch.setattr(Governor, "_nothing_behind", lambda self, domain: False)
    margins: list[float] = []
    park_delay = Governor._park_delay

    def spy(self: Governor, domain: str, line: Any, job: str, now: float, margin: float = PACE_MARGIN) -> float:
        margins.append(margin)
        return park_delay(self, domain, line, job, now, margin)

    monkeypatch.setattr(Governor, "_park_delay", spy)
    await submit(broker, [make_task(BIG, n) for n in range(400)])
    standin = await StandIn(broker).start()
    governor = await start_governor(rate=50.0)
    await wait_for(lambda: len(standin.of(BIG)) >= 400, timeout=40)
    again = governor._returns[1]
    assert again > 0, "no task came back to a full hold"
    assert margins.count(RETURN_MARGIN) == again
    assert margins.count(PACE_MARGIN) == governor._parks - again


async def test_a_domain_alone_in_its_shard_holds_what_comes_back_from_a_park_instead_of_parking_it_again(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """The test above without the stand-in for other domains: once the backlog past the
    hold is parked, nothing waits in the shard, so a task back early to a full hold stays
    held (a park would only send it away to have it back). Every task is released once.
    A window of 2,048 for the one shard: its bound on the memory held past the hold is then
    1,024 tasks, as with the default 16 shards of 256."""
    await submit(broker, [make_task(BIG, n) for n in range(400)])
    standin = await StandIn(broker).start()
    governor = await start_governor(rate=50.0, frontier_window=2048)
    await wait_for(lambda: len(standin.of(BIG)) >= 400, timeout=40)
    assert governor._parks >= 300, governor._parks  # the first pass: 64 held, the rest parked
    assert governor._kept > 0
    # Held up to the domain's pace over the hold's horizon past the hold: the rest of what
    # comes back early is parked again (535 back, 207 of them parked again, in one run; all
    # but a few of them with nothing kept).
    assert governor._returns[1] <= 0.6 * governor._returns[0], governor._returns
    assert sorted(t.id for t in standin.of(BIG)) == sorted({make_task(BIG, n).id for n in range(400)})
    await asyncio.sleep(1.0)
    assert len(standin.of(BIG)) == 400


async def test_tasks_that_come_into_a_shard_while_a_domain_holds_past_its_hold_are_released_at_once(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A domain holding its returns past its hold leaves half of its shard's window free,
    and the next look at the shard sees what came in: other domains submitted then are
    released at once, not after the backlog."""
    await submit(broker, [make_task(BIG, n) for n in range(400)])
    standin = await StandIn(broker).start()
    governor = await start_governor(rate=50.0, frontier_window=2048)
    await wait_for(lambda: governor._kept > 0, timeout=20)
    came = time.time()
    await submit(broker, [make_task(domain, 0) for domain in SMALL])
    await wait_for(lambda: all(standin.of(domain) for domain in SMALL), timeout=5)
    last_small = max(t for domain in SMALL for t in standin.issued(domain))
    assert last_small - came < 2.0, last_small - came
    assert len(standin.of(BIG)) < 400  # the backlog was not through yet
    await wait_for(lambda: len(standin.of(BIG)) >= 400, timeout=40)


async def test_a_backlog_at_its_rate_is_parked_once_and_comes_back_when_its_turn_comes(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """At a rate that binds, each parked task is due back exactly when the tasks ahead of
    it run out (a park queue with the park's own expiration), not at the longest tier
    shorter than that: no task comes back to a full hold to be parked again, and the
    domain never idles while its tasks wait parked."""
    domain, rate, count = "exact.test", 20.0, 200
    await submit(broker, [make_task(domain, n) for n in range(count)])
    standin = await StandIn(broker).start()
    # The default ladder's tiers (the tests' own stop at 1 s: every park longer than that is
    # parked for 1 s, again and again).
    governor = await start_governor(rate=rate, retry_delays=(1.0, 5.0, 30.0))
    assert governor.broker.topology.delays == (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)
    await wait_for(lambda: len(standin.of(domain)) >= count, timeout=40)
    held = governor._hold_limit(domain, governor.lines[domain], "job")
    parked, again = governor._parks, governor._returns[1]
    # Parked to the longest tier not longer than its wait (before the park queues), 160 parks
    # for these 136 tasks; exact, but due back the moment the supply before runs out
    # (`EXACT_LEAD` 0), 194.
    assert count - held - 2 * rate <= parked <= count - held, (parked, held)  # a few released first
    assert again <= 0.05 * parked, (again, parked)
    issued = standin.issued(domain)
    assert (len(issued) - 1) / (issued[-1] - issued[0]) >= 0.9 * rate, (issued[0], issued[-1])


class SlowThenFast(StandIn):
    """A fleet of one fetch slot, each fetch taking `slow` seconds, until `speed_up()`: then
    room for 1,000 at once and no wait. A heartbeat every half second keeps it counted."""

    def __init__(self, broker: Broker, slow: float) -> None:
        super().__init__(broker)
        self.slow = slow
        self.concurrency = 1
        self.beating: asyncio.Task[None] | None = None

    async def start(self) -> SlowThenFast:
        await super().start()
        self.beating = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            beat = FetcherHeartbeat(fetcher="standin", concurrency=self.concurrency, busy=0)
            await self.broker.publish(self.broker.topology.events, "fetcher.heartbeat", beat, mandatory=False)
            await asyncio.sleep(0.5)

    async def speed_up(self) -> None:
        self.slow, self.concurrency = 0.0, 1000
        beat = FetcherHeartbeat(fetcher="standin", concurrency=self.concurrency, busy=0)
        await self.broker.publish(self.broker.topology.events, "fetcher.heartbeat", beat, mandatory=False)

    async def _on_task(self, message: AbstractIncomingMessage) -> None:
        if self.slow:
            await asyncio.sleep(self.slow)
        await super()._on_task(message)

    def stop(self) -> None:
        if self.beating is not None:
            self.beating.cancel()


async def test_a_domain_left_idle_while_its_tasks_wait_parked_takes_them_back_early(
    broker: Broker, start_governor: StartGovernor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A domain paced by a slow fleet has its backlog parked for up to 30 s. When the fleet
    gets room (the other domains finished, in a real job), its tasks are taken back from the
    park queues early instead of leaving the fetchers idle until they expire. In a shard
    where other domains' tasks wait (alone in it, what comes back would stay held)."""
    monkeypatch.setattr(Governor, "_nothing_behind", lambda self, domain: False)
    domain, count = "recall.test", 300
    await submit(broker, [make_task(domain, n) for n in range(count)])
    standin = await SlowThenFast(broker, slow=0.2).start()
    try:
        governor = await start_governor(rate=1000.0, retry_delays=(1.0, 5.0, 30.0))
        await asyncio.sleep(5.0)  # paced at 5/s: the backlog past the hold is parked at that pace
        line = governor.lines[domain]
        assert max(line.parked_in, default=0.0) >= 10.0, line.parked_in  # some parked 10 s or more
        await standin.speed_up()
        # Without taking parks back, the last come back 10-30 s from now.
        await wait_for(lambda: len({t.id for t in standin.of(domain)}) >= count, timeout=8)
        assert governor._recalled > 0
    finally:
        standin.stop()


async def test_a_domain_paced_below_its_rate_holds_its_returns_past_its_hold_instead_of_parking_them_again(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A slow fleet paces the domain at about 20/s of its 1,000/s: its parks are timed by
    that pace with a margin and come back early. Room past the hold takes them: the domain
    holds more than its hold limit (on small pages, a park back to a full hold fell from
    352-411 a second to 204-243, docs/benchmarks.md)."""
    domain, count = "room.test", 300
    await submit(broker, [make_task(domain, n) for n in range(count)])
    standin = await SlowThenFast(broker, slow=0.05).start()
    try:
        governor = await start_governor(rate=1000.0, retry_delays=(1.0, 5.0, 30.0))
        most = 0

        def done() -> bool:
            nonlocal most
            line = governor.lines.get(domain)
            if line is not None:
                most = max(most, line.held_count())
            return len({t.id for t in standin.of(domain)}) >= count

        await wait_for(done, timeout=40)
        limit = governor._hold_limit(domain, governor.lines[domain], "job")
        assert most > limit, (most, limit)  # only tasks back from a park go past it
        assert len(standin.of(domain)) == count  # each released once
    finally:
        standin.stop()


async def test_tasks_parked_together_go_out_as_one_message_and_each_is_released_once(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A backlog past the hold is parked, and parked again when it comes back early: each
    domain's parks into one park queue, due back in one second, go out as one `Parked`
    message. Every task is still released, each once."""
    domain, count = "bundled.test", 400
    await submit(broker, [make_task(domain, n) for n in range(count)])
    standin = await StandIn(broker).start()
    governor = await start_governor(rate=50.0)
    await wait_for(lambda: len(standin.of(domain)) >= count, timeout=40)
    assert governor._parks >= 300, governor._parks  # 64 held, the rest parked, some twice
    # One by one, as many messages as tasks parked.
    assert governor._park_messages * 5 <= governor._parks, (governor._park_messages, governor._parks)
    ids = [t.id for t in standin.of(domain)]
    assert sorted(ids) == sorted({make_task(domain, n).id for n in range(count)})  # each once
    await asyncio.sleep(1.0)
    assert len(standin.of(domain)) == count


async def test_parked_tasks_of_a_cancelled_job_each_end_dead_and_the_others_in_the_message_are_released(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A `Parked` back in its shard is handled task by task: those of a cancelled job become
    one dead letter each, with their task; the others are released."""
    topology = broker.topology
    await broker.publish("", topology.jobs, JobControl(job="gone", action="cancel"))
    domain = "mixed.test"
    gone = [make_task(domain, n, "gone") for n in range(3)]
    kept = [make_task(domain, n, "kept") for n in range(3)]
    standin = await StandIn(broker).start()
    await start_governor(rate=100.0)
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=[*gone, *kept]))
    await wait_for(lambda: len(standin.of(domain)) >= len(kept), timeout=15)
    assert sorted(t.id for t in standin.of(domain)) == sorted(t.id for t in kept)
    letters = [decode((await get_one(broker, topology.dlq, timeout=10)).body, DeadLetter) for _ in gone]
    assert sorted((letter.task.id if letter.task else "") for letter in letters) == sorted(t.id for t in gone)
    assert {(letter.stage, letter.reason) for letter in letters} == {("governor", "cancelled")}
    await asyncio.sleep(0.5)
    assert await depth(broker, topology.dlq) == 0  # nothing else went dead


async def test_a_governor_stopped_holding_parked_tasks_gives_each_back_alone_and_none_is_lost_or_doubled(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """At 2 tasks a second, a `Parked` of 20 is held while its first tasks are released. A
    governor stopped then gives each task it still holds back to its shard alone and acks
    the message: the next governor releases every task, each once."""
    topology = broker.topology
    domain = "held.test"
    tasks = [make_task(domain, n) for n in range(20)]
    standin = await StandIn(broker).start()
    first = await start_governor()
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks))
    await wait_for(lambda: len(standin.of(domain)) >= 2, timeout=15)
    await stop_governor(first)
    before = {t.id for t in standin.of(domain)}
    assert len(before) < len(tasks)
    await start_governor(rate=100.0)
    await wait_for(lambda: {t.id for t in standin.of(domain)} == {t.id for t in tasks}, timeout=30)
    await asyncio.sleep(1.0)
    assert len(standin.of(domain)) == len(tasks)  # each once


async def test_a_governor_stopped_with_tasks_of_a_parked_held_and_the_rest_parked_again_leaves_each_once(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A `Parked` of 30 at 2 tasks a second and a 2-second hold: 4 tasks held, the rest
    parked again (in `Parked` messages of their own) while the first one stays unacked. A
    stopped governor gives back only the tasks it holds: given back whole, the message would
    bring back the parked ones too, and each of them would be released twice."""
    topology = broker.topology
    domain = "reparked.test"
    tasks = [make_task(domain, n) for n in range(30)]
    standin = await StandIn(broker).start()
    first = await start_governor(hold_horizon=2.0)
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks))
    await wait_for(lambda: len(standin.of(domain)) >= 2 and first._parks >= 20, timeout=15)
    await stop_governor(first)
    await start_governor(rate=100.0)
    await wait_for(lambda: {t.id for t in standin.of(domain)} == {t.id for t in tasks}, timeout=45)
    await asyncio.sleep(1.0)
    released = collections.Counter(t.id for t in standin.of(domain))
    assert [n for n in released.values() if n > 1] == [], released


async def test_copies_of_tasks_out_of_a_parked_a_governor_died_holding_are_let_go_and_each_task_released_once(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """What a SIGKILLed governor leaves: a `Parked` it died holding comes back counted as a
    crash, and copies of its tasks are in other messages (parked again before it died, some
    unacked, some still in park queues). At 10 tasks a second with a 1-second hold, most of
    the copy that goes on is parked again and comes back: it must still be released, and
    every other copy let go. Each task is released once."""
    topology = broker.topology
    domain = "copies.test"
    tasks = [make_task(domain, n) for n in range(30)]
    key = topology.shard_key(domain)
    standin = await StandIn(broker).start()
    await broker.publish(topology.frontier, key, Parked(tasks=tasks), headers={CRASHES: 1})
    await broker.publish(topology.frontier, key, Parked(tasks=tasks[5:]), headers={CRASHES: 1})
    await broker.publish(topology.frontier, key, Parked(tasks=tasks[10:]))
    await submit(broker, tasks[20:25])
    governor = await start_governor(rate=10.0, hold_horizon=1.0)
    await wait_for(lambda: {t.id for t in standin.of(domain)} == {t.id for t in tasks}, timeout=30)
    await asyncio.sleep(1.5)
    released = collections.Counter(t.id for t in standin.of(domain))
    assert [n for n in released.values() if n > 1] == [], released
    assert governor._parks > 0  # the copies that went on were parked again, and came back
    assert all(t.maybe_done for t in standin.of(domain))  # the fetcher asks the store first


async def test_parked_messages_past_the_governors_bound_wait_in_a_park_queue_and_none_is_lost(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A `Parked` stays unacked until its last task is released, so the tasks of those
    being handled are bounded (shards x window x `PINNED_PER_SLOT`, here 1 x 2 x 4 = 8):
    one that would go past it is sent back to a park queue whole, and comes back later."""
    topology = broker.topology
    domain = "pinned.test"
    tasks = [make_task(domain, n) for n in range(10)]
    standin = await StandIn(broker).start()
    governor = await start_governor(frontier_window=2)  # 2 tasks a second: the first 5 stay held a while
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks[:5]))
    await wait_for(lambda: len(standin.of(domain)) >= 1, timeout=15)
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks[5:]))
    await wait_for(lambda: governor._deflected > 0, timeout=10)
    await wait_for(lambda: {t.id for t in standin.of(domain)} == {t.id for t in tasks}, timeout=30)
    assert len(standin.of(domain)) == len(tasks)  # each once


async def test_tasks_of_a_parked_message_released_no_longer_count_against_the_bound(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """The bound (here 1 x 2 x 4 = 8 tasks) counts the tasks held or still to place, not
    every task of a message until its ack: with 4 of a first `Parked` of 6 released, a
    second of 5 is taken at once. Counted whole, it went back to a park queue (6 + 5 > 8),
    and a job's new tasks 256 to a message filled the bound with a few held in each."""
    topology = broker.topology
    domain = "counted.test"
    tasks = [make_task(domain, n) for n in range(11)]
    standin = await StandIn(broker).start()
    governor = await start_governor(frontier_window=2)  # 2 tasks a second
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks[:6]))
    await wait_for(lambda: len(standin.of(domain)) >= 4, timeout=15)
    assert governor._pinned <= 2
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks[6:]))
    await wait_for(lambda: {t.id for t in standin.of(domain)} == {t.id for t in tasks}, timeout=30)
    assert governor._deflected == 0
    assert len(standin.of(domain)) == len(tasks)  # each once
    await wait_for(lambda: (governor._pinned, governor._pinned_bytes) == (0, 0), timeout=5)


async def test_a_governor_keeps_in_memory_only_the_tasks_of_a_parked_message_not_yet_released(
    broker: Broker, start_governor: StartGovernor
) -> None:
    """A `Parked` stays unacked until its last task is released (here 2 a second), but the
    governor lets go of each task it released: of the copies it decoded, only those still
    held are in memory (this test's own tasks have no permit either, hence one copy each)."""
    topology = broker.topology
    domain = "letgo.test"
    tasks = [make_task(domain, n) for n in range(10)]
    ids = {t.id for t in tasks}
    standin = await StandIn(broker).start()
    await start_governor()
    await broker.publish(topology.frontier, topology.shard_key(domain), Parked(tasks=tasks))
    await wait_for(lambda: len(standin.of(domain)) >= 3, timeout=15)
    gc.collect()
    copies = collections.Counter(
        o.id for o in gc.get_objects() if isinstance(o, Task) and o.id in ids and o.permit is None
    )
    released = {t.id for t in standin.of(domain)}
    assert len(released) < len(tasks)  # the message is still being handled
    assert all(copies[i] == 1 for i in released), copies  # this test's own copy alone
    assert any(copies[i] == 2 for i in ids - released), copies  # a held one: the governor's copy is seen
    await wait_for(lambda: {t.id for t in standin.of(domain)} == ids, timeout=30)


async def test_a_parked_message_that_does_not_decode_ends_as_one_dead_letter_with_its_body(
    broker: Broker, start_governor: StartGovernor
) -> None:
    topology = broker.topology
    await start_governor()
    body = b'{"v": 1, "tasks": []}'  # a Parked holds at least one task
    channel = await broker.raw_channel()
    try:
        await channel.basic_publish(
            body,
            exchange=topology.frontier,
            routing_key=topology.shard_key("poison.test"),
            properties=Basic.Properties(message_type="hutch.Parked", delivery_mode=2),
        )
    finally:
        await channel.close()
    letter = decode((await get_one(broker, topology.dlq, timeout=10)).body, DeadLetter)
    assert (letter.stage, letter.reason, letter.task, letter.raw) == ("governor", "decode", None, body.decode())
    assert "Parked" in letter.detail


async def test_two_jobs_on_one_domain_share_its_releases_by_weight(
    broker: Broker, start_governor: StartGovernor
) -> None:
    topology = broker.topology
    for job, weight in (("light", 1.0), ("heavy", 3.0)):
        await broker.publish("", topology.jobs, JobControl(job=job, action="weight", weight=weight))
    domain = "shared.test"
    tasks = [make_task(domain, n, job) for n in range(100) for job in ("light", "heavy")]
    await submit(broker, tasks)
    standin = await StandIn(broker).start()
    await start_governor(rate=10.0)
    await wait_for(lambda: len(standin.of(domain)) >= 60, timeout=20)
    counts = collections.Counter(t.job for t in standin.of(domain)[:60])
    # 1:3 is 15:45; an even share (30:30) or the heavy job alone (0:60) fails.
    assert 10 <= counts["light"] <= 20, counts
    assert counts["light"] + counts["heavy"] == 60


async def test_a_domain_left_idle_is_forgotten_and_a_new_task_of_it_is_still_released(
    broker: Broker, start_governor: StartGovernor
) -> None:
    domain = "idle.test"
    standin = await StandIn(broker).start()
    governor = await start_governor(domain_idle=1.0)
    await submit(broker, [make_task(domain, 0)])
    await wait_for(lambda: len(standin.of(domain)) == 1, timeout=15)
    assert domain in governor.lines and domain in governor.core.queues
    key = governor.core.key_of(domain)

    def forgotten() -> bool:
        return domain not in governor.lines and domain not in governor.core.queues and key not in governor.core.keys

    await wait_for(forgotten, timeout=15)
    await submit(broker, [make_task(domain, 1)])
    await wait_for(lambda: len(standin.of(domain)) == 2, timeout=15)
    assert standin.of(domain)[1].id == make_task(domain, 1).id
    assert domain in governor.lines  # known again


async def test_a_restarted_governor_reads_the_released_log_and_waits_out_the_permits_in_flight(
    broker: Broker, start_governor: StartGovernor
) -> None:
    domain = "restart.test"
    permit_ttl = 4.0
    first = await start_governor(rate=20.0, burst=3, permit_ttl=permit_ttl)
    await submit(broker, [make_task(domain, n) for n in range(3)])
    earlier = [decode((await get_one(broker, broker.topology.fetch_ready, timeout=15)).body, Task) for _ in range(3)]
    await stop_governor(first)  # no outcome came: all three are still in flight

    second = await start_governor(rate=20.0, burst=3, permit_ttl=permit_ttl)
    core = second.core
    assert all(t.permit is not None and t.permit.id in core.leases for t in earlier)
    last = max(t.permit.issued for t in earlier if t.permit is not None)
    assert core.queues[domain].last_foreign_release == pytest.approx(last)
    await submit(broker, [make_task(domain, 3)])
    later = decode((await get_one(broker, broker.topology.fetch_ready, timeout=20)).body, Task)
    assert later.id == make_task(domain, 3).id
    assert later.permit is not None and later.permit.id.startswith(second.id + ".")
    assert later.permit.issued >= last + permit_ttl  # no permit of the first one could still be used


async def test_a_task_under_a_key_no_shard_is_bound_to_is_routed_into_its_shard_and_released(
    broker: Broker, start_governor: StartGovernor
) -> None:
    topology = broker.topology
    domain = "stray.test"
    # Keys of another layout: the per-domain queues', and a shard count larger than this one.
    tasks = {"d.stray.test": make_task(domain, 0), "s.999": make_task(domain, 1)}
    heard: dict[str, str] = {}

    def watch(governor: Governor) -> None:
        route = governor._on_unrouted

        async def watched(task: Task, message: Delivery) -> None:
            heard[task.id] = message.routing_key or ""
            await route(task, message)

        governor._on_unrouted = watched  # type: ignore[method-assign,unused-ignore]

    standin = await StandIn(broker).start()
    await start_governor(prepare=watch)
    for key, task in tasks.items():
        await broker.publish(topology.frontier, key, task)
    await wait_for(lambda: len(standin.of(domain)) == 2, timeout=15)
    assert heard == {task.id: key for key, task in tasks.items()}  # both fell through to unrouted
    assert sorted(t.id for t in standin.of(domain)) == sorted(t.id for t in tasks.values())


async def released_log(broker: Broker, quiet: float = 1.0) -> set[str]:
    """Every permit id in the released log, read from its start until it is quiet."""
    permits: set[str] = set()
    heard = asyncio.Event()
    channel = await broker.channel(prefetch=1000)
    queue = await channel.get_queue(broker.topology.released_log, ensure=False)

    async def on_batch(message: AbstractIncomingMessage) -> None:
        permits.update(e.permit_id for e in decode(message.body, EventBatch).events if e.permit_id)
        await message.ack()
        heard.set()

    await queue.consume(on_batch, arguments={"x-stream-offset": "first"})
    while True:
        heard.clear()
        try:
            await asyncio.wait_for(heard.wait(), quiet)
        except TimeoutError:
            break
    await channel.close()
    return permits


def said(record: logging.LogRecord) -> str:
    """A log record's text; aio-pika logs some objects whose repr fails."""
    try:
        return record.getMessage()
    except Exception:
        return str(record.msg)


async def test_a_governor_stopped_while_busy_publishes_the_released_event_of_every_task_it_released(
    broker: Broker, start_governor: StartGovernor, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parking on and on, as in a shard where other domains' tasks always wait (alone, the
    # backlog back from its first park would stay held).
    monkeypatch.setattr(Governor, "_nothing_behind", lambda self, domain: False)
    governor, standin = await big_and_small(broker, start_governor)
    await wait_for(lambda: governor._parks >= 400, timeout=20)
    await stop_governor(governor)  # while it parks the backlog
    # An ack on a shard channel while it closes would make the broker close the governor's
    # whole connection (504 CHANNEL_ERROR), losing the released events not yet published.
    assert not [r for r in caplog.records if "CHANNEL_ERROR" in said(r)]
    await asyncio.sleep(1.0)  # the stand-in takes what was released last
    released = {t.permit.id for t in standin.released if t.permit is not None}
    logged = await released_log(broker)
    assert released - logged == set()  # none unheard by the governors that come next


async def test_a_submitted_job_goes_into_its_shard_a_few_tasks_of_a_domain_to_a_message_and_each_is_released_once(
    broker: Broker, start_governor: StartGovernor, tmp_path: Path
) -> None:
    """`hutch submit`'s path (the storer's for an intake message too) publishes each batch's
    tasks of one domain as one `Parked` (`hutch.frontier`), a domain with one task as a
    `Task`: 300 URLs of one site and 40 of another in one job, a lone URL of a third. The
    shard holds about a quarter as many messages as tasks (`PER_MESSAGE`), and the governor
    releases every task once."""
    big, other, lone = "many.test", "some.test", "lone.test"
    urls = [*(f"http://{big}/p/{n}" for n in range(300)), *(f"http://{other}/p/{n}" for n in range(40)),
            f"http://{lone}/only"]
    store = await AsyncStore(f"sqlite:///{tmp_path / 'hutch.sqlite3'}").open()
    try:
        result = await submit_job(broker, store, "grouped", iter(urls), None)
        states = await store.run(lambda s: collections.Counter(t["state"] for t in s.tasks("grouped")))
    finally:
        await store.close()
    assert result.published == len(urls) and states == {"queued": len(urls)}

    shard = broker.topology.shard_queue(0).name
    messages = await depth(broker, shard)
    # The first batch (32) has each domain's first URL ahead of the rest, then batches of 500.
    assert messages <= len(urls) // PER_MESSAGE + 8, messages
    bodies: list[Task | Parked] = []
    for _ in range(messages):
        got = await get_one(broker, shard)
        kind = Parked if got.type == message_type("Parked") else Task
        bodies.append(broker.decode(got.body, got.content_encoding, kind))
        await broker.publish(broker.topology.frontier, broker.topology.shard_key(bodies[-1].domain), bodies[-1])
    tasks = [t for body in bodies for t in (body.tasks if isinstance(body, Parked) else [body])]
    assert sorted(t.url for t in tasks) == sorted(urls)  # each once
    assert all(isinstance(body, Parked) for body in bodies if body.domain != lone)
    assert [type(body) for body in bodies if body.domain == lone] == [Task]

    standin = await StandIn(broker).start()
    await start_governor(rate=200.0, burst=20)
    await wait_for(lambda: len(standin.released) >= len(urls), timeout=40)
    await asyncio.sleep(0.5)
    assert sorted(t.url for t in standin.released) == sorted(urls)  # each released once
