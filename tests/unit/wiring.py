"""A service's handlers without a broker: what they publish is recorded, not sent.

`worker(Fetcher, settings)` builds the service as it starts, minus the broker (its
`configure`), and gives it a `RecordingBroker`: each publish and dead letter lands in a list
the test reads, in order. `delivery(...)` stands for a message as a handler receives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pamqp.commands import Basic

from hutch.amqp import CRASHES, Delivery, topology_for
from hutch.models import DeadLetter, Model, decode, encode
from hutch.service import Service
from hutch.settings import Settings

S = TypeVar("S", bound=Service)
M = TypeVar("M", bound=Model)


@dataclass
class Published:
    exchange: str
    routing_key: str
    body: Model | bytes
    options: dict[str, Any]

    def as_(self, model: type[M]) -> M:
        """The body as `model`, as a consumer would decode it."""
        return decode(self.body if isinstance(self.body, bytes) else encode(self.body), model)


@dataclass
class RecordingBroker:
    settings: Settings
    published: list[Published] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.topology = topology_for(self.settings)

    async def publish(self, exchange: str, routing_key: str, body: Model | bytes, **options: Any) -> None:
        self.published.append(Published(exchange, routing_key, body, options))

    async def publish_dead(self, letter: DeadLetter) -> None:
        self.dead.append(letter)

    def decode(self, body: bytes, content_encoding: str | None, model: type[M]) -> M:
        return decode(body, model)

    def to(self, exchange: str) -> list[Published]:
        return [p for p in self.published if p.exchange == exchange]


def worker(service_class: type[S], settings: Settings) -> tuple[S, RecordingBroker]:
    """The service as its `configure` leaves it, on a recording broker."""
    service = service_class(settings)
    broker = RecordingBroker(settings)
    service.broker = broker  # type: ignore[assignment]  # the recorder has what the handlers use
    service.configure()  # type: ignore[attr-defined]
    return service, broker


class _OpenChannel:
    is_closed = False


def delivery(body: Model | bytes = b"", routing_key: str = "", crashes: int = 0, **properties: Any) -> Delivery:
    """A message as the AMQP layer hands it to a handler (never settled here)."""
    message = Delivery.__new__(Delivery)
    message._channel = _OpenChannel()  # type: ignore[assignment]
    message._tag = 1
    message.body = body if isinstance(body, bytes) else encode(body)
    message.routing_key = routing_key
    message.crashes = crashes
    message.failures = 0
    message.redelivered = False
    headers = dict(properties.pop("headers", {}) or {})
    if crashes:
        headers[CRASHES] = crashes
    message.properties = Basic.Properties(headers=headers or None, **properties)
    return message
