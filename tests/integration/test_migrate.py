"""A topology change strands nothing: what waits in the old version's queues, and in this
version's former per-domain frontier queues, moves into the frontier's shards."""

from __future__ import annotations

import time

import aiormq
import pytest

from hutch.amqp import Broker, declare_queue
from hutch.migrate import migrate
from hutch.models import DeadLetter, Page, Task, decode, task_id
from hutch.settings import Settings
from hutch.topology import QueueSpec, Topology, routing_key

from .legacy import leave_domain_queue
from .test_amqp import depth, get_one

LEGACY_DOMAIN = "127.0.0.1:11"  # a domain with a queue of its own in this version, before the shards

pytestmark = pytest.mark.timeout(90)


def make_task(path: str, domain: str = "127.0.0.1:9") -> Task:
    url = f"http://{domain}/{path}"
    return Task(id=task_id("job", url), job="job", url=url, domain=domain)


def v2_queues(old: Topology) -> list[QueueSpec]:
    """The static queues v2 had: the ones of the sharded frontier came with v3, `intake`,
    `proxy-state`, the park queues and `alive` later."""
    newer = {
        old.paused,
        old.alive,
        old.jobs,
        old.released_log,
        old.intake,
        old.proxy_state,
        *(spec.name for spec in old.shard_queues),
        *(old.park_exchange(d) for d in old.delays),
    }
    return [spec for spec in old.queues if spec.name not in newer]


async def fill_old_version(settings: Settings) -> tuple[Topology, dict[str, Task], Page]:
    """A broker as a v2 Hutch left it (a domain queue, a tier, unrouted, parse, the dead
    letters), and a v3 domain queue as this version left it before the frontier was sharded."""
    old_broker = await Broker(settings, "old-hutch").connect(declare=False)
    old = Topology(settings.namespace, settings.queue_type, settings.retry_delays, version="v2")
    old_broker.topology = old
    try:
        channel = await old_broker.channel()
        for exchange in old.exchanges:
            await channel.declare_exchange(exchange.name, exchange.type, durable=True, arguments=exchange.arguments)
        for spec in v2_queues(old):
            await declare_queue(channel, spec)
        await leave_domain_queue(old_broker, old, "127.0.0.1:9")
        tasks = {
            "waiting": make_task("waiting"),
            "in-a-tier": make_task("in-a-tier"),
            "unrouted": make_task("unrouted", domain="127.0.0.1:10"),
        }
        await old_broker.publish(old.frontier, routing_key("127.0.0.1:9"), tasks["waiting"])
        await old_broker.publish(
            old.tier_exchange(max(old.retry_delays)), routing_key("127.0.0.1:9"), tasks["in-a-tier"]
        )
        await old_broker.publish(old.frontier, routing_key("127.0.0.1:10"), tasks["unrouted"])
        page = Page(task=tasks["waiting"], status=200, final_url="u", text="<p>old</p>", fetched_at=time.time())
        await old_broker.publish(old.work, "parse", page, headers={"x-hutch-failures": 1})
        await old_broker.publish_dead(page.dead_letter("parse", "parse", "bad selector"))
        assert await depth(old_broker, old.domain_queue("127.0.0.1:9").name) >= 1
        assert await depth(old_broker, old.dlq) == 1
    finally:
        await old_broker.close()
    unsharded = await Broker(settings, "unsharded-hutch").connect()
    try:
        tasks["in-a-v3-domain-queue"] = make_task("in-a-v3-domain-queue", domain=LEGACY_DOMAIN)
        name = await leave_domain_queue(unsharded, unsharded.topology, LEGACY_DOMAIN)
        await unsharded.publish("", name, tasks["in-a-v3-domain-queue"])
        assert await depth(unsharded, name) == 1
    finally:
        await unsharded.close()
    return old, tasks, page


async def exists(broker: Broker, queue: str) -> bool:
    channel = await broker.channel()
    underlay = await channel.get_underlay_channel()
    try:
        await underlay.queue_declare(queue, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        await channel.close()


async def test_messages_in_the_previous_versions_queues_and_the_domain_queues_move_into_the_shards(
    settings: Settings,
) -> None:
    old, tasks, page = await fill_old_version(settings)
    broker = await Broker(settings, "test").connect()
    try:
        assert broker.topology.version != old.version
        moved = await migrate(broker)
        assert moved == 4 + 1 + 2  # the tasks, the page, the dead letter in the dlq and the ledger
        new = broker.topology
        # Tasks of a domain queue or a tier go to their domain's shard under its shard key...
        sharded = {t.url: new.shard_key(t.domain) for t in tasks.values() if t.domain != "127.0.0.1:10"}
        arrived = {}
        for name in {new.shard_queue(new.shard_of(t.domain)).name for t in tasks.values()}:
            for _ in range(await depth(broker, name)):
                message = await get_one(broker, name)
                arrived[decode(message.body, Task).url] = message.routing_key
        assert arrived == sharded
        # ...and one that had fallen through to the old unrouted waits in the new one, its key
        # kept (the governor routes it into its shard).
        message = await get_one(broker, new.unrouted)
        assert decode(message.body, Task) == tasks["unrouted"]
        assert message.routing_key == routing_key("127.0.0.1:10")
        message = await get_one(broker, new.parse)
        assert decode(message.body, Page) == page
        assert message.headers["x-hutch-failures"] == 1  # counts travel with the message
        for queue in (new.dlq, new.ledger):
            letter = decode((await get_one(broker, queue)).body, DeadLetter)
            assert letter.reason == "parse" and letter.page == page
        for name in (
            *(spec.name for spec in v2_queues(old)),
            old.domain_queue("127.0.0.1:9").name,
            old.domains,
            new.domain_queue(LEGACY_DOMAIN).name,
            new.domains,
        ):
            assert not await exists(broker, name), name
        assert await migrate(broker) == 0  # nothing left: a second start moves nothing
    finally:
        await broker.close()


async def test_a_governor_starting_on_a_broker_with_old_work_releases_it_in_the_new_topology(
    settings: Settings,
) -> None:
    from hutch.services.governor.app import Governor

    _, tasks, _ = await fill_old_version(settings)
    governor = Governor(settings.model_copy(update={"respect_robots": False}))
    await governor.connect()
    await governor.start()
    broker = await Broker(settings, "test").connect()
    try:
        released = set()
        for _ in range(len(tasks)):
            released.add(decode((await get_one(broker, broker.topology.fetch_ready, timeout=30)).body, Task).url)
        assert released == {t.url for t in tasks.values()}
    finally:
        await broker.close()
        governor.stopping.set()
        await governor.shutdown()


async def test_while_one_process_migrates_another_moves_nothing_and_deletes_nothing(settings: Settings) -> None:
    from hutch.migrate import _lock, _unlock

    old, _, _ = await fill_old_version(settings)
    first = await Broker(settings, "first").connect()
    second = await Broker(settings, "second").connect()
    try:
        lock = await _lock(first)
        assert lock is not None
        assert await migrate(second) == 0
        for name in (old.parse, old.domain_queue("127.0.0.1:9").name, second.topology.domain_queue(LEGACY_DOMAIN).name):
            assert await exists(second, name), name
        assert await depth(second, second.topology.domain_queue(LEGACY_DOMAIN).name) == 1
        await _unlock(first, lock)
        assert await migrate(second) == 7
    finally:
        await first.close()
        await second.close()


async def test_a_park_left_in_an_older_versions_park_queue_moves_into_its_shard_without_its_expiration(
    settings: Settings,
) -> None:
    # A park carries its own expiration (`park_slot`); kept in a shard, it would expire there.
    old_broker = await Broker(settings, "old-hutch").connect(declare=False)
    old = Topology(settings.namespace, settings.queue_type, settings.retry_delays, version="v2")
    old_broker.topology = old
    task = make_task("parked")
    delay = old.delays[-1]
    try:
        channel = await old_broker.channel()
        await channel.declare_exchange(old.park_exchange(delay), "fanout", durable=True)
        spec = old.queue(old.park_exchange(delay))
        # A TTL longer than the tests' tiers, so the park waits there whatever the machine's load.
        await declare_queue(channel, QueueSpec(spec.name, {**spec.arguments, "x-message-ttl": 60_000}, spec.bindings))
        await old_broker.publish(old.park_exchange(delay), old.shard_key(task.domain), task, expiration=30.0)
        assert await depth(old_broker, old.park_exchange(delay)) == 1
    finally:
        await old_broker.close()
    broker = await Broker(settings, "test").connect()
    try:
        assert await migrate(broker) == 1
        new = broker.topology
        message = await get_one(broker, new.shard_queue(new.shard_of(task.domain)).name)
        assert decode(message.body, Task) == task
        assert message.expiration is None
        assert not await exists(broker, old.park_exchange(delay))
    finally:
        await broker.close()
