"""A forward HTTP proxy whose upstream connections leave from its own loopback address.

Each proxy binds its upstream side to a distinct 127/8 source address, so a site sees the
proxy's address as the client, exactly as a real site sees a proxy's exit IP; the datacenter
block and the politeness ban then apply per proxy. It forwards absolute-form requests
(``GET http://127.0.0.1:PORT/page/1``) and CONNECT tunnels, to loopback targets only (anything
else gets 403, with no connection attempted).

Forwarded requests are sent upstream with ``Connection: close`` and the response is relayed
byte for byte until the site closes, so the client connection closes after each response. An
upstream reset is passed on as a reset, making site faults look the same with or without a
proxy. Configured failures: ``fail`` (the proxy answers 502 itself) and ``down`` (it resets
every connection as soon as it is accepted). An answer of the proxy's own says so in a
``Proxy-Status`` header (RFC 9209) naming the proxy by the ``host:port`` of its URL, which is how
a client tells it from a site's answer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from hutch_sandbox.accesslog import AccessLog, AccessRecord
from hutch_sandbox.config import LOOPBACK, ProxyConfig, SandboxConfig
from hutch_sandbox.http11 import BadRequest, Request, format_head, read_request, reset_connection
from hutch_sandbox.listener import Listener
from hutch_sandbox.rules import draw

__all__ = ["ProxyServer"]

CONNECT_TIMEOUT = 5.0
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
}


@dataclass
class _Exchange:
    """What is known about one proxied request, for its access record."""

    arrival: float
    client: str
    method: str = ""
    path: str = ""
    site: str | None = None
    status: int | str = "closed"
    fault: str | None = None
    recorded: bool = False


class _Refused(Exception):
    def __init__(self, status: int, detail: str, error: str = "http_request_error") -> None:
        super().__init__(detail)
        self.error = error
        self.status = status
        self.detail = detail


def _loopback_target(host: str, port: int | None) -> tuple[str, int]:
    if host.lower() == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise _Refused(403, f"target {host} is not a loopback address") from None
    if address not in LOOPBACK:
        raise _Refused(403, f"target {host} is not a loopback address")
    if port is None or not 0 < port < 65536:
        raise _Refused(400, "target port missing or invalid")
    return str(address), port


def _split_authority(authority: str) -> tuple[str, int | None]:
    host, colon, port = authority.rpartition(":")
    if not colon or not port.isdigit():
        return authority, None
    return host, int(port)


class ProxyServer(Listener):
    def __init__(
        self,
        config: ProxyConfig,
        sandbox: SandboxConfig,
        log: AccessLog,
        site_for: Callable[[str, int], str | None] = lambda host, port: None,
    ) -> None:
        super().__init__(sandbox.host, config.port)
        self.config = config
        self.name = config.name
        self.tier = config.tier
        self.source = config.source
        self._seed = sandbox.seed
        self._log = log
        self._site_for = site_for
        self._count = 0

    @property
    def url(self) -> str:
        """The proxy URL a client uses, with credentials when the proxy requires them."""
        credentials = f"{self.config.auth}@" if self.config.auth else ""
        return f"http://{credentials}{self.host}:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        exchange = _Exchange(arrival=time.time(), client=str(peer[0]) if peer else "?")
        try:
            await self._exchange(reader, writer, exchange)
        finally:
            self._record(exchange)

    def _record(self, exchange: _Exchange) -> None:
        """Log the exchange once, as soon as its outcome is known (before the client hears it)."""
        if exchange.recorded:
            return
        exchange.recorded = True
        self._log.add(
            AccessRecord(
                ts=exchange.arrival,
                kind="proxy",
                site=exchange.site,
                proxy=self.name,
                port=self.port,
                method=exchange.method,
                path=exchange.path,
                client=exchange.client,
                status=exchange.status,
                fault=exchange.fault,
                upstream_source=self.source,
            )
        )

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: _Exchange) -> None:
        if self.config.down:
            exchange.status, exchange.fault = "reset", "down"
            self._record(exchange)
            reset_connection(writer)
            return
        try:
            request = await read_request(reader)
        except BadRequest as exc:
            await self._answer(writer, exchange, exc.status, exc.detail, error="http_request_error")
            return
        if request is None:
            return
        exchange.arrival = time.time()
        exchange.method, exchange.path = request.method, request.target
        count, self._count = self._count, self._count + 1
        if not self._authorized(request):
            header = [("Proxy-Authenticate", 'Basic realm="hutch-sandbox"')]
            await self._answer(writer, exchange, 407, "proxy authentication required", header)
            return
        if self.config.fail > 0 and draw(self._seed, "proxy", self.name, count) < self.config.fail:
            exchange.fault = "fail"
            await self._answer(writer, exchange, 502, "bad gateway (injected)", error="proxy_internal_error")
            return
        try:
            if request.method == "CONNECT":
                await self._tunnel(request, reader, writer, exchange)
            else:
                await self._forward(request, reader, writer, exchange)
        except _Refused as exc:
            await self._answer(writer, exchange, exc.status, exc.detail, error=exc.error)

    def _authorized(self, request: Request) -> bool:
        if self.config.auth is None:
            return True
        scheme, _, encoded = (request.header("proxy-authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return given == self.config.auth

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        exchange: _Exchange,
        status: int,
        message: str,
        headers: list[tuple[str, str]] | None = None,
        error: str = "http_request_denied",
    ) -> None:
        """Answer as the proxy itself, saying so in a `Proxy-Status` header (RFC 9209)."""
        exchange.status = status
        self._record(exchange)
        body = f"{message}\n".encode()
        head = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            *(headers or []),
            ("Proxy-Status", f"{self.host}:{self.port}; error={error}"),
            ("Connection", "close"),
        ]
        writer.write(format_head(status, head) + body)
        await writer.drain()

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, local_addr=(self.source, 0)),
                CONNECT_TIMEOUT,
            )
        except OSError as exc:  # TimeoutError included
            raise _Refused(502, f"cannot reach {host}:{port}: {exc}", "destination_unavailable") from exc

    async def _tunnel(
        self,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: _Exchange,
    ) -> None:
        host, port = _loopback_target(*_split_authority(request.target))
        exchange.site = self._site_for(host, port)
        up_reader, up_writer = await self._connect(host, port)
        exchange.status = 200
        self._record(exchange)
        # No await between connecting and _relay, which owns closing the upstream connection.
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await _relay(reader, writer, up_reader, up_writer, None)

    async def _forward(
        self,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        exchange: _Exchange,
    ) -> None:
        url = urlsplit(request.target)
        if url.scheme != "http" or not url.hostname:
            raise _Refused(400, "expected an absolute http:// URL or CONNECT")
        try:
            port = url.port or 80
        except ValueError:
            raise _Refused(400, "bad port in URL") from None
        host, port = _loopback_target(url.hostname, port)
        exchange.site = self._site_for(host, port)
        up_reader, up_writer = await self._connect(host, port)
        target = url.path or "/"
        if url.query:
            target += f"?{url.query}"
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_BY_HOP]
        if request.header("host") is None:
            headers.append(("Host", url.netloc.rpartition("@")[2]))
        headers.append(("Connection", "close"))
        lines = [f"{request.method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
        up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body)

        def status_line(first: bytes) -> None:
            parts = first.split(b" ", 2)
            if len(parts) >= 2 and parts[1].isdigit():
                exchange.status = int(parts[1])
            self._record(exchange)

        if await _relay(reader, writer, up_reader, up_writer, status_line) == "upstream reset":
            exchange.status = "reset"


async def _pump(
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    on_first: Callable[[bytes], None] | None,
) -> str:
    """Copy until EOF; how it ended: "eof", "read error" or "write error"."""
    while True:
        try:
            data = await source.read(65536)
        except OSError:
            return "read error"
        if not data:
            return "eof"
        if on_first is not None:
            on_first(data)
            on_first = None
        try:
            sink.write(data)
            await sink.drain()
        except OSError:
            return "write error"


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    on_first: Callable[[bytes], None] | None,
) -> str:
    """Copy both ways until either side finishes, then close both; "upstream reset" if the
    upstream reset the connection (passed on to the client as a reset), else "done"."""
    down = asyncio.create_task(_pump(up_reader, writer, on_first))
    up = asyncio.create_task(_pump(reader, up_writer, None))
    try:
        done, _ = await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Abort before awaiting anything: a cancellation (sandbox stop) may land on the await.
        up_writer.transport.abort()
        for task in (down, up):
            task.cancel()
        await asyncio.gather(down, up, return_exceptions=True)
    if down in done and down.result() == "read error":
        reset_connection(writer)
        return "upstream reset"
    return "done"
