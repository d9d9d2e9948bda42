"""Content decoding under a cap: every coding round-trips, every bomb stops at the cap.

The bombs are built here in bounded steps too (a compressor fed zeros block by block), and
the decoder is fed them in network-sized chunks, as a fetch would.
"""

from __future__ import annotations

import gzip
import random
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from hutch.services.fetcher.decoding import STEP, BadEncoding, BodyDecoder, BodyTooLarge, parse_encodings

CAP = 1 << 20


def chunks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


def zeros_compressed(total: int, wbits: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(total // len(block))]
    return b"".join(parts) + packer.flush()


def decode(data: bytes, encoding: str | None, cap: int = CAP, layers: int = 2) -> bytes:
    decoder = BodyDecoder(encoding, cap, layers)
    for chunk in chunks(data):
        decoder.feed(chunk)
    return decoder.body()


PAGE = b"<html><body>" + b"hello world " * 5000 + b"</body></html>"


# mtime=0: the same bytes, so the same test ids, in every process that collects them (pytest-xdist).
@pytest.mark.parametrize(
    ("encoding", "encoded"),
    [
        (None, PAGE),
        ("identity", PAGE),
        ("gzip", gzip.compress(PAGE, mtime=0)),
        ("x-gzip", gzip.compress(PAGE, mtime=0)),
        ("deflate", zlib.compress(PAGE)),
        ("deflate", zlib.compress(PAGE, wbits=-15)),  # raw deflate, as some servers send it
        ("gzip, gzip", gzip.compress(gzip.compress(PAGE, mtime=0), mtime=0)),
        ("deflate, gzip", gzip.compress(zlib.compress(PAGE), mtime=0)),
        ("GZip ,identity", gzip.compress(PAGE, mtime=0)),
    ],
)
def test_every_supported_coding_decodes_to_the_page(encoding: str | None, encoded: bytes) -> None:
    assert decode(encoded, encoding) == PAGE


def test_a_body_fed_one_byte_at_a_time_decodes_the_same() -> None:
    for encoding, encoded in (("gzip", gzip.compress(PAGE)), ("deflate", zlib.compress(PAGE, wbits=-15))):
        decoder = BodyDecoder(encoding, CAP, 2)
        for i in range(len(encoded)):
            decoder.feed(encoded[i : i + 1])
        assert decoder.body() == PAGE


def test_gzip_members_one_after_another_are_all_decoded() -> None:
    assert decode(gzip.compress(b"first ") + gzip.compress(b"second"), "gzip") == b"first second"


def test_garbage_after_the_last_gzip_member_is_ignored() -> None:
    assert decode(gzip.compress(PAGE) + b"\r\n", "gzip") == PAGE


def test_a_body_exactly_at_the_cap_is_accepted_and_one_byte_more_is_not() -> None:
    assert len(decode(gzip.compress(bytes(CAP)), "gzip")) == CAP
    with pytest.raises(BodyTooLarge):
        decode(gzip.compress(bytes(CAP + 1)), "gzip")


def test_a_gzip_bomb_stops_at_the_cap_with_memory_bounded() -> None:
    bomb = zeros_compressed(256 << 20, 31)  # 256 MiB of zeros, about 250 KiB on the wire
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            decode(bomb, "gzip")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CAP + 8 * STEP + 2 * len(bomb)


def test_a_stacked_bomb_stops_at_the_cap_of_its_inner_layer() -> None:
    inner = zeros_compressed(256 << 20, 31)
    outer = gzip.compress(inner)
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            decode(outer, "gzip, gzip")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CAP + 8 * STEP + 2 * len(outer)


@pytest.mark.parametrize("wbits", [15, -15])
def test_a_deflate_bomb_stops_at_the_cap(wbits: int) -> None:
    with pytest.raises(BodyTooLarge):
        decode(zeros_compressed(64 << 20, wbits), "deflate")


def test_an_intermediate_layer_over_the_cap_is_too_large_even_if_little_came_out() -> None:
    # The outer gzip holds an inner stream larger than the cap (incompressible data): the
    # outer layer's output is counted on its own, before the inner layer has passed the cap.
    noise = random.Random(1).randbytes(CAP + CAP // 4)
    with pytest.raises(BodyTooLarge, match="gzip layer"):
        decode(gzip.compress(gzip.compress(noise)), "gzip, gzip", cap=CAP)


def test_raw_bytes_far_over_the_cap_are_refused_even_when_they_decode_to_nothing() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    # A gzip header, then empty stored blocks (what a sync flush with no data writes), endlessly.
    empty_flushes = packer.compress(b"") + packer.flush(zlib.Z_SYNC_FLUSH) + b"\x00\x00\x00\xff\xff" * 300_000
    assert len(empty_flushes) > CAP * 1.2
    with pytest.raises(BodyTooLarge, match="raw"):
        decode(empty_flushes, "gzip")


@pytest.mark.parametrize("header", ["br", "zstd", "compress", "gzip, br", "foo"])
def test_unsupported_codings_are_refused(header: str) -> None:
    with pytest.raises(BadEncoding, match="unsupported"):
        parse_encodings(header, 2)


def test_more_codings_than_the_limit_are_refused() -> None:
    assert parse_encodings("gzip, gzip", 2) == ["gzip", "gzip"]
    with pytest.raises(BadEncoding, match="more than 2"):
        parse_encodings("gzip, gzip, gzip", 2)


def test_a_corrupt_stream_is_a_bad_encoding() -> None:
    with pytest.raises(BadEncoding, match="corrupt gzip"):
        decode(b"\x1f\x8b\x08\x00" + b"\xff" * 100, "gzip")
    with pytest.raises(BadEncoding, match="corrupt"):
        decode(b"this is not gzip at all", "gzip")
