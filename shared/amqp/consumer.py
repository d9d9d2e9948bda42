"""The AMQP layer's consumer side: a delivery as handlers see it, and consumers that survive
reconnects.

Consumption sits on aiormq's channel, under aio-pika: a `Delivery` carries the body, the
properties and the two counts of the layer's headers (`x-hutch-crashes`,
`x-hutch-failures`); the layer settles it, never the handler. How a message is handled,
counted and dead-lettered is the broker module's (`Broker.consume`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractRobustChannel,
)
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


CRASHES = "x-hutch-crashes"  # header: times a consumer died holding this message
FAILURES = "x-hutch-failures"  # header: times a handler raised on this message

# x-death headers tell the history of broker dead-lettering (delay tiers); a republish is a new
# message, and the attempt count lives in the body, so they are dropped (their format also
# changed across RabbitMQ 3.13 and 4.x).
_DEATH_HEADERS = ("x-death", "x-first-death-", "x-last-death-")


def message_type(kind: str) -> str:
    """The AMQP `type` property `Broker.publish` gives a message of `kind` (a model's class
    name, or `raw`), by which a consumer given other models (`also`) tells them apart."""
    return f"hutch.{kind}"


def _count(value: object) -> int:
    """A count header as an int; anything else (absent, forged, wrong type) is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


Handler = Callable[[M, "Delivery"], Awaitable[None]]


class Delivery:
    """One message as a handler sees it; the layer settles it (handlers never ack).

    Consumed on aiormq's channel under aio-pika: aio-pika's own consumer builds a message
    object and starts a second task for every delivery, which was a tenth of the governor's
    time at 2,000 permits a second (bench/governor_permits.py).
    """

    __slots__ = ("_channel", "_tag", "body", "crashes", "failures", "properties", "redelivered", "routing_key")

    def __init__(self, message: DeliveredMessage, channel: aiormq.abc.AbstractChannel) -> None:
        delivery = message.delivery
        assert isinstance(delivery, Basic.Deliver)
        self._channel = channel
        self._tag = delivery.delivery_tag or 0
        self.body = message.body
        self.properties = message.header.properties
        self.redelivered = bool(delivery.redelivered)
        self.routing_key = delivery.routing_key
        headers = self.properties.headers
        # How often this message crashed a consumer, and made a handler raise (at this stage).
        self.crashes = _count(headers.get(CRASHES)) if headers else 0
        self.failures = _count(headers.get(FAILURES)) if headers else 0

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id

    @property
    def content_encoding(self) -> str | None:
        return self.properties.content_encoding

    @property
    def reply_to(self) -> str | None:
        return self.properties.reply_to

    @property
    def correlation_id(self) -> str | None:
        return self.properties.correlation_id

    # Settling asks for no drain (`wait=False`): an ack has no answer to wait for, and a drain
    # per ack would flush the socket once per message instead of once per loop iteration.
    async def ack(self) -> None:
        await cast(aiormq.Channel, self._channel).basic_ack(self._tag, wait=False)

    async def nack(self, requeue: bool = True) -> None:
        await cast(aiormq.Channel, self._channel).basic_nack(self._tag, requeue=requeue, wait=False)

    @property
    def channel_closed(self) -> bool:
        """The channel it came on is gone: the broker has requeued it already."""
        return bool(self._channel.is_closed)

    def properties_with(self, crashes: int, failures: int) -> Basic.Properties:
        """Its properties for a republish, with these counts."""
        return copy_properties(self.properties, {CRASHES: crashes, FAILURES: failures})


def copy_properties(p: Basic.Properties, headers: dict[str, Any] | None = None) -> Basic.Properties:
    """A received message's properties for publishing it again: `headers` set, broker
    dead-letter history dropped, everything else (message id, timestamp, trace) kept."""
    kept = {k: v for k, v in (p.headers or {}).items() if not k.startswith(_DEATH_HEADERS)}
    kept.update(headers or {})
    # No user_id: the broker checks it against the republishing connection's user.
    return Basic.Properties(
        content_type=p.content_type,
        content_encoding=p.content_encoding,
        headers=kept,
        delivery_mode=p.delivery_mode,
        priority=p.priority,
        correlation_id=p.correlation_id,
        reply_to=p.reply_to,
        expiration=p.expiration,
        message_id=p.message_id,
        timestamp=p.timestamp,
        message_type=p.message_type,
        app_id=p.app_id,
    )


@dataclass
class _Consuming:
    """What the layer needs to settle one consumer's messages, and its infrastructure streak."""

    queue: str
    stage: str
    model: type[BaseModel]
    handler: Handler[Any]
    dead_letter: bool
    max_crashes: int
    max_failures: int
    infra_errors: int = 0  # in a row; a handled message resets it
    # Other kinds of message the queue carries, by their `message_type` (`hutch.<Model>`):
    # each with its model and handler. Anything else is decoded as `model`.
    also: dict[str, tuple[type[BaseModel], Handler[Any]]] = field(default_factory=dict)

    def pick(self, message: Delivery) -> tuple[type[BaseModel], Handler[Any]]:
        """The model and the handler of this message, by its type."""
        if self.also:
            found = self.also.get(message.properties.message_type or "")
            if found is not None:
                return found
        return self.model, self.handler


class Consumer:
    """A running consumer: cancel it to stop taking messages; in-flight ones finish.

    It lives on a robust channel: when aio-pika reopens the channel after a reconnect (and has
    declared the queue again), the consumer subscribes again, unless it was cancelled.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue: str,
        on_message: Callable[[Delivery], Awaitable[None]],
        arguments: dict[str, Any] | None = None,
        *,
        no_ack: bool = False,
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = ""
        self.cancelled = False
        self._on_message = on_message
        self._arguments = arguments
        self._no_ack = no_ack
        self._underlay: aiormq.abc.AbstractChannel | None = None

    async def start(self) -> Consumer:
        """Subscribe now, and again each time aio-pika reopens the channel."""
        await self.subscribe()
        if isinstance(self.channel, AbstractRobustChannel):
            self.channel.reopen_callbacks.add(self.subscribe)
        return self

    async def subscribe(self, *_: Any) -> None:
        if self.cancelled:
            return
        underlay = await self.channel.get_underlay_channel()

        async def deliver(message: DeliveredMessage) -> None:
            await self._on_message(Delivery(message, underlay))

        ok = await underlay.basic_consume(self.queue, deliver, arguments=self._arguments, no_ack=self._no_ack)
        self.tag, self._underlay = ok.consumer_tag or "", underlay

    async def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if isinstance(self.channel, AbstractRobustChannel):
            self.channel.reopen_callbacks.discard(self.subscribe)
        if self._underlay is not None:
            with contextlib.suppress(Exception):
                await self._underlay.basic_cancel(self.tag)
