"""The AMQP layer's request/response: an RPC client with its own reply queue, and a server.

Both go through the layer's publish (confirms) and consume (settling, dead letters).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from hutch.amqp.broker import Broker, declare_queue
from hutch.amqp.consumer import Consumer, Delivery
from hutch.models import Model
from hutch.topology import QueueSpec

M = TypeVar("M", bound=BaseModel)


class RpcClient:
    """Request/response over AMQP with JSON bodies, many calls in flight at once.

    Replies come to an exclusive queue this client names itself (so a robust reconnect can
    redeclare it under the same name) and are matched by correlation id.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pending: dict[str, asyncio.Future[Delivery]] = {}
        self._reply_queue = f"{broker.topology.prefix}rpc.reply.{broker.name}.{uuid.uuid4().hex[:12]}"

    async def start(self) -> RpcClient:
        channel = await self.broker.channel()
        await declare_queue(channel, QueueSpec(self._reply_queue, exclusive=True))
        await self.broker.listen(channel, self._reply_queue, self._on_reply)
        return self

    async def _on_reply(self, message: Delivery) -> None:
        future = self._pending.pop(message.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message)

    async def call(self, queue: str, request: Model, response: type[M], timeout: float) -> M:
        """Send `request` to `queue` and wait up to `timeout` for the answer."""
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
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
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(correlation_id, None)
        return self.broker.decode(reply.body, reply.content_encoding, response)


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
