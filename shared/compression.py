"""Large message bodies may cross the broker compressed, and inflate only up to a bound.

A fetched page is about 100 KB of text on its way to the parser, persistent, so the broker reads,
stores and sends every byte of it. zlib at its fastest level makes it about a fifth of that, but
measured (bench/page_wire.py) the broker saves less CPU than compressing and inflating costs the
fetcher and the parser: publishing stays uncompressed unless `compress_above` is set (a broker on
the other side of a slow or metered link, or short of disk), while consumers always inflate.

A compressed body says so in the AMQP `content_encoding` property; a body without one is taken as
it is, so messages published before compression was turned on still decode. Whatever arrives is
input from outside: a small body must not inflate to gigabytes, so inflating stops one byte past
`limit`, and an over-size, corrupt or unknown encoding is a `DecodeError` like any body that
is not a valid message.
"""

from __future__ import annotations

import zlib

from hutch.models import DecodeError

ZLIB = "zlib"  # the content_encoding of a zlib stream (RFC 1950)
LEVEL = 1  # zlib's fastest: most of the gain in size at a fifth of level 6's CPU


def pack(body: bytes, above: int) -> tuple[bytes, str | None]:
    """`body` as it crosses the broker, with its content_encoding: compressed when over `above`
    bytes (0: never), and kept as it is when compression would not make it smaller."""
    if above <= 0 or len(body) <= above:
        return body, None
    packed = zlib.compress(body, LEVEL)
    return (packed, ZLIB) if len(packed) < len(body) else (body, None)


def unpack(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body as it was published; DecodeError if its encoding is unknown, its stream is
    corrupt or cut short, or it inflates to more than `limit` bytes."""
    if not encoding:
        return body
    if encoding != ZLIB:
        raise DecodeError(f"unknown content_encoding {encoding[:40]!r}")
    inflater = zlib.decompressobj()
    try:
        inflated = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise DecodeError(f"corrupt {ZLIB} body: {exc}") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise DecodeError(f"{ZLIB} body of {len(body):,} bytes inflates beyond {limit:,} bytes")
    if not inflater.eof or inflater.unused_data:
        raise DecodeError(f"corrupt {ZLIB} body: {'data after its end' if inflater.eof else 'cut short'}")
    return inflated
