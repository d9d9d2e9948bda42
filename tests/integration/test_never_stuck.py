"""Every message ends, whatever its consumer does: the AMQP layer's counts through a real broker.

A consumer that dies holding a message (simulated by closing its channel mid-handler, which
is what the broker sees of a killed process), a handler that raises, and an infrastructure
error that must spend nothing.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aio_pika.exceptions import AMQPError

from hutch import amqp
from hutch.amqp import Broker, Delivery, PublishFailed, Requeue
from hutch.models import DeadLetter, Page, Task, decode, task_id
from hutch.settings import Settings

from .test_amqp import depth, get_one

pytestmark = pytest.mark.timeout(90)


def make_page(url: str = "http://127.0.0.1:9/page/1") -> Page:
    task = Task(id=task_id("job", url), job="job", url=url, domain="127.0.0.1:9", attempts=1)
    return Page(task=task, status=200, final_url=url, text="<title>kept</title>", fetched_at=time.time())


@pytest.fixture
async def broker(settings: Settings):
    b = await Broker(settings, "test").connect()
    yield b
    await b.close()


async def wait_for(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_a_message_that_kills_its_consumer_each_time_goes_dead_as_crashed_with_its_page(
    broker: Broker,
) -> None:
    seen: list[int] = []
    held = asyncio.Event()
    release = asyncio.Event()

    async def handler(page: Page, message: Delivery) -> None:
        seen.append(message.crashes)
        held.set()
        await release.wait()  # "dies" here: the test closes the channel under it

    await broker.publish(broker.topology.work, "parse", make_page())
    for _ in range(broker.settings.max_crashes):
        held.clear()
        release.clear()
        channel = await broker.channel(prefetch=1)
        consumer = await broker.consume(broker.topology.parse, Page, handler, stage="parse", channel=channel)
        await asyncio.wait_for(held.wait(), 15)
        await channel.close()  # the broker requeues the unacked message, flagged redelivered
        release.set()
        await consumer.cancel()
    # The next consumer sees the redelivery of a message that crashed max_crashes times.
    await broker.consume(broker.topology.parse, Page, handler, stage="parse")
    letter = decode((await get_one(broker, broker.topology.dlq)).body, DeadLetter)
    assert (letter.reason, letter.stage) == ("crashed", "parse")
    assert letter.page is not None and letter.page.text == "<title>kept</title>"
    assert seen == [0, 1, 2]  # each crash counted in a fresh copy, the handler ran once per copy
    await asyncio.sleep(0.3)
    assert await depth(broker, broker.topology.parse) == 0


async def test_a_handler_that_always_raises_leaves_the_page_dead_as_error_after_max_failures(
    broker: Broker,
) -> None:
    seen: list[tuple[int, bool]] = []

    async def handler(page: Page, message: Delivery) -> None:
        seen.append((message.failures, message.redelivered))
        raise ValueError("spec exploded")

    await broker.consume(broker.topology.parse, Page, handler, stage="parse")
    await broker.publish(broker.topology.work, "parse", make_page())
    letter = decode((await get_one(broker, broker.topology.ledger)).body, DeadLetter)
    assert (letter.reason, letter.stage) == ("error", "parse")
    assert "ValueError: spec exploded" in letter.detail
    assert letter.page is not None and letter.page.text == "<title>kept</title>"
    assert letter.task is not None and letter.task.attempts == 1  # no re-fetch: the attempt is as it was
    assert seen == [(0, False), (1, False), (2, False)]


async def test_requeue_spends_nothing_however_often_it_happens(broker: Broker) -> None:
    seen: list[tuple[int, int]] = []
    requeues = broker.settings.max_failures + broker.settings.max_crashes  # past both limits

    async def handler(task: Task, message: Delivery) -> None:
        seen.append((message.crashes, message.failures))
        if len(seen) <= requeues:
            raise Requeue("store unavailable", backoff=len(seen) % 2 == 0)

    await broker.consume(broker.topology.store, Task, handler, stage="store")
    page = make_page()
    await broker.publish(broker.topology.work, "store", page.task)
    await wait_for(lambda: len(seen) == requeues + 1, timeout=30)
    assert seen == [(0, 0)] * (requeues + 1)
    await asyncio.sleep(0.3)
    assert await depth(broker, broker.topology.store) == 0
    assert await depth(broker, broker.topology.dlq) == 0


async def test_a_message_returned_after_its_channel_closed_is_not_copied_a_second_time(broker: Broker) -> None:
    held = asyncio.Event()
    release = asyncio.Event()

    async def handler(task: Task, _: Delivery) -> None:
        held.set()
        await release.wait()
        raise Requeue("stopping", backoff=False)  # as the governor does when it stops

    channel = await broker.channel(prefetch=1)
    await broker.consume(broker.topology.parse, Task, handler, stage="parse", channel=channel)
    await broker.publish(broker.topology.work, "parse", make_page().task)
    await asyncio.wait_for(held.wait(), 15)
    await channel.close()  # the broker requeues it: a copy now would be a duplicate
    release.set()
    await broker.drain(5)
    await asyncio.sleep(0.3)
    assert await depth(broker, broker.topology.parse) == 1


@pytest.mark.parametrize(
    "error",
    [PublishFailed("no confirm within 5s"), ConnectionError("broker gone"), AMQPError("channel closed")],
    ids=["publish-failed", "connection-error", "amqp-error"],
)
async def test_an_infrastructure_error_in_a_handler_spends_nothing(
    broker: Broker, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait before each republish doubles from a quarter second (tests/unit/test_amqp_counts.py);
    # here it starts at 20 ms, so that the errors in a row take a third of a second, not four.
    # Set where `infra_backoff` reads it: the package's copy of the name is not that one.
    monkeypatch.setattr(amqp.broker, "INFRA_BACKOFF_FIRST", 0.02)
    seen: list[tuple[int, int, bool]] = []
    times = broker.settings.max_failures + 1

    async def handler(task: Task, message: Delivery) -> None:
        seen.append((message.crashes, message.failures, message.redelivered))
        if len(seen) <= times:
            raise error

    await broker.consume(broker.topology.parse, Task, handler, stage="parse")
    await broker.publish(broker.topology.work, "parse", make_page().task)
    await wait_for(lambda: len(seen) == times + 1, timeout=30)
    assert seen == [(0, 0, False)] * (times + 1)
    await asyncio.sleep(0.3)
    assert await depth(broker, broker.topology.dlq) == 0


async def test_the_ledger_consumer_never_dead_letters_so_it_cannot_feed_itself(broker: Broker) -> None:
    calls = 0

    async def handler(letter: DeadLetter, _: Delivery) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("store is broken")

    await broker.publish_dead(make_page().dead_letter("parse", "parse", "bad page"))  # to dlq and ledger
    await broker.consume(broker.topology.ledger, DeadLetter, handler, stage="store", dead_letter=False)
    await wait_for(lambda: calls >= broker.settings.max_failures)
    await asyncio.sleep(0.5)
    assert calls == broker.settings.max_failures
    assert await depth(broker, broker.topology.ledger) == 0  # dropped, and logged by its id
    assert await depth(broker, broker.topology.dlq) == 1  # the original only: nothing fed back
    # An undecodable message on the ledger is dropped too, not dead-lettered.
    await broker.publish(broker.topology.dead, "", b"not json")
    await asyncio.sleep(0.5)
    assert await depth(broker, broker.topology.ledger) == 0
    assert await depth(broker, broker.topology.dlq) == 2  # the raw one reached the dlq by fanout only


# -- the fetch stage: errors that belong to the task spend its attempts ------------------


@pytest.fixture
async def fetcher(settings: Settings, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A real fetcher service in this process, with no proxy-manager; `fetch` is replaced."""
    from hutch.services.fetcher import app

    calls: list[str] = []

    async def exploding_fetch(client: object, url: str, **_: object) -> object:
        calls.append(url)
        raise RuntimeError("nothing foresaw this page")

    monkeypatch.setattr(app, "fetch", exploding_fetch)
    service = app.Fetcher(settings.model_copy(update={"use_proxy_manager": False}))
    await service.connect()
    await service.start()
    service.calls = calls  # type: ignore[attr-defined]
    yield service
    service.stopping.set()
    await service.broker.stop_consuming()
    await service.broker.drain(5)
    await service.stop()
    await service.broker.close()


async def act_as_governor(broker: Broker, domain: str, until: asyncio.Event) -> int:
    """Give each task coming back to its domain's shard a fresh permit, as the governor would."""
    from hutch.models import Permit

    channel = await broker.channel()
    topology = broker.topology
    queue = await channel.get_queue(topology.shard_queue(topology.shard_of(domain)).name, ensure=False)
    released = 0
    while not until.is_set():
        message = await queue.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        task = decode(message.body, Task)
        now = time.time()
        task = task.model_copy(update={"permit": Permit(id=f"p{released}", issued=now, expires=now + 30)})
        await broker.publish(broker.topology.work, "fetch.ready", task)
        released += 1
    await channel.close()
    return released


async def test_a_task_whose_fetch_raises_spends_an_attempt_each_time_and_ends_dead(broker: Broker, fetcher) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import Permit

    url = "http://127.0.0.1:9/explodes"
    task = Task(id=task_id("job", url), job="job", url=url, domain="127.0.0.1:9")
    done = asyncio.Event()
    governor = asyncio.create_task(act_as_governor(broker, task.domain, done))
    now = time.time()
    permit = Permit(id="p", issued=now, expires=now + 30)
    await broker.publish(broker.topology.work, "fetch.ready", task.model_copy(update={"permit": permit}))
    letter = decode((await get_one(broker, broker.topology.dlq, timeout=40)).body, DeadLetter)
    done.set()
    assert await governor == broker.settings.max_attempts - 1
    assert (letter.reason, letter.stage) == ("error", "fetch")
    assert letter.task is not None
    assert letter.task.attempts == broker.settings.max_attempts
    assert [a.outcome for a in letter.task.history] == ["error"] * broker.settings.max_attempts
    assert all(a.spent and "nothing foresaw" in (a.detail or "") for a in letter.task.history)
    assert fetcher.calls == [url] * broker.settings.max_attempts


async def test_a_task_a_fetcher_died_holding_spends_an_attempt_without_being_fetched_again(
    broker: Broker, fetcher
) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import Attempt, Permit

    # Its last attempt left, and a permit long expired: the crash still spends, so it is dead.
    url = "http://127.0.0.1:9/kills-fetchers"
    earlier = [Attempt(n=n + 1, at=time.time(), outcome="timeout") for n in range(broker.settings.max_attempts - 1)]
    task = Task(
        id=task_id("job", url),
        job="job",
        url=url,
        domain="127.0.0.1:9",
        attempts=broker.settings.max_attempts - 1,
        history=earlier,
        permit=Permit(id="old", issued=time.time() - 100, expires=time.time() - 50),
    )
    await fetcher.broker.stop_consuming()  # this fetcher is not the one that dies
    await broker.publish(broker.topology.work, "fetch.ready", task)
    # A fetcher takes it and dies: its channel closes with the message unacked.
    channel = await broker.channel(prefetch=1)
    queue = await channel.get_queue(broker.topology.fetch_ready, ensure=False)
    assert await queue.get(fail=False, no_ack=False) is not None
    await channel.close()
    await fetcher.broker.consume(broker.topology.fetch_ready, Task, fetcher._on_task, stage="fetch")
    letter = decode((await get_one(broker, broker.topology.dlq, timeout=20)).body, DeadLetter)
    assert (letter.reason, letter.stage) == ("crashed", "fetch")
    assert letter.task is not None and letter.task.attempts == broker.settings.max_attempts
    assert letter.task.history[-1].outcome == "crashed" and letter.task.history[-1].spent
    assert fetcher.calls == []  # the page that may kill fetchers was not fetched again


async def test_a_task_a_fetcher_died_holding_whose_page_was_stored_since_is_not_fetched_again(
    broker: Broker, fetcher, settings: Settings
) -> None:  # type: ignore[no-untyped-def]
    """The fetch a fetcher died in may have gone on to be parsed and stored; only its ack was
    lost. The storer says so, over RabbitMQ, and the page is not fetched again; a task that
    crashed and was not stored is fetched as usual. A task out of a `Parked` a governor died
    holding (`maybe_done`: another copy of it may have gone on) is asked about the same way."""
    from hutch.models import Attempt, Event, Item, Permit
    from hutch.services.storer.app import Storer

    topology = broker.topology
    events = await (await broker.channel()).declare_queue(exclusive=True)
    await events.bind(topology.events, "outcome.#")
    storer = Storer(settings)
    await storer.connect(wait=False)
    await storer.start()
    try:

        def crashed(path: str) -> Task:
            url = f"http://127.0.0.1:9/{path}"
            history = [Attempt(n=1, at=time.time(), outcome="crashed", spent=True)]
            permit = Permit(id=f"gov-a.{path}", issued=time.time(), expires=time.time() + 30)
            return Task(
                id=task_id("job", url), job="job", url=url, domain="127.0.0.1:9",
                attempts=1, history=history, permit=permit,
            )  # fmt: skip

        stored, unstored = crashed("stored"), crashed("unstored")
        copy = crashed("copy").model_copy(update={"history": [], "attempts": 0, "maybe_done": True})
        for done in (stored, copy):
            item = Item(task=done, status=200, fields={}, parsed_at=time.time())
            await storer.store.run(lambda store, item=item: store.store_item(item))
        for task in (stored, unstored, copy):
            await broker.publish(topology.work, "fetch.ready", task)
        seen: dict[str, list[tuple[str, str | None]]] = {}
        deadline = time.monotonic() + 20
        while any(len(seen.get(task.id, [])) < 1 for task in (stored, unstored, copy)):
            assert time.monotonic() < deadline, seen
            message = await events.get(fail=False, no_ack=True)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            event = decode(message.body, Event)
            seen.setdefault(event.task_id, []).append((event.outcome, event.next))
        assert seen[stored.id] == [("stored_already", None)]
        assert seen[copy.id] == [("stored_already", None)]
        assert seen[unstored.id][0] == ("error", "retry")  # fetched: this fixture's fetch raises
        assert fetcher.calls == [unstored.url]
    finally:
        await storer.shutdown()


async def test_asking_whether_a_crashed_task_is_stored_never_makes_its_permit_late(
    broker: Broker, fetcher
) -> None:  # type: ignore[no-untyped-def]
    """No storer answers here. A rate-limited domain's permit may be fetched at most 50 ms
    after its moment: the question waits only that long, then the task is fetched, on time,
    rather than given back late (and again, and again, while no storer answers)."""
    from hutch.models import Attempt, Event, Permit

    topology = broker.topology
    events = await (await broker.channel()).declare_queue(exclusive=True)
    await events.bind(topology.events, "outcome.#")
    url = "http://127.0.0.1:9/crashed-once"
    history = [Attempt(n=1, at=time.time(), outcome="crashed", spent=True)]
    permit = Permit(id="gov-a.crashed", issued=time.time(), expires=time.time() + 30, late_after=0.05)
    task = Task(
        id=task_id("job", url), job="job", url=url, domain="127.0.0.1:9", attempts=1, history=history, permit=permit
    )
    await broker.publish(topology.work, "fetch.ready", task)
    deadline = time.monotonic() + 20
    outcomes: list[tuple[str, str | None]] = []
    while not outcomes:
        assert time.monotonic() < deadline, "no outcome"
        message = await events.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        event = decode(message.body, Event)
        if event.task_id == task.id:
            outcomes.append((event.outcome, event.next))
    assert outcomes == [("error", "retry")]  # fetched (this fixture's fetch raises), not permit_late
    assert fetcher.calls == [url]


async def test_a_permit_that_reaches_the_fetcher_later_than_its_rate_allows_goes_back_unspent_unfetched(
    broker: Broker, fetcher
) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import Event, Permit

    topology = broker.topology
    domain = "127.0.0.1:9"
    events = await (await broker.channel()).declare_queue(exclusive=True)
    await events.bind(topology.events, "outcome.#")
    now = time.time()

    def task(path: str, issued: float) -> Task:
        url = f"http://{domain}/{path}"
        permit = Permit(id=f"gov-a.{path}", issued=issued, expires=now + 30, late_after=0.05)
        return Task(id=task_id("job", url), job="job", url=url, domain=domain, permit=permit)

    # The first sets the quickest transit from this governor; the second was released 2 s
    # before it but reaches the fetcher after it (a stalled pipeline, a busy machine).
    await broker.publish(topology.work, "fetch.ready", task("on-time", issued=time.time()))
    await wait_for(lambda: len(fetcher.calls) >= 1)
    await broker.publish(topology.work, "fetch.ready", task("late", issued=time.time() - 2.0))
    shard = topology.shard_queue(topology.shard_of(domain)).name
    back = decode((await get_one(broker, shard, timeout=20)).body, Task)
    if back.url.endswith("/on-time"):  # its failed fetch, back from its retry tier first
        back = decode((await get_one(broker, shard, timeout=20)).body, Task)
    assert back.url.endswith("/late") and back.permit is None
    assert back.attempts == 0 and back.history == []  # nothing spent
    assert fetcher.calls == [f"http://{domain}/on-time"]
    late_events: list[Event] = []

    async def read_events() -> bool:
        while (message := await events.get(fail=False, no_ack=True)) is not None:
            event = decode(message.body, Event)
            if event.task_id == back.id:
                late_events.append(event)
        return bool(late_events)

    for _ in range(300):  # 15 s
        if await read_events():
            break
        await asyncio.sleep(0.05)
    assert [(e.outcome, e.next) for e in late_events] == [("permit_late", "frontier")]


# -- the governor: parking by republish, consumers that always come back ----------------


@pytest.fixture
async def governor(settings: Settings):  # type: ignore[no-untyped-def]
    """A real governor service in this process (robots.txt ignored); the test starts it."""
    from hutch.services.governor.app import Governor

    service = Governor(settings.model_copy(update={"respect_robots": False, "max_hold": 1.0}))
    await service.connect()
    yield service
    service.stopping.set()
    if hasattr(service, "shard_channels"):  # started
        await service.shutdown()
    else:
        await service.broker.close()


def frontier_task(domain: str, path: str) -> Task:
    url = f"http://{domain}/{path}"
    return Task(id=task_id("j", url), job="j", url=url, domain=domain)


async def test_a_task_whose_domain_waits_longer_than_max_hold_is_parked_by_publish_and_ack_not_requeued(
    broker: Broker, governor
) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import Event, EventBatch
    from hutch.services.governor.app import GOVERNOR_HEADER, PARKED_HEADER

    topology = broker.topology
    domain = "127.0.0.1:9"
    # Another governor released this domain a moment ago (the released log says so): this one
    # waits that permit's lifetime (permit_ttl, 10 s) before releasing it, longer than max_hold.
    foreign = Event(kind="released", task_id="t0", job="j", domain=domain, attempt=0, permit_id="elsewhere.1")
    await broker.publish(
        topology.events, "released", EventBatch(events=[foreign]), headers={GOVERNOR_HEADER: "elsewhere"}
    )
    task = frontier_task(domain, "parked")
    await broker.publish(topology.frontier, topology.shard_key(domain), task)
    seen: list[tuple[object, bool, int, int]] = []
    take = governor._on_task

    async def watched(got: Task, message: Delivery) -> None:
        if got.id == task.id:
            seen.append((message.headers.get(PARKED_HEADER), message.redelivered, message.crashes, message.failures))
        await take(got, message)

    governor._on_task = watched  # what the shard consumers call
    await governor.start()
    await wait_for(lambda: len(seen) >= 3, timeout=20)
    assert governor.core.queue(domain).cold_until == pytest.approx(foreign.at + broker.settings.permit_ttl)
    assert time.time() < foreign.at + broker.settings.permit_ttl  # still waiting out the takeover
    assert governor._parks >= 2
    # The first copy as published; every later one came back from a delay tier, a new message
    # marked with the second it was due back in: never a broker redelivery, no crash and no
    # failure counted.
    assert seen[0] == (None, False, 0, 0)
    assert all(isinstance(each[0], int) and each[0] > foreign.at for each in seen[1:]), seen
    assert all(each[1:] == (False, 0, 0) for each in seen[1:]), seen
    assert await depth(broker, topology.fetch_ready) == 0
    # Once no foreign permit can be in use any more, it is released.
    released = decode((await get_one(broker, topology.fetch_ready, timeout=20)).body, Task)
    assert released.id == task.id and released.permit is not None
    assert released.permit.issued >= foreign.at + broker.settings.permit_ttl


async def test_after_the_broker_drops_its_connections_the_governor_consumes_every_shard_again(
    broker: Broker, governor, settings: Settings
) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from .test_reconnect import drop_connections

    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to drop connections")
    topology = broker.topology
    await governor.start()

    async def consumed_everywhere() -> bool:
        try:
            probe = await broker.raw_channel()
            try:
                for spec in topology.shard_queues:
                    declared = await probe.queue_declare(spec.name, passive=True)
                    if not declared.consumer_count:
                        return False
                return True
            finally:
                await probe.close()
        except Exception:  # still reconnecting
            return False

    async def released(domain: str) -> None:
        task = frontier_task(domain, "after")
        for _ in range(100):  # the test's own connection may still be reconnecting
            try:
                await broker.publish(topology.frontier, topology.shard_key(domain), task)
                break
            except Exception:
                await asyncio.sleep(0.2)
        got = decode((await get_one(broker, topology.fetch_ready, timeout=30)).body, Task)
        assert got.id == task.id

    await released("127.0.0.1:9")
    for n in range(2):
        await drop_connections(settings.amqp_url)
        for _ in range(150):
            await asyncio.sleep(0.2)
            if await consumed_everywhere():
                break
        assert await consumed_everywhere()
        await released(f"127.0.0.1:{10 + n}")
    # Each shard channel restores its one queue after a reconnect, not a copy per reconnect.
    kept = [sum(len(queues) for queues in channel._queues.values()) for channel in governor.shard_channels]
    assert kept == [1] * len(topology.shard_queues)
