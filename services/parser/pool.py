"""Worker processes for extraction: a time limit per page that can really be enforced.

A spec is outside input, and some XPath is quadratic (`//*[.=//*]` on a page of 100,000
elements runs for minutes inside libxml2). A thread stuck in C cannot be stopped, so extraction
runs in worker processes: a worker past its page's deadline is killed (SIGKILL) and replaced,
and the page fails with `parse_timeout` while the other workers go on serving.

`concurrent.futures.ProcessPoolExecutor` cannot do this: it has no way to kill one stuck
worker, and a worker that dies marks the whole executor broken. So this is a small pool of
its own: one `multiprocessing.Process` per slot, talking over a pipe.

- Workers start from a forkserver, never by forking the service itself: the parser runs an
  event loop and aio-pika's threads, and a fork of a threaded process can inherit a lock held
  by a thread that does not exist in the child. The forkserver is a fresh interpreter that has
  imported parsel and lxml once, so a replacement worker costs a fork, not an import.
- Pages and answers cross a socket pair as JSON (never pickle, like every message in Hutch),
  each framed by its length (8 bytes, big-endian). A request is a line of JSON (everything but
  the page's text), then the text as UTF-8: a ~100 KB page escaped into JSON and read back cost
  the parser 0.47 ms, as bytes 0.12 (`request_bytes`). The answer is the item's JSON itself,
  so the per-item byte cap is measured on exactly what is stored, and an answer longer than
  the cap allows is refused before it is read.
- A worker caps its own address space (`RLIMIT_AS`) at what it had at start plus
  `memory_bytes`: a page that would take more raises MemoryError in the worker (or, inside
  libxml2, a parser error logged as `ERR_NO_MEMORY`), which answers `parse_memory` and is
  replaced; a worker that dies any other way gives `parse_crash`.
- The parent's end of each socket is non-blocking, on the service's event loop: a call
  sends and waits for the answer without a thread (a thread per wait cost the parser a
  hand-off and the GIL's switches on every page; docs/benchmarks.md, eleventh round). Each
  call runs as a task of its own that gives its slot back only when the worker is really
  free: a caller cancelled while its page is in a worker leaves the call to finish, and a
  call itself cancelled kills the worker, so no answer is ever read by the wrong page.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import resource
import signal
import socket
import struct
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from hutch.models import Spec
from hutch.services.parser.links import CrawlBounds

log = logging.getLogger(__name__)

# Why a page failed to parse: the dead letter's reason (stage `parse`).
Failure = Literal[
    "parse_error",
    "parse_timeout",
    "parse_memory",
    "parse_crash",
    "item_too_large",
    "not_json",
    "item_invalid",
    "sitemap_invalid",
    "sitemap_too_large",
]
# Failures after which the worker is not trusted again: killed (if alive) and replaced.
REPLACE: frozenset[Failure] = frozenset({"parse_timeout", "parse_memory", "parse_crash"})
_ANSWER_SLACK = 4096  # room for the envelope around an item of max_item_bytes


class ParseFailed(Exception):
    """A page that cannot become an item: `reason` says which limit or error."""

    def __init__(self, reason: Failure, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: Failure = reason
        self.detail = detail


@dataclass(frozen=True)
class Limits:
    timeout: float  # seconds one page may take in a worker
    max_item_bytes: int  # bytes of the item's JSON
    memory_bytes: int  # address space a worker may add to what it had at start; 0 = no cap


# -- the worker process ------------------------------------------------------------------------


def _cap_memory(extra: int) -> None:
    if extra <= 0:
        return
    with open("/proc/self/statm", encoding="ascii") as statm:
        size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))


def answer(request: bytes, max_item_bytes: int) -> bytes:
    """A worker's answer (JSON bytes) to one request (JSON bytes): the item or a failure."""
    from hutch.services.parser.extract import ItemTooLarge, NotJSON, extract, extract_crawled
    from hutch.services.parser.links import CrawlBounds
    from hutch.services.parser.schema import ItemInvalid
    from hutch.services.parser.sitemaps import SitemapInvalid, SitemapTooLarge

    try:
        head, _, text = request.partition(b"\n")
        page = json.loads(head)
        page["text"] = text.decode("utf-8")
        spec = Spec.model_validate(page["spec"]) if page["spec"] is not None else None
        links: bytes = b""
        if spec is not None and spec.follow and page.get("crawl") is not None:
            bounds = CrawlBounds(**page["crawl"])
            gzip_body = base64.b64decode(page["gzip_body"], validate=True) if page.get("gzip_body") else None
            fields, found = extract_crawled(
                page["text"], page["url"], page["status"], spec, max_item_bytes, bounds,
                gzip_body, page.get("content_type"), utf8=text,
            )  # fmt: skip
            links = b', "links": ' + _links_json(found.links, max_item_bytes)
        else:
            fields = extract(page["text"], page["url"], page["status"], spec, max_item_bytes, utf8=text)
        item = json.dumps(fields, ensure_ascii=False).encode("utf-8")
        if len(item) > max_item_bytes:
            raise ItemTooLarge(f"item passes {max_item_bytes} bytes of JSON")
        return b'{"fields": ' + item + links + b"}"
    except ItemTooLarge as exc:
        return _failure("item_too_large", str(exc))
    except NotJSON as exc:
        return _failure("not_json", str(exc))
    except ItemInvalid as exc:
        return _failure("item_invalid", str(exc))
    except SitemapInvalid as exc:
        return _failure("sitemap_invalid", str(exc))
    except SitemapTooLarge as exc:
        return _failure("sitemap_too_large", str(exc))
    except MemoryError:
        return _failure("parse_memory", "the worker's memory cap was reached")
    except Exception as exc:
        if _libxml2_out_of_memory(exc):
            return _failure("parse_memory", "the worker's memory cap was reached inside libxml2")
        return _failure("parse_error", f"{type(exc).__name__}: {exc}")


def request_bytes(head: dict[str, Any], text: str) -> bytes:
    """One page as a worker reads it (`answer`): `head` (everything but the text) as a line of
    JSON, then the text as UTF-8 (JSON never holds a raw newline, so the first one ends the
    line)."""
    return json.dumps(head, ensure_ascii=False).encode("utf-8") + b"\n" + text.encode("utf-8")


def _links_json(links: list[str], max_bytes: int) -> bytes:
    """The links as a JSON list of at most `max_bytes`: those past it are left out."""
    size, kept = 2, []
    for link in links:
        size += len(link.encode("utf-8")) + 4  # quotes, comma, space
        if size > max_bytes:
            break
        kept.append(link)
    return json.dumps(kept, ensure_ascii=False).encode("utf-8")


def _libxml2_out_of_memory(exc: Exception) -> bool:
    """libxml2 reports a failed allocation as a parser error, `ERR_NO_MEMORY` in its log."""
    from lxml import etree

    log = getattr(exc, "error_log", None)
    if not isinstance(log, etree._ListErrorLog):
        return False
    return len(log.filter_types([etree.ErrorTypes.ERR_NO_MEMORY])) > 0


def _failure(reason: Failure, detail: str) -> bytes:
    return json.dumps({"failure": reason, "detail": detail[:500]}).encode("utf-8")


_LENGTH = struct.Struct("!Q")  # the length before each request and answer


def frame(data: bytes) -> bytes:
    """`data` as it crosses the socket: its length, then itself."""
    return _LENGTH.pack(len(data)) + data


def _read_exactly(sock: socket.socket, size: int) -> bytearray:
    """`size` bytes from a blocking socket; EOFError if it closes first."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if count == 0:
            raise EOFError("the socket closed")
        got += count
    return data


def _serve(sock: socket.socket, max_item_bytes: int, memory_bytes: int) -> None:
    """A worker's life: answer requests until the socket closes; exit after a MemoryError."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _cap_memory(memory_bytes)
    while True:
        try:
            (size,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
            request = bytes(_read_exactly(sock, size))
        except (EOFError, OSError):
            return
        reply = answer(request, max_item_bytes)
        del request
        try:
            sock.sendall(frame(reply))
        except OSError:
            return
        if reply.startswith(b'{"failure": "parse_memory"'):
            return


# -- the parent's side -------------------------------------------------------------------------


def _context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hutch.services.parser.extract"])
    return context


class _AnswerTooLong(Exception):
    """A worker announced an answer longer than any item it may send."""


class _Slot:
    """One worker process and the parent's end of its socket; replaced in place when it fails.

    Starting and stopping a worker block (the forkserver, `join`): they run in the loop's
    default executor, and only while the slot is out of the idle queue."""

    def __init__(self, context: multiprocessing.context.ForkServerContext, limits: Limits) -> None:
        self.context = context
        self.limits = limits
        self.process: BaseProcess | None = None
        self.sock: socket.socket | None = None
        self.started = 0
        self.spoiled = False  # its worker may still answer a page it no longer waits for

    def start(self) -> None:
        parent, child = socket.socketpair()
        process = self.context.Process(
            target=_serve,
            args=(child, self.limits.max_item_bytes, self.limits.memory_bytes),
            name="hutch-parse-worker",
            daemon=True,
        )
        try:
            process.start()
        finally:
            child.close()
        parent.setblocking(False)
        self.process, self.sock = process, parent
        self.started += 1
        self.spoiled = False

    def stop(self, kill: bool) -> None:
        if self.sock is not None:
            self.sock.close()  # an idle worker reads EOF and exits
        if self.process is not None:
            if kill:
                self.process.kill()
            self.process.join(2.0)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(2.0)
        self.process = self.sock = None

    def replace(self) -> None:
        self.stop(kill=True)
        self.start()

    async def call(self, request: bytes) -> dict[str, Any]:
        """Send one page, wait up to the time limit for the worker's answer."""
        loop = asyncio.get_running_loop()
        if self.spoiled or self.process is None or not self.process.is_alive():
            # Died while idle, or left with a page not waited for: not this page's fault.
            await loop.run_in_executor(None, self.replace)
        assert self.sock is not None and self.process is not None
        # The item and, for a crawl's page, its links: each at most max_item_bytes.
        longest = 2 * self.limits.max_item_bytes + _ANSWER_SLACK
        found: dict[str, Any]
        try:
            async with asyncio.timeout(self.limits.timeout):
                await loop.sock_sendall(self.sock, frame(request))
                found = json.loads(await _receive(loop, self.sock, longest))
        except TimeoutError:
            found = {"failure": "parse_timeout", "detail": f"extraction passed {self.limits.timeout:g}s"}
        except _AnswerTooLong as exc:
            found = {"failure": "parse_crash", "detail": str(exc)}
        except (EOFError, OSError):
            code = await loop.run_in_executor(None, self._exit_code)
            found = {"failure": "parse_crash", "detail": f"worker died (exit code {code})"}
        if found.get("failure") in REPLACE:  # every failure above is one of them
            await loop.run_in_executor(None, self.replace)
        return found

    def _exit_code(self) -> int | None:
        assert self.process is not None
        self.process.join(1.0)
        return self.process.exitcode


async def _receive(loop: asyncio.AbstractEventLoop, sock: socket.socket, longest: int) -> bytes:
    """One framed answer from a non-blocking socket: most come whole in one read."""
    data = bytearray()
    size: int | None = None
    while size is None or len(data) < _LENGTH.size + size:
        want = 65536 if size is None else _LENGTH.size + size - len(data)
        chunk = await loop.sock_recv(sock, want)
        if not chunk:
            raise EOFError("the worker's socket closed")
        data += chunk
        if size is None and len(data) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(data)
            if size > longest:
                raise _AnswerTooLong(f"the worker announced an answer of {size:,} bytes, over {longest:,}")
    return bytes(data[_LENGTH.size :])


class ParsePool:
    """`workers` extraction processes; `extract` awaits an idle one and gives it one page."""

    def __init__(self, workers: int, limits: Limits) -> None:
        self.limits = limits
        self._context = _context()
        self._slots = [_Slot(self._context, limits) for _ in range(max(1, workers))]
        self._idle: asyncio.Queue[_Slot] = asyncio.Queue()
        self._calls: set[asyncio.Task[dict[str, Any]]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for slot in self._slots:
            await loop.run_in_executor(None, slot.start)
            self._idle.put_nowait(slot)

    @property
    def replaced(self) -> int:
        """Workers started beyond the first of each slot: how many were killed or died."""
        return sum(slot.started - 1 for slot in self._slots if slot.started)

    async def extract(
        self, text: str, url: str, status: int, spec: Spec | None, crawl: CrawlBounds | None = None
    ) -> dict[str, Any]:
        """The item's fields, or `ParseFailed` with the reason; see `extract_page`."""
        return (await self.extract_page(text, url, status, spec, crawl))[0]

    async def extract_page(
        self,
        text: str,
        url: str,
        status: int,
        spec: Spec | None,
        crawl: CrawlBounds | None = None,
        gzip_body: str | None = None,
        content_type: str | None = None,
    ) -> tuple[dict[str, Any], list[str] | None]:
        """The item's fields and, for a crawl's page (`crawl` given, the spec with `follow:`),
        the links to offer; or `ParseFailed` with the reason. A crawl's gzip file comes as
        `gzip_body` (base64, `Page.gzip_body`) with the response's `content_type`."""
        head = {
            "url": url,
            "status": status,
            "spec": spec.model_dump() if spec else None,
            "crawl": dataclasses.asdict(crawl) if crawl is not None else None,
            "gzip_body": gzip_body,
            "content_type": content_type,
        }
        request = request_bytes(head, text)
        slot = await self._idle.get()
        call = asyncio.get_running_loop().create_task(self._call(slot, request))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        # A caller cancelled here leaves the call to finish: its slot comes back only then.
        found = await asyncio.shield(call)
        if "failure" in found:
            raise ParseFailed(found["failure"], str(found.get("detail", "")))
        fields: dict[str, Any] = found["fields"]
        links: list[str] | None = found.get("links")
        return fields, links

    async def _call(self, slot: _Slot, request: bytes) -> dict[str, Any]:
        try:
            return await slot.call(request)
        except BaseException:
            # Cancelled (the loop stopping) or failed between send and answer: the worker may
            # still answer this page, so it never serves another.
            slot.spoiled = True
            if slot.process is not None:
                slot.process.kill()
            raise
        finally:
            self._idle.put_nowait(slot)

    async def close(self) -> None:
        """Let the pages in the workers finish (each within its time limit), then stop them."""
        await asyncio.gather(*self._calls, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for slot in self._slots:
            with contextlib.suppress(Exception):
                await loop.run_in_executor(None, slot.stop, False)
