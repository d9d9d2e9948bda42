"""The AMQP layer's transport: one `send` per loop iteration for every frame of a connection,
and a cluster's nodes tried in turn.

aiormq writes each frame as it is made; a busy publisher made thousands of small writes a
second. The batched writer gathers what one iteration of the event loop wrote and sends it
at the end of that iteration; the connection class is aio-pika's robust one with that
transport underneath.

With several nodes (`HUTCH_AMQP_URL` comma separated), `_Failover` opens the TCP (or TLS)
connection to the node that answered last, and to the next ones in turn when it does not:
aio-pika's robust connection reconnects through it after a node is lost, so a service moves
to a node that is up with nothing of its own to do, and restores its channels and consumers
there as after any reconnect. Each node gets `NODE_TIMEOUT` seconds to accept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import aio_pika
from aio_pika.abc import ConnectionParameter
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from aiormq.exceptions import AMQPConnectionError

log = logging.getLogger(__name__)
NODE_TIMEOUT = 5.0  # seconds one node has to accept a connection before the next is tried


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


class _Failover(TransportFactory):
    """Connect to the first of `nodes` that accepts, starting from the one that did last."""

    def __init__(self, inner: TransportFactory, nodes: list[tuple[str, int]]) -> None:
        self.inner = inner
        self.nodes = nodes
        self.current = 0

    async def create(self, url: Any, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure: BaseException | None = None
        for step in range(len(self.nodes)):
            index = (self.current + step) % len(self.nodes)
            host, port = self.nodes[index]
            try:
                # A copy each time: the TLS factory pops its context provider from kwargs.
                opened = await asyncio.wait_for(
                    self.inner.create(url.with_host(host).with_port(port), **dict(kwargs)), NODE_TIMEOUT
                )
            except (AMQPConnectionError, OSError, TimeoutError) as exc:
                failure = exc
                continue
            if index != self.current:
                log.warning("broker node %s:%d answered in place of %s:%d", host, port, *self.nodes[self.current])
            self.current = index
            return opened
        hosts = ", ".join(f"{h}:{p}" for h, p in self.nodes)
        raise AMQPConnectionError(f"no broker node answered ({hosts}): {failure}")


def transport_for(scheme: str, nodes: list[tuple[str, int]]) -> TransportFactory | None:
    """The transport factory for a connection: batched writes on plain AMQP (aiormq's own TLS
    for amqps), behind `_Failover` when there are several nodes."""
    inner: TransportFactory | None = _BatchingTCP() if scheme == "amqp" else None
    if len(nodes) < 2:
        return inner
    return _Failover(inner or TLSTransportFactory(), nodes)


class _Connection(aio_pika.RobustConnection):
    """aio-pika's robust connection, letting a transport factory through to aiormq."""

    PARAMETERS = (
        *aio_pika.RobustConnection.PARAMETERS,
        ConnectionParameter(name="transport_factory", parser=lambda value: value, is_kwarg=True),
    )
