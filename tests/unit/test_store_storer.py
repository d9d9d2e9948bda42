"""The storer's handlers on a real store file, without a broker: a store outage becomes a
requeue (nothing spent, nothing dead), and the ledger records a letter it cannot take as it is."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hutch.amqp import Requeue
from hutch.models import DeadLetter, Item, Task, task_id
from hutch.services.storer.app import LETTER_ID, Storer
from hutch.services.storer.writer import GroupWriter
from hutch.settings import Settings
from hutch.store import AsyncStore, Store


class FakeDelivery:
    """What the handlers read of a delivery: headers and the message id."""

    def __init__(self, headers: dict[str, Any] | None = None, message_id: str = "m-1") -> None:
        self.headers = headers or {}
        self.message_id = message_id


def task(n: int = 1) -> Task:
    url = f"http://example.com/{n}"
    return Task(id=task_id("j", url), job="j", url=url, domain="example.com")


@pytest.fixture
async def storer(tmp_path: Path) -> AsyncIterator[Storer]:
    service = Storer(Settings(data_dir=tmp_path))
    service.store = await AsyncStore(service.settings.store_location).open()
    service.writer = GroupWriter(
        service.store.run, batch=16, wait=0.0, retry_seconds=0.3, clock=time.monotonic
    ).start()
    yield service
    await service.writer.close()
    await service.store.close()


async def test_an_item_the_store_cannot_take_for_a_while_is_requeued_not_failed(storer: Storer) -> None:
    await storer.store.run(lambda s: s.db.execute("PRAGMA query_only = 1"))
    item = Item(task=task(), status=200, fields={"title": "T"}, parsed_at=1.0)
    with pytest.raises(Requeue):
        await storer._on_item(item, FakeDelivery())  # type: ignore[arg-type]
    await storer.store.run(lambda s: s.db.execute("PRAGMA query_only = 0"))
    await storer._on_item(item, FakeDelivery())  # type: ignore[arg-type]
    assert await storer.store.run(lambda s: s.task_state(item.task.id)) == "stored"


async def test_a_dead_letter_during_a_store_outage_is_requeued(storer: Storer) -> None:
    await storer.store.run(lambda s: s.db.execute("PRAGMA query_only = 1"))
    with pytest.raises(Requeue):
        await storer._on_dead(DeadLetter(stage="fetch", reason="x", task=task()), FakeDelivery())  # type: ignore[arg-type]


async def test_a_letter_the_ledger_cannot_record_as_it_is_is_recorded_without_its_task(
    storer: Storer, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Store.record_dead

    def refuse_tasks(self: Store, letter: DeadLetter, message_id: str) -> None:
        if letter.task is not None:
            raise sqlite3.IntegrityError("something about this letter")
        original(self, letter, message_id)

    monkeypatch.setattr(Store, "record_dead", refuse_tasks)
    letter = DeadLetter(stage="parse", reason="parse_timeout", detail="slow page", task=task())
    await storer._on_dead(letter, FakeDelivery(message_id="m-7"))  # type: ignore[arg-type]
    (entry,) = await storer.store.run(lambda s: s.dead_letters())
    assert (entry["message_id"], entry["stage"], entry["reason"], entry["task_id"]) == (
        "m-7", "parse", "parse_timeout", None,
    )  # fmt: skip
    assert "recorded without its task: IntegrityError" in entry["detail"]


async def test_a_letter_named_by_the_storer_is_recorded_once_under_that_name(storer: Storer) -> None:
    letter = DeadLetter(stage="reconcile", reason="stalled", task=task())
    for message_id in ("first-copy", "second-copy"):
        await storer._on_dead(letter, FakeDelivery({LETTER_ID: "stalled:t:1"}, message_id))  # type: ignore[arg-type]
    assert [e["message_id"] for e in await storer.store.run(lambda s: s.dead_letters())] == ["stalled:t:1"]


async def test_a_letter_the_ledger_cannot_record_at_all_is_never_dead_lettered_again(
    storer: Storer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Store, letter: DeadLetter, message_id: str) -> None:
        raise sqlite3.IntegrityError("nothing about this letter fits")

    monkeypatch.setattr(Store, "record_dead", refuse)
    # Returns (so the layer acks) instead of raising (so the layer would dead-letter it).
    await storer._on_dead(DeadLetter(stage="fetch", reason="x", task=task()), FakeDelivery())  # type: ignore[arg-type]
    monkeypatch.undo()
    assert await storer.store.run(lambda s: s.dead_letters()) == []
