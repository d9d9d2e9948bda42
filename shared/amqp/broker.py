"""The AMQP layer's broker: connect, declare, publish with confirms, and consume by Hutch's rules.

The rules are in the package's docstring (`hutch.amqp`).

Why this module is long (about 570 lines): `Broker` is one connection's whole life
(connect, declare, publish with confirms, consume by the rules above, reconnect, close),
and each of those reads the same channels and state. The transport, the consumer's
delivery wrapper and RPC are already modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractQueue,
    AbstractRobustConnection,
)
from aio_pika.exceptions import AMQPError, DeliveryError, PublishError
from opentelemetry import trace
from pamqp.commands import Basic
from pydantic import BaseModel
from yarl import URL

from hutch import telemetry
from hutch.amqp.consumer import Consumer, Delivery, Handler, _Consuming, copy_properties, message_type
from hutch.amqp.transport import _Connection, transport_for
from hutch.compression import pack, unpack
from hutch.models import DecodeError, Model, content_type, decode, encode
from hutch.settings import Settings
from hutch.topology import QueueSpec, Topology

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


INFRA_BACKOFF_FIRST = 0.25  # seconds before the first republish after an infrastructure error
INFRA_BACKOFF_MAX = 5.0  # seconds, at most, however many errors in a row


def infra_backoff(errors_in_a_row: int) -> float:
    """Seconds to wait before returning a message after this many infrastructure errors in a row."""
    doublings = min(max(errors_in_a_row - 1, 0), 16)
    return min(INFRA_BACKOFF_FIRST * float(1 << doublings), INFRA_BACKOFF_MAX)


class PublishFailed(Exception):
    """The broker did not take a message: nacked, returned as unroutable, or timed out."""


class BrokerUnreachable(Exception):
    """No broker answered at the configured URL."""


class Dead(Exception):
    """Raised by a handler: this message is finished for good; dead-letter it with `reason`."""

    def __init__(self, reason: str, detail: str = "", about: Model | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.about = about  # the message the letter is about, when not the one consumed


class Requeue(Exception):
    """Raised by a handler: put the message back on its queue untouched (nothing was spent).

    The layer republishes it with its counts unchanged and acks the delivery. With `backoff`
    (an error of the infrastructure: store, disk, broker) it first waits a short, growing
    delay; without (the governor returning a task it held for a paused domain) at once.
    """

    def __init__(self, why: str = "", *, backoff: bool = True) -> None:
        super().__init__(why)
        self.backoff = backoff


def topology_for(settings: Settings) -> Topology:
    return Topology(
        settings.namespace,
        settings.queue_type,
        settings.retry_delays,
        settings.dlq_max_length,
        shards=settings.frontier_shards,
    )


async def declare_queue(channel: AbstractChannel, spec: QueueSpec) -> AbstractQueue:
    queue = await channel.declare_queue(
        spec.name,
        durable=not spec.exclusive,
        exclusive=spec.exclusive,
        auto_delete=spec.exclusive,
        arguments=spec.arguments,
    )
    for exchange, key in spec.bindings:
        await queue.bind(exchange, key)
    return queue


async def queue_depth(
    channel: AbstractChannel | aiormq.abc.AbstractChannel, queue: str
) -> tuple[int, int] | None:
    """(ready messages, consumers) of `queue` by a passive declare; None if it cannot be seen.

    The one depth reader, on an aio-pika channel or a raw one (`Broker.raw_channel`). The
    declare goes on the channel underneath, so a robust channel does not keep the queue to
    redeclare after a reconnect. A failed passive declare closes the channel: a caller that
    goes on reading opens another (`channel.is_closed`).
    """
    try:
        underlay = await channel.get_underlay_channel() if isinstance(channel, AbstractChannel) else channel
        declared = await underlay.queue_declare(queue, passive=True)
    except Exception as exc:
        log.debug("depth of %s unknown: %s", queue, exc)
        return None
    return declared.message_count or 0, declared.consumer_count or 0


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
        self._stopped = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self, *, declare: bool = True, timeout: float = 10.0) -> Broker:
        try:
            first = URL(self.settings.amqp_urls[0])
            # As aio_pika.connect_robust does, but with a transport factory (which it would put
            # into the URL's query): batched writes, and the cluster's nodes tried in turn.
            connection = _Connection(
                first,
                client_properties={"connection_name": f"hutch-{self.name}"},
                transport_factory=transport_for(first.scheme, self.settings.amqp_nodes),
            )
            await connection.connect(timeout=timeout)
            self.connection = connection
        except (TimeoutError, OSError, AMQPError) as exc:
            raise BrokerUnreachable(
                f"cannot reach RabbitMQ at {self.settings.safe_amqp_url}: {type(exc).__name__}: {exc}".rstrip(": ")
            ) from None
        self._publish_channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
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
            await channel.declare_exchange(exchange.name, exchange.type, durable=True, arguments=exchange.arguments)
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

    async def raw_channel(self) -> aiormq.abc.AbstractChannel:
        """A plain channel for one-off admin work (passive declares, moves, deletes).

        Not robust on purpose: a failed passive declare closes a channel, and a robust one
        would be reopened behind the caller's back; nothing here is to be restored after a
        reconnect either. The caller closes it.
        """
        assert self.connection is not None and self.connection.transport is not None, "connect() first"
        return await self.connection.transport.connection.channel()

    async def stop_consuming(self) -> None:
        self._stopped = True
        for consumer in self._consumers:
            await consumer.cancel()

    @property
    def ready(self) -> bool:
        """Connected (not between a loss and aio-pika's reconnect) and consuming."""
        connection = self.connection
        return (
            connection is not None
            and connection.connected.is_set()
            and bool(self._consumers)
            and not self._stopped
        )

    @property
    def in_flight(self) -> int:
        """Messages whose handling (handler, then settling) has not finished."""
        return self._in_flight

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
        payload, encoding = pack(body if isinstance(body, bytes) else encode(body), self.settings.compress_above)
        kind = "raw" if isinstance(body, bytes) else type(body).__name__
        all_headers: dict[str, Any] = dict(headers or {})
        # Built here, not as aio-pika's Message: that object cost more than the rest of a
        # publish together (measured: bench/governor_permits.py). Same frames on the wire.
        properties = Basic.Properties(
            content_type=content_type(body),
            content_encoding=encoding,
            message_type=message_type(kind),
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
        model = body if isinstance(body, Model) else None
        with telemetry.task_span(
            f"{exchange or '(default)'} publish",
            model.trace() if model else None,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation": "publish",
                "messaging.destination.name": exchange,
                "messaging.rabbitmq.destination.routing_key": routing_key,
                "hutch.message.type": kind,
                **(model.span_attributes() if model else {}),
            },
        ):
            telemetry.inject(all_headers)  # the properties hold this dict: sent with the trace
            await self._send(exchange, routing_key, payload, properties, mandatory)

    def decode(self, body: bytes, content_encoding: str | None, model: type[M]) -> M:
        """A body received outside `consume` (a get, a stream, a reply) as `model`: inflated
        per its `content_encoding` up to the settings' bound; DecodeError if it cannot be."""
        if content_encoding:
            body = unpack(body, content_encoding, self.settings.inflate_limit)
        return decode(body, model)

    async def forward(self, exchange: str, routing_key: str, body: bytes, properties: Basic.Properties) -> None:
        """Publish a received message again as it was (see `copy_properties`), confirmed and
        mandatory; raise PublishFailed if the broker does not take it."""
        await self._send(exchange, routing_key, body, properties, True)

    async def relay(
        self,
        channel: aiormq.abc.AbstractChannel,
        messages: Sequence[aiormq.abc.DeliveredMessage],
        route: Callable[[aiormq.abc.DeliveredMessage], tuple[str, str]],
        expiring: bool = True,
    ) -> None:
        """Publish again messages got from `channel` (`basic_get`), each to `route(message)` =
        (exchange, key), all confirmed, then ack them on `channel`. Not `expiring`: without
        their own expiration (a park's, which in a shard would drop it). PublishFailed leaves
        them all unacked: closing `channel` gives them back to their queue, and those already
        published are in both places (at-least-once, which every consumer tolerates)."""

        async def one(message: aiormq.abc.DeliveredMessage) -> None:
            exchange, key = route(message)
            properties = copy_properties(message.header.properties)
            if not expiring:
                properties.expiration = None
            await self.forward(exchange, key, message.body, properties)

        await asyncio.gather(*(one(m) for m in messages))
        for message in messages:
            await channel.basic_ack(message.delivery_tag or 0)

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

    async def publish_dead(self, letter: Model) -> None:
        """Publish a dead letter (`Model.dead_letter` makes one) to the dead exchange, confirmed."""
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
        dead_letter: bool = True,
        max_crashes: int | None = None,
        declare: bool = True,
        also: dict[type[Model], Handler[Any]] | None = None,
    ) -> Consumer:
        """Consume `queue`, decoding each body as `model` and acking by the handler's outcome.

        The queue is (re)declared on the consumer's channel so that a robust reconnect
        restores it, its bindings and this consumer. `declare=False` consumes a queue already
        declared on `channel` (aio-pika's robust channel keeps every declared queue object and
        redeclares each after a reconnect, so declaring again on every resume would pile them
        up). `dead_letter=False` never publishes to the dead exchange: what would go dead is
        logged by its id and dropped (the ledger, which must not feed itself). `max_crashes`
        overrides the setting for a consumer whose redeliveries are mostly not crashes.
        `also` maps other models the queue carries to their handlers: a message published as
        one of them (its `message_type`, `hutch.<Model>`, which `publish` sets) goes there.
        """
        spec = queue if isinstance(queue, QueueSpec) else self.topology.queue(queue)
        channel = channel or await self.channel(prefetch)
        name = (await declare_queue(channel, spec)).name if declare else spec.name
        how = _Consuming(
            queue=spec.name,
            stage=stage,
            model=model,
            handler=handler,
            dead_letter=dead_letter,
            max_crashes=max_crashes or self.settings.max_crashes,
            max_failures=self.settings.max_failures,
            also={message_type(kind.__name__): (kind, on) for kind, on in (also or {}).items()},
        )

        async def on_message(message: Delivery) -> None:
            self._in_flight += 1
            self._idle.clear()
            try:
                await self._handle(message, how)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

        consumer = await Consumer(channel, name, on_message, arguments).start()
        self._consumers.append(consumer)
        return consumer

    async def listen(
        self,
        channel: AbstractChannel,
        queue: str,
        handler: Callable[[Delivery], Awaitable[None]],
        *,
        arguments: dict[str, Any] | None = None,
        ack: bool = False,
    ) -> Consumer:
        """Consume `queue` as it comes, for replies and event streams.

        For a consumer whose state is all in memory and rebuilt from events (the governor's
        own events queue, an RPC client's replies, the answers to a status request): no
        model, no span, no dead letters; the handler decodes what it wants and drops the
        rest. Without acks, unless `ack` (a RabbitMQ stream takes none other): then the layer
        acks each message once its handler returned. `queue` must have been declared on
        `channel`, so that a reconnect restores it before the consumer subscribes again.
        """
        if not ack:
            return await Consumer(channel, queue, handler, arguments, no_ack=True).start()

        async def settled(message: Delivery) -> None:
            try:
                await handler(message)
            finally:
                await self._settle(message)

        return await Consumer(channel, queue, settled, arguments).start()

    async def _handle(self, message: Delivery, how: _Consuming) -> None:
        """Decode, then handle in a consumer span in the trace of the task the message is about."""
        if message.redelivered:
            with self._consumer_span(message, how, None) as span:
                await self._crashed(message, how, span)
            return
        body = message.body
        model, handler = how.pick(message)
        try:
            if message.content_encoding:
                body = unpack(body, message.content_encoding, self.settings.inflate_limit)
            payload = decode(body, model)
        except DecodeError as exc:
            log.warning("undecodable message on %s: %s", how.queue, exc)
            # Kept inflated in the dead letter when it inflated, as it came otherwise.
            await self._dead_then_ack(message, how, "decode", str(exc), None, raw=body)
            return
        about = payload if isinstance(payload, Model) else None
        if not telemetry.enabled() and not telemetry.json_logs():  # the common case: nothing to add
            await self._process(message, how, handler, payload, trace.INVALID_SPAN)
            return
        with self._consumer_span(message, how, about) as span, telemetry.about(about):
            await self._process(message, how, handler, payload, span)

    def _consumer_span(
        self, message: Delivery, how: _Consuming, model: Model | None
    ) -> contextlib.AbstractContextManager[trace.Span]:
        if not telemetry.enabled():
            return contextlib.nullcontext(trace.INVALID_SPAN)
        return telemetry.task_span(
            f"{how.queue} process",
            model.trace() if model else None,
            telemetry.extract(message.headers),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation": "process",
                "messaging.destination.name": how.queue,
                "messaging.message.id": message.message_id or "",
                "hutch.stage": how.stage,
                **(model.span_attributes() if model else {}),
            },
        )

    async def _process(
        self, message: Delivery, how: _Consuming, handler: Handler[Any], payload: BaseModel, span: trace.Span
    ) -> None:
        try:
            await handler(payload, message)
        except Dead as dead:
            span.set_attribute("hutch.outcome", f"dead:{dead.reason}")
            await self._dead_then_ack(message, how, dead.reason, dead.detail, dead.about or payload)
        except Requeue as requeue:
            await self._requeue(message, how, backoff=requeue.backoff)
        except (PublishFailed, AMQPError, ConnectionError) as exc:
            log.warning("%s: could not pass work on (%s); returned to the queue", how.queue, exc)
            await self._requeue(message, how, backoff=True)
        except asyncio.CancelledError:
            # Cancelled at shutdown: nothing can be awaited any more. The broker redelivers
            # it, and that redelivery counts as one crash.
            await self._settle(message, requeue=True)
            raise
        except Exception as exc:
            span.record_exception(exc)
            await self._failed(message, how, payload, exc)
        else:
            how.infra_errors = 0
            await self._settle(message)

    async def _crashed(self, message: Delivery, how: _Consuming, span: trace.Span) -> None:
        """A redelivery: count the crash in a fresh copy, or give up at `max_crashes`."""
        crashes = message.crashes + 1
        if crashes >= how.max_crashes:
            log.error("%s: message %s crashed a consumer %d times; dead", how.queue, message.message_id, crashes)
            span.set_attribute("hutch.outcome", "dead:crashed")
            try:
                payload: BaseModel | None = self.decode(message.body, message.content_encoding, how.pick(message)[0])
            except DecodeError:
                payload = None  # kept raw in the dead letter
            detail = f"a consumer at stage {how.stage} died holding it {crashes} times"
            await self._dead_then_ack(message, how, "crashed", detail, payload)
            return
        log.warning(
            "%s: message %s redelivered (crash %d of %d)", how.queue, message.message_id, crashes, how.max_crashes
        )
        await self._republish(message, how, crashes, message.failures)

    async def _failed(self, message: Delivery, how: _Consuming, payload: BaseModel, exc: Exception) -> None:
        """The handler raised: count it in a fresh copy, or give up at `max_failures`."""
        failures = message.failures + 1
        if failures >= how.max_failures:
            log.exception("%s: handler failed %d times; dead", how.queue, failures)
            detail = f"{type(exc).__name__}: {exc}"
            await self._dead_then_ack(message, how, "error", detail, payload)
            return
        log.exception("%s: handler failed (%d of %d); republished", how.queue, failures, how.max_failures)
        await self._republish(message, how, message.crashes, failures)

    async def _requeue(self, message: Delivery, how: _Consuming, *, backoff: bool) -> None:
        """Back to its queue with its counts unchanged: nothing was spent."""
        if backoff:
            how.infra_errors += 1
            await asyncio.sleep(infra_backoff(how.infra_errors))
        await self._republish(message, how, message.crashes, message.failures)

    async def _republish(self, message: Delivery, how: _Consuming, crashes: int, failures: int) -> None:
        """Publish a copy with these counts to the same queue (confirmed), then ack the delivery.

        If the channel closed meanwhile, the broker has requeued the message already and a
        copy would be a duplicate. If the copy is not confirmed, nack-requeue: its
        redelivery will count as a crash, which bounds even this path.
        """
        if message.channel_closed:
            return
        try:
            await self._send("", how.queue, message.body, message.properties_with(crashes, failures), True)
        except PublishFailed as exc:
            log.warning("%s: could not republish (%s); requeued by the broker", how.queue, exc)
            await self._settle(message, requeue=True)
            return
        await self._settle(message)

    async def _dead_then_ack(
        self,
        message: Delivery,
        how: _Consuming,
        reason: str,
        detail: str,
        payload: object,
        raw: bytes | None = None,
    ) -> None:
        if not how.dead_letter:
            # This queue's messages must never reach the dead exchange (the ledger would
            # feed itself): the message is dropped, and the log says which one.
            log.error(
                "%s: message %s dropped (%s: %s); this queue does not dead-letter",
                how.queue,
                message.message_id,
                reason,
                detail[:200],
            )
            await self._settle(message)
            return
        if isinstance(payload, Model):
            letters = payload.dead_letters(how.stage, reason, detail, how.queue)
        else:
            body = message.body if raw is None else raw
            letters = [Model.undecodable_letter(how.stage, reason, detail, body, how.queue)]
        try:
            await asyncio.gather(*(self.publish_dead(letter) for letter in letters))
        except PublishFailed as exc:
            log.warning("dead letter not confirmed (%s); message returned to the queue", exc)
            await self._requeue(message, how, backoff=True)
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
