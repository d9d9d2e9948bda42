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
async def test_an_infrastructure_error_in_a_handler_spends_nothing(broker: Broker, error: Exception) -> None:
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

    await broker.publish_dead("parse", "parse", "bad page", page=make_page())  # to dlq and ledger
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
    """Give each task coming back to its domain queue a fresh permit, as the governor would."""
    from hutch.amqp import declare_queue
    from hutch.models import Permit

    channel = await broker.channel()
    queue = await declare_queue(channel, broker.topology.domain_queue(domain))
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
    await asyncio.sleep(0.2)  # the domain queue is declared
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


# -- the governor: returns by republish, consumers that always come back ----------------


@pytest.fixture
async def governor(settings: Settings):  # type: ignore[no-untyped-def]
    """A real governor service in this process (robots.txt ignored)."""
    from hutch.services.governor.app import Governor

    service = Governor(settings.model_copy(update={"respect_robots": False, "max_hold": 1.0}))
    await service.connect()
    yield service
    service.stopping.set()
    await service.shutdown()


async def test_a_governor_returns_a_task_it_cannot_release_yet_by_republish_not_by_requeue(
    broker: Broker, governor
) -> None:  # type: ignore[no-untyped-def]
    from hutch.amqp import CRASHES, FAILURES, declare_queue
    from hutch.models import DomainRecord

    domain = "127.0.0.1:9"
    spec = broker.topology.domain_queue(domain)
    channel = await broker.channel()
    await declare_queue(channel, spec)
    url = "http://127.0.0.1:9/held"
    await broker.publish(
        broker.topology.frontier, "d." + domain, Task(id=task_id("j", url), job="j", url=url, domain=domain)
    )
    # A domain it did not create: the governor waits one permit lifetime (takeover) before
    # releasing, longer than it may hold a message, so it returns the task and pauses.
    await broker.publish("", broker.topology.domains, DomainRecord(domain=domain))
    await governor.start()
    await wait_for(lambda: domain in governor.domains and governor.domains[domain].resume is not None)
    message = await get_one(broker, spec.name)
    assert decode(message.body, Task).url == url
    assert message.redelivered is False  # not a nack-requeue: no delivery counted, no crash
    assert message.headers[CRASHES] == 0 and message.headers[FAILURES] == 0
    assert await depth(broker, broker.topology.fetch_ready) == 0


async def test_resuming_a_paused_domain_declares_its_queue_object_only_once(broker: Broker, governor) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import DomainRecord

    domain = "127.0.0.1:9"
    name = broker.topology.domain_queue(domain).name
    await governor.start()
    await broker.publish("", broker.topology.domains, DomainRecord(domain=domain))
    await wait_for(lambda: domain in governor.domains and governor.domains[domain].consumer is not None)
    state = governor.domains[domain]
    for _ in range(5):
        governor._pause(domain, 0.05)
        assert state.consumer is None
        await wait_for(lambda: state.consumer is not None)

    def kept() -> int:  # queue objects the robust channels would redeclare after a reconnect
        return sum(len(ch._queues.get(name, ())) for ch in governor.domain_channels)

    assert kept() == 1
    # And the consumer resumed last is the live one: a task still gets through.
    url = "http://127.0.0.1:9/after-resumes"
    governor.core.queue(domain).cold_until = 0.0
    await broker.publish(
        broker.topology.frontier, "d." + domain, Task(id=task_id("j", url), job="j", url=url, domain=domain)
    )
    assert decode((await get_one(broker, broker.topology.fetch_ready, timeout=20)).body, Task).url == url


async def test_a_domain_whose_consumer_failed_to_start_is_tried_again_until_it_runs(
    broker: Broker, governor, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from hutch.models import DomainRecord

    domain = "127.0.0.1:9"
    real = governor.broker.consume
    failures = 0

    async def flaky(queue, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal failures
        if getattr(queue, "name", "") == broker.topology.domain_queue(domain).name and failures < 2:
            failures += 1
            raise ConnectionError("connection dropped mid-declare")
        return await real(queue, *args, **kwargs)

    monkeypatch.setattr(governor.broker, "consume", flaky)
    await governor.start()
    await broker.publish("", broker.topology.domains, DomainRecord(domain=domain))
    await wait_for(lambda: failures == 2)
    assert domain in governor.domains  # watched...
    await wait_for(lambda: governor.domains[domain].consumer is not None)  # ...and consumed in the end
    probe = await broker.channel()
    declared = await probe.declare_queue(broker.topology.domain_queue(domain).name, passive=True)
    assert declared.declaration_result.consumer_count == 1
