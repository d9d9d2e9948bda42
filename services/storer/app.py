"""The storer's wiring: items, outcome events and dead letters into the store.

Each message is acked only after its write has committed, and every write is an upsert
keyed so that a redelivered message changes nothing (see `hutch.store`).
"""

from __future__ import annotations

from hutch.amqp import Delivery
from hutch.models import AnyEvent, DeadLetter, Item
from hutch.service import Service
from hutch.store import AsyncStore


class Storer(Service):
    name = "storer"

    async def start(self) -> None:
        self.store = await AsyncStore(self.settings.store_location).open()
        topology = self.broker.topology
        await self.broker.consume(topology.store, Item, self._on_item, stage="store", prefetch=32)
        await self.broker.consume(
            topology.events_storer, AnyEvent, self._on_event, stage="store", prefetch=64
        )
        await self.broker.consume(
            topology.ledger, DeadLetter, self._on_dead, stage="store", prefetch=32, dead_letter=False
        )

    async def stop(self) -> None:
        await self.store.close()

    async def _on_item(self, item: Item, _: Delivery) -> None:
        await self.store.run(lambda store: store.store_item(item))

    async def _on_event(self, message: AnyEvent, _: Delivery) -> None:
        events = message.events()
        await self.store.run(lambda store: store.apply_events(events))

    async def _on_dead(self, letter: DeadLetter, message: Delivery) -> None:
        key = message.message_id or f"{letter.stage}:{letter.at}"
        await self.store.run(lambda store: store.record_dead(letter, key))


SERVICE = Storer
