"""Hostile answers: bodies, encodings, headers, and answers that only look like a proxy's.

    /hostile/gzip-bomb?gib=N       N GiB of zeros (default 2), gzipped: about 1 MiB on the wire per GiB
    /hostile/stacked-bomb?gib=N    the same inside a second gzip (Content-Encoding: gzip, gzip)
    /hostile/deflate-bomb?gib=N    the same as zlib-wrapped deflate
    /hostile/bogus-charset         Content-Type charset=does-not-exist, a <meta> charset just as
                                   bogus, and bytes that are not UTF-8
    /hostile/huge-header?kib=N     a response header of N KiB (default 1024)
    /hostile/origin-407            a 407 with Proxy-Authenticate, from the site itself
    /hostile/origin-proxy-status   a 502 with a Proxy-Status of the site's own edge

The bombs are compressed while they are sent, one MiB of zeros at a time, so the sandbox never
holds more than a block however many GiB are asked for, and stops when the client hangs up.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

from hutch.sandbox.hostile import route
from hutch.sandbox.site import HTML, Reply

BLOCK = bytes(1 << 20)
MAX_GIB = 16
EDGE = "edge.origin.example"  # the name the origin's own "proxy" signs with: no proxy of any pool


def _gib(query: dict[str, str]) -> int:
    gib = int(query.get("gib", "2"))
    if not 0 < gib <= MAX_GIB:
        raise ValueError(f"gib must be between 1 and {MAX_GIB}")
    return gib


def _zeros(gib: int, wbits: int, layers: int = 1) -> Callable[[], AsyncIterator[bytes]]:
    """A stream of `gib` GiB of zeros compressed `layers` times (each layer fed by the one inside)."""

    async def stream() -> AsyncIterator[bytes]:
        packers = [zlib.compressobj(9, zlib.DEFLATED, wbits) for _ in range(layers)]

        def through(data: bytes, mode: int) -> bytes:
            for packer in packers:
                data = packer.compress(data) + packer.flush(mode)
            return data

        for _ in range(gib * 1024):
            # A sync flush per MiB sends each block at once: a client that stops reading after
            # a few MiB costs the sandbox a few MiB of compressing, not the whole bomb.
            yield through(BLOCK, zlib.Z_SYNC_FLUSH)
            await asyncio.sleep(0)  # compressing is CPU: let the sandbox's other sites answer
        yield through(b"", zlib.Z_FINISH)

    return stream


def _bomb(query: dict[str, str], encoding: str, wbits: int, layers: int = 1) -> Reply:
    return Reply(
        200,
        content_type=HTML,
        headers=[("Content-Encoding", encoding)],
        stream=_zeros(_gib(query), wbits, layers),
    )


@route("gzip-bomb")
def gzip_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "gzip", zlib.MAX_WBITS | 16)


@route("stacked-bomb")
def stacked_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "gzip, gzip", zlib.MAX_WBITS | 16, layers=2)


@route("deflate-bomb")
def deflate_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "deflate", zlib.MAX_WBITS)


@route("bogus-charset")
def bogus_charset(query: dict[str, str]) -> Reply:
    body = (
        '<!DOCTYPE html>\n<html><head><meta charset="also-does-not-exist"><title>bogus</title></head>'
        "<body><p>caf\u00e9 cr\u00e8me br\u00fbl\u00e9e</p></body></html>\n"
    ).encode("latin-1")
    return Reply(200, body, "text/html; charset=does-not-exist")


@route("huge-header")
def huge_header(query: dict[str, str]) -> Reply:
    kib = int(query.get("kib", "1024"))
    if not 0 < kib <= 16 * 1024:
        raise ValueError("kib must be between 1 and 16384")
    return Reply(200, b"small body\n", headers=[("X-Huge", "h" * (kib * 1024))])


@route("origin-407")
def origin_407(query: dict[str, str]) -> Reply:
    return Reply(
        407,
        b"the site itself asks for proxy credentials\n",
        headers=[("Proxy-Authenticate", 'Basic realm="origin"')],
    )


@route("origin-proxy-status")
def origin_proxy_status(query: dict[str, str]) -> Reply:
    return Reply(
        502,
        b"bad gateway, says the site's own edge\n",
        headers=[("Proxy-Status", f"{EDGE}; error=proxy_internal_error")],
    )
