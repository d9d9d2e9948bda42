"""The real storer on a real RabbitMQ while its store fails for a while (full through
`max_page_count`, or read-only): every item ends stored once the store heals, none is
dead-lettered, and the ledger records a letter that arrived meanwhile exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from hutch.amqp import Broker
from hutch.models import DeadLetter, Item, Task, decode, task_id
from hutch.services.storer.app import Storer
from hutch.settings import Settings
from hutch.store import Store

pytestmark = pytest.mark.timeout(120)
JOB = "outage"
ITEMS = 40


def item(n: int) -> Item:
    url = f"http://example.com/{n}"
    task = Task(id=task_id(JOB, url), job=JOB, url=url, domain="example.com")
    return Item(task=task, status=200, fields={"body": "x" * 20_000}, parsed_at=1.0)


@pytest.fixture
async def storer(settings: Settings) -> AsyncIterator[Storer]:
    # A write that fails for more than a second is requeued: the outage below lasts longer,
    # so items go round through the broker too, not only through the retry in place.
    service = Storer(settings.model_copy(update={"store_retry_seconds": 1.0}))
    await service.connect(wait=False)
    await service.start()
    try:
        yield service
    finally:
        await service.shutdown()


def stored(settings: Settings) -> int:
    store = Store(settings.store_location)
    try:
        return int(store.db.execute("SELECT COUNT(*) FROM items WHERE job = ?", (JOB,)).fetchone()[0])
    finally:
        store.close()


@pytest.mark.parametrize("outage", ["full", "read_only"])
async def test_items_sent_while_the_store_fails_end_stored_once_it_heals_and_none_goes_dead(
    settings: Settings, storer: Storer, outage: str
) -> None:
    db = storer.store
    if outage == "full":
        pages = await db.run(lambda s: s.db.execute("PRAGMA page_count").fetchone()[0])
        await db.run(lambda s: s.db.execute(f"PRAGMA max_page_count = {pages}"))
        heal = "PRAGMA max_page_count = 1073741823"
    else:
        await db.run(lambda s: s.db.execute("PRAGMA query_only = 1"))
        heal = "PRAGMA query_only = 0"
    broker = await Broker(settings, "test-outage").connect()
    topology = broker.topology
    try:
        await asyncio.gather(*(broker.publish(topology.work, "store", item(n)) for n in range(ITEMS)))
        letter = DeadLetter(stage="fetch", reason="not_found", detail="HTTP 404", task=item(999).task)
        await broker.publish(topology.dead, "", letter)
        deadline = time.monotonic() + 30
        while storer.writer.outages < 10:  # the store keeps refusing; the storer keeps trying
            assert time.monotonic() < deadline, "the store never refused a write"
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.5)  # past store_retry_seconds: requeued, taken again, refused again
        assert stored(settings) == 0
        await db.run(lambda s: s.db.execute(heal))
        deadline = time.monotonic() + 60
        while stored(settings) < ITEMS:
            assert time.monotonic() < deadline, f"{stored(settings)} of {ITEMS} items stored after the store healed"
            await asyncio.sleep(0.2)
        store = Store(settings.store_location)
        try:
            deadline = time.monotonic() + 30
            while not store.dead_letters():
                assert time.monotonic() < deadline, "the ledger never recorded the letter"
                await asyncio.sleep(0.2)
            assert [(d["stage"], d["reason"]) for d in store.dead_letters()] == [("fetch", "not_found")]
            assert [row["state"] for row in store.tasks(JOB)] == ["stored"] * ITEMS
        finally:
            store.close()
        # Nothing the storer consumed went to the dead exchange: the inspection queue holds
        # only the letter the test sent.
        channel = await broker.channel()
        dlq = await channel.get_queue(topology.dlq, ensure=False)
        letters = []
        while (message := await dlq.get(fail=False, no_ack=True)) is not None:
            letters.append(decode(message.body, DeadLetter))
        assert [(x.stage, x.reason) for x in letters] == [("fetch", "not_found")]
    finally:
        await broker.close()
