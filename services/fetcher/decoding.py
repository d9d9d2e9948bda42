"""Undoing a response's content encodings with the body cap held at every step.

A gzip bomb is 2 MiB on the wire and 2 GiB decoded; httpx's own decoders inflate each network
chunk in one call, so a 64 KiB chunk of zeros becomes 64 MiB in memory before any cap can look
at it, and a stacked encoding (gzip inside gzip) multiplies that again. Here the raw bytes are
decoded layer by layer with `decompress(data, max_length)`: no call returns more than `STEP`
bytes, the rest of its input waits in `unconsumed_tail`, and every layer's output (not only the
last one's) is counted against the cap, so memory stays within the cap plus a few steps
whatever the ratio.

Supported: `gzip` (and `x-gzip`, and several gzip members one after another), `deflate` (zlib
wrapped, or raw deflate as some servers send it), `identity`. Brotli only when a brotli library
is installed; it is not, so `br` is refused like any unknown encoding (and not offered in
`Accept-Encoding`). More than `max_layers` encodings is refused too: no real server stacks more
than two.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Literal

STEP = 64 * 1024  # most bytes one decompress call may return
ACCEPT_ENCODING = "gzip, deflate"
Coding = Literal["gzip", "deflate"]
_ALIASES: dict[str, Coding] = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
_GZIP_MAGIC = b"\x1f\x8b"


class BodyTooLarge(Exception):
    """The decoded body (or one encoding layer of it) went over the cap."""


class BadEncoding(Exception):
    """A content encoding Hutch cannot decode: unknown, stacked too deep, or corrupt."""


def parse_encodings(header: str | None, max_layers: int) -> list[Coding]:
    """The codings of a Content-Encoding header, in the order the server applied them."""
    codings: list[Coding] = []
    for token in (header or "").split(","):
        name = token.strip().lower()
        if name in ("", "identity"):
            continue
        coding = _ALIASES.get(name)
        if coding is None:
            raise BadEncoding(f"unsupported content encoding {name[:40]!r}")
        codings.append(coding)
        if len(codings) > max_layers:
            raise BadEncoding(f"more than {max_layers} content encodings")
    return codings


def _zlib_header(head: bytes) -> bool:
    """Whether a deflate body starts with a zlib header (RFC 1950), not raw deflate."""
    return head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0


class _Layer:
    """One coding undone in bounded steps."""

    def __init__(self, coding: Coding) -> None:
        self.coding = coding
        self.produced = 0
        self._inflater: zlib._Decompress | None = None
        self._head = b""  # deflate: the first bytes, until the header can be told
        self._done = False  # trailing bytes after the (last) stream are ignored

    def feed(self, data: bytes) -> Iterator[bytes]:
        pending = data
        more = True
        while (pending or more) and not self._done:
            if self._inflater is None:
                if not pending:
                    return
                if self.coding == "deflate":
                    self._head += pending
                    if len(self._head) < 2:
                        return
                    pending, self._head = self._head, b""
                    wbits = zlib.MAX_WBITS if _zlib_header(pending) else -zlib.MAX_WBITS
                else:
                    if not pending.startswith(_GZIP_MAGIC[: len(pending)]) and self.produced:
                        self._done = True  # garbage after the last member, as browsers ignore it
                        return
                    wbits = zlib.MAX_WBITS | 16
                self._inflater = zlib.decompressobj(wbits)
            try:
                out = self._inflater.decompress(pending, STEP)
            except zlib.error as exc:
                raise BadEncoding(f"corrupt {self.coding} stream: {exc}") from None
            # A full step may leave output inside zlib even with no input left: ask again.
            more = len(out) == STEP
            if self._inflater.eof:
                pending = self._inflater.unused_data
                self._inflater = None
                if self.coding == "deflate":
                    self._done = True
            else:
                pending = self._inflater.unconsumed_tail
            if out:
                self.produced += len(out)
                yield out


def gunzip(data: bytes) -> Iterator[bytes]:
    """A gzip file (say `sitemap.xml.gz`, served as application/gzip) inflated in pieces of at
    most `STEP` bytes, as a gzip content encoding is; the caller counts them against its cap.
    BadEncoding when the stream is corrupt."""
    yield from _Layer("gzip").feed(data)


class BodyDecoder:
    """Raw bytes in, decoded bytes kept; raises BodyTooLarge as soon as a layer passes the cap."""

    def __init__(self, content_encoding: str | None, max_bytes: int, max_layers: int) -> None:
        self.max_bytes = max_bytes
        codings = parse_encodings(content_encoding, max_layers)
        self._layers = [_Layer(coding) for coding in reversed(codings)]  # undone last-applied first
        # Compressed data may be a little larger than its content; anything much larger is not a page.
        self._raw_cap = max_bytes + max_bytes // 8 + 4096
        self.raw = 0
        self.size = 0
        self._chunks: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.raw += len(data)
        if self.raw > self._raw_cap:
            raise BodyTooLarge(f"body over {self.max_bytes} bytes (raw)")
        self._push(0, data)

    def _push(self, index: int, data: bytes) -> None:
        if index == len(self._layers):
            self.size += len(data)
            if self.size > self.max_bytes:
                raise BodyTooLarge(f"body over {self.max_bytes} bytes")
            self._chunks.append(data)
            return
        layer = self._layers[index]
        for piece in layer.feed(data):
            if layer.produced > self.max_bytes:
                raise BodyTooLarge(f"{layer.coding} layer over {self.max_bytes} bytes")
            self._push(index + 1, piece)

    def body(self) -> bytes:
        return b"".join(self._chunks)
