"""Hostile answers: bodies, encodings, headers, and answers that only look like a proxy's.

    /hostile/gzip-bomb?gib=N       N GiB of zeros (default 2), gzipped: about 1 MiB on the wire per GiB
    /hostile/stacked-bomb?gib=N    the same inside a second gzip (Content-Encoding: gzip, gzip)
    /hostile/deflate-bomb?gib=N    the same as zlib-wrapped deflate
    /hostile/bogus-charset         Content-Type charset=does-not-exist, a <meta> charset just as
                                   bogus, and bytes that are not UTF-8
    /hostile/huge-header?kib=N     a response header of N KiB (default 1024)
    /hostile/origin-407            a 407 with Proxy-Authenticate, from the site itself
    /hostile/origin-proxy-status   a 502 with a Proxy-Status of the site's own edge

The bombs are made while they are sent, one MiB of zeros at a time (one compressed MiB repeated),
so the sandbox never holds more than a block however many GiB are asked for, and stops when the
client hangs up.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal

from hutch_sandbox.hostile import route
from hutch_sandbox.site import HTML, Reply

BLOCK = bytes(1 << 20)
WRITE = 64 * 1024
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, no time, unknown OS
ZLIB_HEADER = b"\x78\xda"  # deflate, 32 KiB window, best compression
FINAL_BLOCK = b"\x03\x00"  # an empty final block (fixed Huffman)
MAX_GIB = 16
EDGE = "edge.origin.example"  # the name the origin's own "proxy" signs with: no proxy of any pool


def _gib(query: dict[str, str]) -> int:
    gib = int(query.get("gib", "2"))
    if not 0 < gib <= MAX_GIB:
        raise ValueError(f"gib must be between 1 and {MAX_GIB}")
    return gib


@functools.cache
def _segment() -> bytes:
    """One MiB of zeros as raw deflate ending in a full flush: a piece that can be repeated."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(BLOCK) + packer.flush(zlib.Z_FULL_FLUSH)


def _dense(gib: int, container: Literal["gzip", "zlib"]) -> Iterator[bytes]:
    """`gib` GiB of zeros in a gzip or zlib container, at deflate's best ratio (about 1000:1).

    A full flush makes each MiB's deflate independent of the one before, so one compressed MiB
    is repeated instead of compressing every GiB; only the checksum is computed as it goes."""
    segment = _segment()
    yield GZIP_HEADER if container == "gzip" else ZLIB_HEADER
    check = zlib.crc32(b"") if container == "gzip" else zlib.adler32(b"")
    for _ in range(gib * 1024):
        check = zlib.crc32(BLOCK, check) if container == "gzip" else zlib.adler32(BLOCK, check)
        yield segment
    if container == "gzip":
        yield FINAL_BLOCK + struct.pack("<II", check, (gib << 30) & 0xFFFFFFFF)
    else:
        yield FINAL_BLOCK + struct.pack(">I", check)


def _zeros(gib: int, container: Literal["gzip", "zlib"], stacked: bool) -> Callable[[], AsyncIterator[bytes]]:
    """The bomb's body, sent in writes of 64 KiB as a file served from disk would be, so a client
    reads chunks that each decode to about 64 MiB. Stacked, the dense stream is gzipped once
    more and flushed every 64 MiB of zeros (each write then decodes to 64 MiB of gzip stream,
    itself about 64 GiB... of which the sandbox only ever makes what is read)."""

    async def stream() -> AsyncIterator[bytes]:
        outer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16) if stacked else None
        pending = bytearray()
        for n, piece in enumerate(_dense(gib, container), start=1):
            if outer is not None:
                piece = outer.compress(piece) + (outer.flush(zlib.Z_SYNC_FLUSH) if n % 64 == 0 else b"")
            pending += piece
            if len(pending) >= WRITE or n % 64 == 0:
                yield bytes(pending)
                pending.clear()
                await asyncio.sleep(0)  # let the sandbox's other sites answer
        if outer is not None:
            pending += outer.flush()
        yield bytes(pending)

    return stream


def _bomb(query: dict[str, str], encoding: str, container: Literal["gzip", "zlib"], stacked: bool = False) -> Reply:
    return Reply(
        200,
        content_type=HTML,
        headers=[("Content-Encoding", encoding)],
        stream=_zeros(_gib(query), container, stacked),
    )


@route("gzip-bomb")
def gzip_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "gzip", "gzip")


@route("stacked-bomb")
def stacked_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "gzip, gzip", "gzip", stacked=True)


@route("deflate-bomb")
def deflate_bomb(query: dict[str, str]) -> Reply:
    return _bomb(query, "deflate", "zlib")


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
