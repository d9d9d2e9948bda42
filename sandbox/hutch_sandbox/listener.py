"""A loopback TCP listener that can be stopped at once, hanging connections included.

``asyncio.Server.close`` stops accepting but leaves open connections alone, and the sandbox
holds connections open on purpose (hangs, trickles, tunnels). Each connection's task and stream
are tracked here so ``stop`` can abort and cancel them all, and a test's teardown never waits
for a client timeout.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from hutch_sandbox.http11 import reset_connection

__all__ = ["Listener"]

logger = logging.getLogger("hutch_sandbox")


class Listener:
    """Subclasses implement ``handle``; the stream is closed when it returns."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.tls: ssl.SSLContext | None = None  # set before start() to serve TLS
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = await asyncio.start_server(self._accept, self.host, self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._connections)
        for task, writer in list(self._connections.items()):
            # A reset, not a FIN: a body delimited by the close must not look complete.
            reset_connection(writer)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._server is None:  # accepted just before stop(); nobody would clean it up
            reset_connection(writer)
            return
        self._connections[task] = writer
        try:
            await self.handle(reader, writer)
        except asyncio.CancelledError:
            # stop() cancels connection tasks. Ending normally instead of re-raising keeps
            # Python 3.11's StreamReaderProtocol callback from logging the cancellation.
            writer.transport.abort()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("sandbox connection handler failed on port %s", self.port)
            writer.transport.abort()
        finally:
            self._connections.pop(task, None)
            if not writer.is_closing():
                writer.close()
