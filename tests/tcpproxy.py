"""A loopback TCP proxy a test can cut: the network between a service and its broker failing.

Stopping a broker tests a broker restart; a network fault is another thing: the broker keeps
every queue, message and unacked delivery, while the clients see their sockets die and cannot
connect for a while. `TcpProxy` forwards a local port to a target (a RabbitMQ node) and, on
`cut()`, aborts every connection through it (a reset, not a polite close) and stops listening,
so new connections are refused; `restore()` listens again on the same port.

    async with TcpProxy(node.port) as proxy:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
        await proxy.cut()        # every connection reset, new ones refused
        await proxy.restore()    # accepting again

It runs on the test's event loop and connects only to 127.0.0.1; it listens on 127.0.0.1, or
on `host`, an address of a bridge the test made (tests/netns.py: namespaces reach loopback
services through it). `connections` counts the connections accepted so far, so a test can see that
clients came back after a cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


class TcpProxy:
    def __init__(
        self, target_port: int, port: int = 0, target_host: str = "127.0.0.1", host: str = "127.0.0.1"
    ) -> None:
        if not target_host.startswith("127."):
            raise ValueError("the test proxy forwards to loopback only")
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.connections = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        self.cuts += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self._pipes.clear()

    async def restore(self) -> None:
        """Accept connections again, on the same port."""
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # cut between the accept and this callback
            _reset(client_writer)
            return
        try:
            server_reader, server_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
        except (OSError, TimeoutError):
            _reset(client_writer)  # the target is down: the client sees a reset
            return
        self.connections += 1
        self._writers.update((client_writer, server_writer))
        pipes = [
            asyncio.create_task(self._pipe(client_reader, server_writer)),
            asyncio.create_task(self._pipe(server_reader, client_writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for writer in (client_writer, server_writer):
                self._writers.discard(writer)
                _reset(writer)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One side closing ends both: an AMQP connection is useless half-open.
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (linger 0), as a dropped connection looks, instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
