"""The AMQP layer and the topology against a real RabbitMQ: what cannot be faked faithfully."""

from __future__ import annotations

import asyncio
import time
import zlib

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from hutch_sandbox.pages import render_page

from hutch.amqp import Broker, Dead, Delivery, PublishFailed, RpcClient, serve_rpc
from hutch.models import DeadLetter, Lease, LeaseRequest, Page, Task, decode, encode, task_id
from hutch.settings import Settings
from hutch.topology import routing_key

pytestmark = pytest.mark.timeout(60)


def make_task(url: str = "http://127.0.0.1:9/page/1", domain: str = "127.0.0.1:9") -> Task:
    return Task(id=task_id("job", url), job="job", url=url, domain=domain)


async def get_one(broker: Broker, queue: str, timeout: float = 5.0) -> AbstractIncomingMessage:
    channel = await broker.channel()
    q = await channel.get_queue(queue, ensure=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = await q.get(fail=False, no_ack=True)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing arrived on {queue} within {timeout}s")


async def depth(broker: Broker, queue: str) -> int:
    channel = await broker.channel()
    declared = await channel.declare_queue(queue, passive=True)
    await channel.close()
    return declared.declaration_result.message_count or 0


@pytest.fixture
async def broker(settings: Settings):
    b = await Broker(settings, "test").connect()
    yield b
    await b.close()


async def test_publish_to_a_key_nothing_is_bound_to_raises_publish_failed(broker: Broker) -> None:
    with pytest.raises(PublishFailed, match="unroutable"):
        await broker.publish(broker.topology.work, "no-such-queue", make_task())


async def test_a_task_under_a_key_no_shard_is_bound_to_falls_through_to_unrouted(broker: Broker) -> None:
    task = make_task()
    await broker.publish(broker.topology.frontier, routing_key(task.domain), task)
    message = await get_one(broker, broker.topology.unrouted)
    assert message.routing_key == "d.127.0.0.1:9"
    assert decode(message.body, Task).id == task.id


async def test_retry_tier_dead_letters_back_into_the_tasks_own_shard(broker: Broker) -> None:
    topology = broker.topology
    task = make_task()
    own = topology.shard_queue(topology.shard_of(task.domain)).name
    others = [spec.name for spec in topology.shard_queues if spec.name != own]
    started = time.monotonic()
    await broker.publish(topology.tier_exchange(0.5), topology.shard_key(task.domain), task)
    assert await depth(broker, own) == 0
    message = await get_one(broker, own, timeout=5)
    assert time.monotonic() - started >= 0.4
    assert decode(message.body, Task).id == task.id
    assert message.routing_key == topology.shard_key(task.domain)
    for name in others:
        assert await depth(broker, name) == 0, name
    assert await depth(broker, topology.unrouted) == 0


async def test_handler_that_returns_gets_its_message_acked(broker: Broker) -> None:
    seen: list[str] = []

    async def handler(task: Task, _: Delivery) -> None:
        seen.append(task.id)

    await broker.consume(broker.topology.parse, Task, handler, stage="test")
    await broker.publish(broker.topology.work, "parse", make_task())
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.05)
    await broker.stop_consuming()
    await broker.drain(2)
    assert len(seen) == 1
    assert await depth(broker, broker.topology.parse) == 0


async def test_undecodable_message_goes_dead_with_reason_decode_and_is_not_redelivered(
    broker: Broker,
) -> None:
    calls = 0

    async def handler(task: Task, _: Delivery) -> None:
        nonlocal calls
        calls += 1

    await broker.consume(broker.topology.parse, Task, handler, stage="parse")
    await broker.publish(broker.topology.work, "parse", b'{"v": 7, "nonsense": true}')
    letter = decode((await get_one(broker, broker.topology.dlq)).body, DeadLetter)
    assert letter.reason == "decode"
    assert letter.stage == "parse"
    assert letter.raw is not None and "nonsense" in letter.raw
    assert calls == 0
    await asyncio.sleep(0.3)
    assert await depth(broker, broker.topology.parse) == 0


def make_page() -> Page:
    task = make_task()
    html = render_page("docs.test", 3, 100)
    return Page(task=task, status=200, final_url=task.url, content_type="text/html", text=html, fetched_at=1.0)


async def test_with_a_threshold_a_large_page_crosses_compressed_and_any_consumer_gets_it_as_it_was(
    settings: Settings,
) -> None:
    page = make_page()
    compressing = await Broker(settings.model_copy(update={"compress_above": 16384}), "test").connect()
    try:
        for _ in range(2):
            await compressing.publish(compressing.topology.work, "parse", page)
    finally:
        await compressing.close()
    broker = await Broker(settings, "test").connect()
    wire = await get_one(broker, broker.topology.parse)
    assert wire.content_encoding == "zlib"
    assert len(encode(page)) > 90_000
    assert len(wire.body) < len(encode(page)) // 3

    got: list[Page] = []

    async def handler(received: Page, _: Delivery) -> None:
        got.append(received)

    try:
        await broker.consume(broker.topology.parse, Page, handler, stage="parse")
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
    finally:
        await broker.close()
    assert got == [page]


@pytest.mark.parametrize(
    ("body", "encoding", "why"),
    [
        (zlib.compress(b" " * (64 * 1024 * 1024), 9), "zlib", "inflates beyond 20,971,520 bytes"),
        (b"x" * 100, "zlib", "corrupt zlib body"),
        (zlib.compress(b'{"v": 1}'), "lzma", "unknown content_encoding 'lzma'"),
    ],
    ids=["bomb", "corrupt", "unknown"],
)
async def test_a_body_that_cannot_be_inflated_goes_dead_with_its_reason_and_the_consumer_goes_on(
    broker: Broker, body: bytes, encoding: str, why: str
) -> None:
    got: list[Page] = []

    async def handler(received: Page, _: Delivery) -> None:
        got.append(received)

    await broker.consume(broker.topology.parse, Page, handler, stage="parse")
    channel = await broker.channel()
    message = aio_pika.Message(body, content_encoding=encoding, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await channel.default_exchange.publish(message, routing_key=broker.topology.parse)
    dead = await get_one(broker, broker.topology.dlq)
    letter = broker.decode(dead.body, dead.content_encoding, DeadLetter)
    assert (letter.reason, letter.stage, letter.queue) == ("decode", "parse", broker.topology.parse)
    assert why in letter.detail
    assert letter.raw is not None
    page = make_page()
    await broker.publish(broker.topology.work, "parse", page)
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.05)
    assert got == [page]
    assert await depth(broker, broker.topology.parse) == 0


async def test_handler_raising_dead_sends_the_task_to_both_dlq_and_ledger(broker: Broker) -> None:
    async def handler(task: Task, _: Delivery) -> None:
        raise Dead("not_found", "HTTP 404")

    await broker.consume(broker.topology.parse, Task, handler, stage="fetch")
    task = make_task()
    await broker.publish(broker.topology.work, "parse", task)
    for queue in (broker.topology.dlq, broker.topology.ledger):
        letter = decode((await get_one(broker, queue)).body, DeadLetter)
        assert (letter.reason, letter.stage, letter.detail) == ("not_found", "fetch", "HTTP 404")
        assert letter.task is not None and letter.task.id == task.id


async def test_handler_failing_every_time_is_dead_lettered_after_max_failures_instead_of_looping(
    broker: Broker,
) -> None:
    seen: list[tuple[int, bool]] = []

    async def handler(task: Task, message: Delivery) -> None:
        seen.append((message.failures, message.redelivered))
        raise RuntimeError("boom")

    await broker.consume(broker.topology.parse, Task, handler, stage="parse")
    await broker.publish(broker.topology.work, "parse", make_task())
    letter = decode((await get_one(broker, broker.topology.dlq)).body, DeadLetter)
    assert letter.reason == "error"
    assert "RuntimeError: boom" in letter.detail
    # Counted in the headers of fresh copies (republish and ack), never by a broker requeue.
    assert seen == [(0, False), (1, False), (2, False)]
    assert broker.settings.max_failures == 3


async def test_rpc_answers_many_concurrent_calls_by_correlation(broker: Broker) -> None:
    async def answer(request: LeaseRequest) -> Lease:
        await asyncio.sleep(0.01)
        return Lease(proxy_id=f"px-{request.task_id}", tier="datacenter")

    await serve_rpc(broker, broker.topology.rpc_proxy, LeaseRequest, answer)
    client = await RpcClient(broker).start()
    leases = await asyncio.gather(
        *(
            client.call(
                broker.topology.rpc_proxy,
                LeaseRequest(task_id=str(i), domain="d"),
                Lease,
                timeout=5,
            )
            for i in range(50)
        )
    )
    assert [lease.proxy_id for lease in leases] == [f"px-{i}" for i in range(50)]


async def test_rpc_call_with_no_server_times_out(broker: Broker) -> None:
    client = await RpcClient(broker).start()
    with pytest.raises(asyncio.TimeoutError):
        await client.call(
            broker.topology.rpc_proxy, LeaseRequest(task_id="x", domain="d"), Lease, timeout=0.5
        )


async def test_declaring_the_topology_twice_is_harmless(broker: Broker) -> None:
    await broker.declare_topology()
    await broker.declare_topology()
