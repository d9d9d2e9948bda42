"""One fake website: deterministic pages, configurable misbehaviour, and fixed trouble paths.

Normal pages (``/`` and ``/page/<i>``) go through the configured rules in this order: the
politeness ban, the datacenter block, then the random faults, with the configured latency before
the answer. Every other path answers the same way each time whatever the configuration, so a
test can ask for exactly the trouble it wants:

    /status/<code>         that status (200-599) with a small body
    /hang                  never answers; /reset closes with a TCP RST
    /trickle               headers, then one byte a second, forever
    /big?bytes=N           200 with N bytes, streamed
    /redirect?to=X&code=C  redirect (302 unless C is 301/303/307/308) to X
    /loop/<n>              302 to /loop/<n+1>, endlessly
    /retry-after/<value>   429 with Retry-After: <value>
    /challenge, /block     the 200 anti-bot challenge page; the 403 block page
    /flaky/<key>?fail=K&code=C&retry_after=R
                           the first K (default 1) requests for key answer C (default 500),
                           later ones 200 (page <key>'s HTML when key is a number)
    /robots.txt            the configured text, or allow-all
    /charset/<name>?declare=header|meta|none
                           a page encoded in <name>, declared in Content-Type (default), only
                           in a <meta charset> tag, or nowhere
    /hostile/<name>        one hostile answer of the open web (see hutch_sandbox.hostile)
    /api/products/<i>.json page <i> as a JSON document (see hutch_sandbox.jsonapi)
    /crawl/...             a small site to crawl: pagination, cycles, one page spelled many
                           ways, other domains (see hutch_sandbox.crawlsite)
    /sitemap.xml, /sitemaps/<name>
                           the crawl site's sitemaps (an index, a plain and a gzipped urlset)
                           and hostile ones (see hutch_sandbox.sitemaps)

A site answers whatever the Host header says, so every host name resolved to its port
(`HUTCH_RESOLVE=*.wide.test:PORT:127.0.0.1`) is served, as one site. Each request is counted
under its Host header (`hutch_sandbox.hostcount`) and its access record carries the header,
so per-domain limits can be checked at the site, and the request's headers, so a test sees
what a job sent (its headers and cookies).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote, unquote

from hutch_sandbox import crawlsite
from hutch_sandbox.accesslog import AccessLog, AccessRecord
from hutch_sandbox.config import SandboxConfig, SiteConfig
from hutch_sandbox.hostcount import MAX_HOST_CHARS, HostCounter
from hutch_sandbox.http11 import BadRequest, Request, format_head, read_request, reset_connection
from hutch_sandbox.listener import Listener
from hutch_sandbox.pages import (
    block_page,
    challenge_page,
    charset_page,
    index_page,
    render_page,
)
from hutch_sandbox.rules import (
    FaultKind,
    Politeness,
    decide_block,
    decide_fault,
    is_datacenter,
    latency_seconds,
)

__all__ = ["Reply", "SiteServer"]

TRICKLE_INTERVAL = 1.0
MAX_RECORDED_HEADERS = 64  # of a request, in its access record
MAX_HEADER_CHARS = 1000
MAX_BIG = 1 << 30
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
ROBOTS_ALLOW_ALL = "User-agent: *\nAllow: /\n"
OK_PAGE = "<!DOCTYPE html>\n<html><head><title>ok</title></head><body>ok</body></html>\n"
_PAGE = re.compile(r"/page/(0|[1-9][0-9]*)")
_TOKEN = re.compile(r"[A-Za-z0-9._-]+")


@dataclass
class Reply:
    """A response to send. With ``stream``, ``length`` is the Content-Length to declare
    (None: the body ends when the connection closes)."""

    status: int
    body: bytes = b""
    content_type: str | None = TEXT
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: Callable[[], AsyncIterator[bytes]] | None = None
    length: int | None = None
    close: bool = False


Outcome = Reply | Literal["reset", "hang"]


@dataclass
class Decision:
    outcome: Outcome
    fault: str | None = None
    delay: float = 0.0


def _text(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, f"{message}\n".encode(), headers=headers or [])


def _html(status: int, html: str, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, html.encode("utf-8"), HTML, headers or [])


async def _trickle(data: bytes | None) -> AsyncIterator[bytes]:
    """``data`` one byte at a time, or dots forever when None."""
    if data is None:
        while True:
            yield b"."
            await asyncio.sleep(TRICKLE_INTERVAL)
    for offset in range(len(data)):
        if offset:
            await asyncio.sleep(TRICKLE_INTERVAL)
        yield data[offset : offset + 1]


async def _filler(size: int) -> AsyncIterator[bytes]:
    block = (b"0123456789abcdef" * 4096)[: 64 * 1024]
    while size > 0:
        chunk = block[: min(size, len(block))]
        size -= len(chunk)
        yield chunk


def _headers(request: Request) -> dict[str, str]:
    """The request's headers as its access record keeps them (bounded: see `AccessRecord`)."""
    found: dict[str, str] = {}
    for name, value in request.headers[:MAX_RECORDED_HEADERS]:
        key, value = name.lower(), value[:MAX_HEADER_CHARS]
        found[key] = f"{found[key]}, {value}" if key in found else value
    return found


async def _until_peer_leaves(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


class SiteServer(Listener):
    def __init__(
        self, config: SiteConfig, sandbox: SandboxConfig, log: AccessLog, hosts: HostCounter | None = None
    ) -> None:
        super().__init__(sandbox.host, config.port)
        self.config = config
        self.name = config.name
        self._seed = sandbox.seed
        self._datacenter = list(sandbox.address_tiers.datacenter)
        self._log = log
        self._hosts = hosts if hosts is not None else HostCounter()
        self._counts: dict[str, int] = {}
        self._flaky: dict[str, int] = {}
        self._rendered: dict[int, str] = {}
        self._politeness = (
            Politeness(config.politeness.max_per_second, config.politeness.ban_seconds)
            if config.politeness is not None
            else None
        )

    @property
    def domain(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{'https' if self.config.tls else 'http'}://{self.domain}"

    def page_url(self, i: int) -> str:
        return f"{self.base_url}/page/{i}"

    def host_url(self, host: str, path: str = "/") -> str:
        """The URL of ``path`` on this site under another host name (one resolved to this port)."""
        return f"{'https' if self.config.tls else 'http'}://{host}:{self.port}{path}"

    def urls(self) -> list[str]:
        return [self.page_url(i) for i in range(self.config.pages)]

    def _page(self, i: int) -> str:
        if not self.config.page_kb:
            return render_page(self.name, i)
        body = self._rendered.get(i)  # large pages cost milliseconds to build: built once
        if body is None:
            body = self._rendered[i] = render_page(self.name, i, self.config.page_kb)
        return body

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        client_port = int(peer[1]) if peer else None
        while True:
            try:
                request = await read_request(reader)
            except BadRequest as exc:
                self._record(time.time(), "", "", client, exc.status, None, client_port=client_port)
                await self._send(writer, _text(exc.status, exc.detail), head=False, keep=False)
                return
            if request is None:
                return
            arrival = time.time()
            host = request.header("host")
            self._hosts.add(host)
            decision = self._decide(request, client)
            outcome = decision.outcome
            status = outcome if isinstance(outcome, str) else outcome.status
            self._record(
                arrival,
                request.method,
                request.target,
                client,
                status,
                decision.fault,
                host,
                _headers(request),
                client_port=client_port,
            )
            if decision.delay > 0:
                await asyncio.sleep(decision.delay)
            if outcome == "reset":
                reset_connection(writer)
                return
            if outcome == "hang":
                await _until_peer_leaves(reader)
                return
            head = request.method == "HEAD"
            if not await self._send(writer, outcome, head=head, keep=request.keep_alive):
                return

    def _record(
        self,
        ts: float,
        method: str,
        path: str,
        client: str,
        status: int | str,
        fault: str | None,
        host: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        client_port: int | None = None,
    ) -> None:
        self._log.add(
            AccessRecord(
                ts=ts,
                kind="site",
                site=self.name,
                proxy=None,
                port=self.port,
                method=method,
                path=path,
                client=client,
                status=status,
                fault=fault,
                host=None if host is None else host[:MAX_HOST_CHARS],
                headers=headers,
                client_port=client_port,
            )
        )

    async def _send(self, writer: asyncio.StreamWriter, reply: Reply, head: bool, keep: bool) -> bool:
        """Write ``reply``; whether the connection may carry another request."""
        close = not keep or reply.close or (reply.stream is not None and reply.length is None)
        bodiless = reply.status in (204, 304)
        headers: list[tuple[str, str]] = []
        if reply.content_type and not bodiless:
            headers.append(("Content-Type", reply.content_type))
        length = reply.length if reply.stream is not None else len(reply.body)
        if length is not None and not bodiless:
            headers.append(("Content-Length", str(length)))
        headers.extend(reply.headers)
        headers.append(("Connection", "close" if close else "keep-alive"))
        writer.write(format_head(reply.status, headers))
        if not head and not bodiless:
            if reply.stream is not None:
                async for chunk in reply.stream():
                    if writer.is_closing():
                        return False
                    writer.write(chunk)
                    await writer.drain()
            else:
                writer.write(reply.body)
        await writer.drain()
        return not close

    # -- deciding -----------------------------------------------------------------------------

    def _decide(self, request: Request, client: str) -> Decision:
        special = self._special(request)
        if special is not None:
            return Decision(special)
        path = request.path
        if path == "/":
            body = index_page(self.name, self.config.pages)
        else:
            match = _PAGE.fullmatch(path)
            if match is None or int(match[1]) >= self.config.pages:
                return Decision(_text(404, "not found"))
            body = self._page(int(match[1]))
        return self._normal(request.target, client, body)

    def _normal(self, target: str, client: str, body: str) -> Decision:
        count = self._counts.get(target, 0)
        self._counts[target] = count + 1
        if self._politeness is not None:
            remaining = self._politeness.check(client)
            if remaining is not None:
                retry = [("Retry-After", str(max(1, math.ceil(remaining))))]
                return Decision(_html(403, block_page(), retry), "ban")
        delay = latency_seconds(self._seed, self.name, target, count, self.config.latency_ms)
        block = self.config.block
        if (
            block is not None
            and is_datacenter(client, self._datacenter)
            and decide_block(self._seed, self.name, target, count, block.datacenter_probability)
        ):
            if block.style == "challenge_200":
                return Decision(_html(200, challenge_page()), "block", delay)
            return Decision(_html(403, block_page()), "block", delay)
        kind = decide_fault(self.config.faults, self._seed, self.name, target, count)
        if kind is None:
            return Decision(_html(200, body), None, delay)
        return Decision(self._fault(kind, body.encode("utf-8")), kind, delay)

    def _fault(self, kind: FaultKind, body: bytes) -> Outcome:
        if kind == "reset" or kind == "hang":
            return kind
        if kind == "trickle":
            return Reply(200, content_type=HTML, stream=lambda: _trickle(body), length=len(body), close=True)
        retry_after = self.config.faults.retry_after
        retry = [("Retry-After", retry_after)] if retry_after is not None else []
        if kind == "error_500":
            return _text(500, "internal server error (injected)")
        if kind == "error_503":
            return _text(503, "service unavailable (injected)", retry)
        return _text(429, "too many requests (injected)", retry)

    def _special(self, request: Request) -> Outcome | None:
        """The fixed answer for a trouble path, or None for a normal (or unknown) path."""
        head, _, rest = request.path[1:].partition("/")
        if head == "crawl":  # the crawl graph (hutch_sandbox.crawlsite)
            html = crawlsite.page(request.path, request.query, request.header("host") or "", self.port)
            return _html(200, html) if html is not None else _text(404, "no such page")
        if head in ("sitemap.xml", "sitemaps"):  # the crawl site's sitemaps, and hostile ones
            from hutch_sandbox import sitemaps  # like hostile: it uses this module's types

            return sitemaps.answer(request.path, request.query, request.header("host") or "", self.port)
        try:
            fixed = self._fixed(request.path, request.query)
            return fixed if fixed is not None else self._under(head, rest, request.query)
        except ValueError as exc:
            return _text(400, f"bad parameter: {exc}")

    def _fixed(self, path: str, query: dict[str, str]) -> Outcome | None:
        """The answers of the paths that take no segment after their name."""
        if path in ("/hang", "/reset"):
            return "hang" if path == "/hang" else "reset"
        if path == "/trickle":
            return Reply(200, stream=lambda: _trickle(None))
        if path == "/big":
            size = int(query.get("bytes", str(1 << 20)))
            if not 0 <= size <= MAX_BIG:
                return _text(400, f"bytes must be between 0 and {MAX_BIG}")
            return Reply(200, content_type="application/octet-stream", stream=lambda: _filler(size), length=size)
        if path == "/redirect":
            return self._redirect(query)
        if path == "/challenge":
            return _html(200, challenge_page())
        if path == "/block":
            return _html(403, block_page())
        if path == "/robots.txt":
            return _text(200, (self.config.robots_txt or ROBOTS_ALLOW_ALL).rstrip("\n"))
        return None

    def _under(self, head: str, rest: str, query: dict[str, str]) -> Outcome | None:
        """The answers of the paths `/<head>/<rest>`."""
        if head == "status" and rest.isdigit():
            code = int(rest)
            if not 200 <= code <= 599:
                return _text(400, "status must be between 200 and 599")
            return _text(code, f"status {code}")
        if head == "loop" and rest.isdigit():
            return _text(302, "loop", [("Location", f"/loop/{int(rest) + 1}")])
        if head == "retry-after" and rest:
            value = unquote(rest)
            if not value.isprintable() or not value.isascii():
                return _text(400, "bad Retry-After value")
            return _text(429, "retry later", [("Retry-After", value)])
        if head == "flaky" and rest and "/" not in rest:
            return self._flaky_reply(unquote(rest), query)
        if head == "charset" and rest:
            return self._charset(unquote(rest), query.get("declare", "header"))
        if head == "hostile" and rest:
            from hutch_sandbox import hostile  # the hostile routes use this module's types

            return hostile.answer(rest, query)
        if head == "api" and rest:
            from hutch_sandbox import jsonapi  # like hostile: it uses this module's types

            return jsonapi.answer(self.name, self.config.pages, rest)
        return None

    def _redirect(self, query: dict[str, str]) -> Reply:
        to = query.get("to")
        if not to:
            return _text(400, "missing ?to=")
        code = int(query.get("code", "302"))
        if code not in (301, 302, 303, 307, 308):
            return _text(400, "code must be 301, 302, 303, 307 or 308")
        location = quote(to, safe=":/?#[]@!$&'()*+,;=%~")
        return _text(code, f"redirect to {location}", [("Location", location)])

    def _flaky_reply(self, key: str, query: dict[str, str]) -> Reply:
        fail = int(query.get("fail", "1"))
        code = int(query.get("code", "500"))
        if not 200 <= code <= 599:
            return _text(400, "code must be between 200 and 599")
        seen = self._flaky.get(key, 0)
        self._flaky[key] = seen + 1
        if seen < fail:
            retry_after = query.get("retry_after")
            retry = [("Retry-After", retry_after)] if retry_after else []
            return _text(code, f"flaky {key}: failure {seen + 1} of {fail}", retry)
        if key.isdigit():
            return _html(200, render_page(self.name, int(key)))
        return _html(200, OK_PAGE)

    def _charset(self, name: str, declare: str) -> Reply:
        if _TOKEN.fullmatch(name) is None:
            return _text(400, "bad charset name")
        if declare not in ("header", "meta", "none"):
            return _text(400, "declare must be header, meta or none")
        try:
            body = charset_page(name, declare_meta=declare == "meta")
        except LookupError:
            return _text(404, f"unknown charset {name}")
        content_type = f"text/html; charset={name}" if declare == "header" else "text/html"
        return Reply(200, body, content_type)
