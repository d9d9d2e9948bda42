"""Hutch's one thin AMQP layer, on aio-pika: connect, declare, publish, consume, RPC.

Three rules live here so no service has to remember them:

- Publishing goes through `Broker.publish` only: publisher confirms, `mandatory`, a
  timeout, a unique `message_id`, trace context in the headers; a nack, a return or a
  timeout raises `PublishFailed`. A caller that gets no exception knows the broker has it.
- Handlers never ack. `Broker.consume` wraps a handler: it decodes the body into its model
  (undecodable -> dead letter with reason `decode`), runs the handler inside a consumer span,
  and then acks when it returns, dead-letters on `Dead`, requeues on `Requeue` or on a failed
  publish, and on an unexpected error requeues once and dead-letters the redelivery, so a
  poison message never crash-loops a service. The handler publishes what it produced before
  it returns, so a message is acked only after its successors are confirmed (at-least-once).
- Connections are robust: after a broker restart aio-pika reopens channels and redeclares
  every exchange, queue and binding declared through them, including the domain queues the
  governor declares at run time, and each consumer subscribes again on the reopened channel.

The hot path sits on aiormq, the library under aio-pika, where aio-pika's conveniences cost
more than the work: publishes build their properties and pipeline on the channel, consumers
subscribe on the channel and get a small `Delivery`, and every connection writes the frames of
one loop iteration with one `send`. Measured in docs/benchmarks.md (permits per second).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
    ConnectionParameter,
)
from aio_pika.exceptions import AMQPError, DeliveryError, PublishError
from aiormq.abc import DeliveredMessage
from aiormq.connection import TCPTransportFactory
from opentelemetry import trace
from pamqp.commands import Basic
from pydantic import BaseModel
from yarl import URL

from hutch import telemetry
from hutch.models import DeadLetter, DecodeError, Model, Page, Task, decode, encode
from hutch.settings import Settings
from hutch.topology import QueueSpec, Topology

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class PublishFailed(Exception):
    """The broker did not take a message: nacked, returned as unroutable, or timed out."""


class BrokerUnreachable(Exception):
    """No broker answered at the configured URL."""


class Dead(Exception):
    """Raised by a handler: this message is finished for good; dead-letter it with `reason`."""

    def __init__(self, reason: str, detail: str = "", task: Task | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.task = task


class Requeue(Exception):
    """Raised by a handler: put the message back on its queue untouched (nothing was spent)."""


Handler = Callable[[M, "Delivery"], Awaitable[None]]


def task_id_of(body: object) -> str | None:
    """The id of the task a message is about, for span attributes and logs."""
    if isinstance(body, Task):
        return body.id
    task = getattr(body, "task", None)
    if isinstance(task, Task):
        return task.id
    found = getattr(body, "task_id", None)
    return found if isinstance(found, str) else None


def topology_for(settings: Settings) -> Topology:
    return Topology(settings.namespace, settings.queue_type, settings.retry_delays)


async def declare_queue(channel: AbstractChannel, spec: QueueSpec) -> AbstractQueue:
    queue = await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
    for exchange, key in spec.bindings:
        await queue.bind(exchange, key)
    return queue


class _BatchedWriter:
    """A stream writer that sends everything written in one loop iteration with one `send`.

    aiormq writes each frame on its own, and with TCP_NODELAY each becomes a segment the broker
    reads on its own: a busy governor sent ~30,000 segments a second. Gathering the frames of
    one loop iteration (publishes, acks, confirms asked for by many tasks) into one write
    spares a system call per frame here and a read per frame at the broker. Order is kept;
    `drain`, `write_eof` and `close` send what is gathered first.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        self._flush()
        await self._writer.drain()

    def write_eof(self) -> None:
        self._flush()
        self._writer.write_eof()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class _BatchingTCP(TCPTransportFactory):
    async def create(self, url: Any, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await super().create(url, **kwargs)
        return reader, cast(asyncio.StreamWriter, _BatchedWriter(writer))


class _Connection(aio_pika.RobustConnection):
    """aio-pika's robust connection, letting a transport factory through to aiormq."""

    PARAMETERS = (
        *aio_pika.RobustConnection.PARAMETERS,
        ConnectionParameter(name="transport_factory", parser=lambda value: value, is_kwarg=True),
    )


class Delivery:
    """One message as a handler sees it; the layer settles it (handlers never ack).

    Consumed on aiormq's channel under aio-pika: aio-pika's own consumer builds a message
    object and starts a second task for every delivery, which was a tenth of the governor's
    time at 2,000 permits a second (bench/governor_permits.py).
    """

    __slots__ = ("_channel", "_tag", "body", "properties", "redelivered", "routing_key")

    def __init__(self, message: DeliveredMessage, channel: aiormq.abc.AbstractChannel) -> None:
        delivery = message.delivery
        assert isinstance(delivery, Basic.Deliver)
        self._channel = channel
        self._tag = delivery.delivery_tag or 0
        self.body = message.body
        self.properties = message.header.properties
        self.redelivered = bool(delivery.redelivered)
        self.routing_key = delivery.routing_key

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id

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

        ok = await underlay.basic_consume(
            self.queue, deliver, arguments=self._arguments, no_ack=self._no_ack
        )
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


class Broker:
    """One process's connection to RabbitMQ with Hutch's publish and consume rules."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.topology = topology_for(settings)
        self.connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._topology_channel: AbstractChannel | None = None
        self._app_id = f"hutch-{name}"
        self._consumers: list[Consumer] = []
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self, *, declare: bool = True, timeout: float = 10.0) -> Broker:
        try:
            plain = self.settings.amqp_url.startswith("amqp://")
            # As aio_pika.connect_robust does, but with a transport factory (which it would put
            # into the URL's query); amqps keeps aiormq's own TLS transport.
            connection = _Connection(
                URL(self.settings.amqp_url),
                client_properties={"connection_name": f"hutch-{self.name}"},
                transport_factory=_BatchingTCP() if plain else None,
            )
            await connection.connect(timeout=timeout)
            self.connection = connection
        except (TimeoutError, OSError, AMQPError) as exc:
            raise BrokerUnreachable(
                f"cannot reach RabbitMQ at {self.settings.safe_amqp_url}: "
                f"{type(exc).__name__}: {exc}".rstrip(": ")
            ) from None
        self._publish_channel = await self.connection.channel(
            publisher_confirms=True, on_return_raises=True
        )
        if declare:
            await self.declare_topology()
        return self

    async def declare_topology(self) -> None:
        """Declare every static exchange, queue and binding; safe to repeat.

        The first declaration stays on a channel kept open, so that a broker that lost its
        definitions gets the whole topology back on reconnect: aio-pika restores that channel's
        exchanges, queues and bindings with the others, and retries a consumer's channel whose
        binding names an exchange not yet restored. (A reconnect callback would come too late:
        aio-pika runs those only after every channel was restored, and with the exchanges gone
        none can be, so the connection retried forever: tests/chaos/test_definitions_lost.py.)
        Later declarations use a channel of their own, closed after, so that the kept channel
        does not gather a copy of every queue per call, all redeclared at each reconnect.
        """
        keep = self._topology_channel is None
        channel = await self.channel()
        for exchange in self.topology.exchanges:
            await channel.declare_exchange(
                exchange.name, exchange.type, durable=True, arguments=exchange.arguments
            )
        for spec in self.topology.queues:
            await declare_queue(channel, spec)
        if keep:
            self._topology_channel = channel
        else:
            await channel.close()

    async def channel(self, prefetch: int = 0) -> AbstractChannel:
        assert self.connection is not None, "connect() first"
        channel = await self.connection.channel()
        if prefetch:
            await channel.set_qos(prefetch_count=prefetch)
        return channel

    async def stop_consuming(self) -> None:
        for consumer in self._consumers:
            await consumer.cancel()

    async def drain(self, grace: float) -> bool:
        """Wait until no handler is running, up to `grace` seconds; True if drained."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
            return True
        except TimeoutError:
            return False

    async def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
            self.connection = None
            self._topology_channel = None

    # -- publishing ------------------------------------------------------------------

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: Model | bytes,
        *,
        headers: dict[str, Any] | None = None,
        mandatory: bool = True,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        expiration: float | None = None,
        persistent: bool = True,
    ) -> None:
        """Publish one message and wait for the broker's confirm; raise PublishFailed if not."""
        payload = body if isinstance(body, bytes) else encode(body)
        kind = "raw" if isinstance(body, bytes) else type(body).__name__
        all_headers: dict[str, Any] = dict(headers or {})
        # Built here, not as aio-pika's Message: that object cost more than the rest of a
        # publish together (measured: bench/governor_permits.py). Same frames on the wire.
        properties = Basic.Properties(
            content_type="application/json",
            message_type=f"hutch.{kind}",
            message_id=uuid.uuid4().hex,
            timestamp=datetime.datetime.now(datetime.UTC),
            headers=all_headers,
            delivery_mode=2 if persistent else 1,
            reply_to=reply_to,
            correlation_id=correlation_id,
            expiration=None if expiration is None else str(max(int(expiration * 1000), 0)),
            app_id=self._app_id,
        )
        if not telemetry.enabled():
            await self._send(exchange, routing_key, payload, properties, mandatory)
            return
        with telemetry.tracer().start_as_current_span(
            f"{exchange or '(default)'} publish",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation": "publish",
                "messaging.destination.name": exchange,
                "messaging.rabbitmq.destination.routing_key": routing_key,
                "hutch.message.type": kind,
            },
        ) as span:
            about = task_id_of(body)
            if about is not None:
                span.set_attribute("hutch.task.id", about)
            telemetry.inject(all_headers)  # the properties hold this dict: sent with the trace
            await self._send(exchange, routing_key, payload, properties, mandatory)

    async def _send(
        self, exchange: str, routing_key: str, payload: bytes, properties: Basic.Properties, mandatory: bool
    ) -> None:
        # On the channel underneath aio-pika, with `wait=False`: aiormq releases the channel
        # after queueing the frames instead of after the socket write, so publishes from many
        # tasks pipeline on one channel; the confirm is still awaited, so nothing is acked
        # upstream before the broker has it.
        try:
            assert self._publish_channel is not None, "connect() first"
            channel = cast(aiormq.Channel, await self._publish_channel.get_underlay_channel())
            await channel.basic_publish(
                payload,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=mandatory,
                timeout=self.settings.publish_timeout,
                wait=False,
            )
        except PublishError as exc:
            raise PublishFailed(f"unroutable: {exchange} {routing_key!r}: {exc}") from None
        except DeliveryError as exc:
            raise PublishFailed(f"nacked by the broker: {exchange} {routing_key!r}: {exc}") from None
        except TimeoutError:
            raise PublishFailed(f"no confirm within {self.settings.publish_timeout}s") from None
        except (AMQPError, ConnectionError, RuntimeError) as exc:
            raise PublishFailed(f"{type(exc).__name__}: {exc}") from None

    async def publish_dead(
        self,
        stage: str,
        reason: str,
        detail: str = "",
        *,
        task: Task | None = None,
        page: Page | None = None,
        raw: bytes | None = None,
        queue: str | None = None,
    ) -> None:
        letter = DeadLetter(
            stage=stage,
            reason=reason,
            detail=detail[:2000],
            task=task or (page.task if page else None),
            page=page,
            raw=raw.decode("utf-8", "replace")[:65536] if raw is not None else None,
            queue=queue,
        )
        await self.publish(self.topology.dead, "", letter)

    # -- consuming -------------------------------------------------------------------

    async def consume(
        self,
        queue: str | QueueSpec,
        model: type[M],
        handler: Handler[M],
        *,
        stage: str,
        prefetch: int = 1,
        channel: AbstractChannel | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Consumer:
        """Consume `queue`, decoding each body as `model` and acking by the handler's outcome.

        The queue is (re)declared on the consumer's channel so that a robust reconnect
        restores it, its bindings and this consumer.
        """
        spec = queue if isinstance(queue, QueueSpec) else self.topology.queue(queue)
        channel = channel or await self.channel(prefetch)
        declared = await declare_queue(channel, spec)
        queue_name = spec.name

        async def on_message(message: Delivery) -> None:
            self._in_flight += 1
            self._idle.clear()
            try:
                await self._handle(message, queue_name, model, handler, stage)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

        consumer = await Consumer(channel, declared.name, on_message, arguments).start()
        self._consumers.append(consumer)
        return consumer

    async def listen(
        self, channel: AbstractChannel, queue: str, handler: Callable[[Delivery], Awaitable[None]]
    ) -> Consumer:
        """Consume `queue` without acks, for event streams.

        For a consumer whose state is all in memory and rebuilt from events (the governor's
        own events queue): no model, no span, no settling. `queue` must have been declared on
        `channel`, so that a reconnect restores it before the consumer subscribes again.
        """
        return await Consumer(channel, queue, handler, no_ack=True).start()

    async def _handle(
        self,
        message: Delivery,
        queue: str,
        model: type[M],
        handler: Handler[M],
        stage: str,
    ) -> None:
        if not telemetry.enabled():
            await self._process(message, queue, model, handler, stage, trace.INVALID_SPAN)
            return
        with telemetry.tracer().start_as_current_span(
            f"{queue} process",
            context=telemetry.extract(message.headers),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": message.message_id or "",
                "hutch.stage": stage,
            },
        ) as span:
            await self._process(message, queue, model, handler, stage, span)

    async def _process(
        self,
        message: Delivery,
        queue: str,
        model: type[M],
        handler: Handler[M],
        stage: str,
        span: trace.Span,
    ) -> None:
        try:
            payload = decode(message.body, model)
        except DecodeError as exc:
            log.warning("undecodable message on %s: %s", queue, exc)
            span.set_attribute("hutch.outcome", "decode")
            await self._dead_then_ack(message, stage, "decode", str(exc), None, queue)
            return
        about = task_id_of(payload)
        if about is not None:
            span.set_attribute("hutch.task.id", about)
        try:
            await handler(payload, message)
        except Dead as dead:
            span.set_attribute("hutch.outcome", f"dead:{dead.reason}")
            task = dead.task or (payload if isinstance(payload, Task) else getattr(payload, "task", None))
            await self._dead_then_ack(message, stage, dead.reason, dead.detail, task, queue, payload)
        except Requeue:
            await self._settle(message, requeue=True)
        except (PublishFailed, AMQPError, ConnectionError) as exc:
            log.warning("%s: could not pass work on (%s); requeued", queue, exc)
            await self._settle(message, requeue=True)
        except asyncio.CancelledError:
            await self._settle(message, requeue=True)
            raise
        except Exception as exc:
            span.record_exception(exc)
            if message.redelivered:
                log.exception("%s: handler failed twice; dead-lettering", queue)
                task = payload if isinstance(payload, Task) else getattr(payload, "task", None)
                await self._dead_then_ack(
                    message, stage, "error", f"{type(exc).__name__}: {exc}", task, queue, payload
                )
            else:
                log.exception("%s: handler failed; requeued once", queue)
                await self._settle(message, requeue=True)
        else:
            await self._settle(message)

    async def _dead_then_ack(
        self,
        message: Delivery,
        stage: str,
        reason: str,
        detail: str,
        task: Task | None,
        queue: str,
        payload: object = None,
    ) -> None:
        page = payload if isinstance(payload, Page) else None
        try:
            await self.publish_dead(
                stage, reason, detail, task=task, page=page, raw=None if task else message.body, queue=queue
            )
        except PublishFailed as exc:
            log.warning("dead letter not confirmed (%s); message requeued", exc)
            await self._settle(message, requeue=True)
            return
        await self._settle(message)

    @staticmethod
    async def _settle(message: Delivery, requeue: bool | None = None) -> None:
        """Ack, or nack with requeue; a closed channel means the broker redelivers anyway."""
        try:
            if requeue is None:
                await message.ack()
            else:
                await message.nack(requeue=requeue)
        except Exception as exc:  # channel gone: the broker will redeliver the message
            log.debug("could not settle message: %s", exc)


class RpcClient:
    """Request/response over AMQP with JSON bodies, many calls in flight at once.

    Replies come to an exclusive queue this client names itself (so a robust reconnect can
    redeclare it under the same name) and are matched by correlation id.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._reply_queue = f"{broker.topology.prefix}rpc.reply.{broker.name}.{uuid.uuid4().hex[:12]}"

    async def start(self) -> RpcClient:
        channel = await self.broker.channel()
        queue = await channel.declare_queue(self._reply_queue, exclusive=True, auto_delete=True)
        await queue.consume(self._on_reply, no_ack=True)
        return self

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        future = self._pending.pop(message.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message.body)

    async def call(self, queue: str, request: Model, response: type[M], timeout: float) -> M:
        """Send `request` to `queue` and wait up to `timeout` for the answer."""
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        try:
            await self.broker.publish(
                "",
                queue,
                request,
                reply_to=self._reply_queue,
                correlation_id=correlation_id,
                expiration=timeout,
                persistent=False,
            )
            body = await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(correlation_id, None)
        return decode(body, response)


async def serve_rpc(
    broker: Broker,
    queue: str,
    request_model: type[M],
    answer: Callable[[M], Awaitable[Model]],
    *,
    prefetch: int = 64,
) -> Consumer:
    """Answer requests on `queue` with `answer(request)`, replying to each `reply_to`."""

    async def handler(request: M, message: Delivery) -> None:
        result = await answer(request)
        if message.reply_to:
            # Not mandatory: a caller that timed out and left has nothing to return to.
            await broker.publish(
                "",
                message.reply_to,
                result,
                mandatory=False,
                correlation_id=message.correlation_id,
                persistent=False,
            )

    return await broker.consume(queue, request_model, handler, stage="rpc", prefetch=prefetch)
