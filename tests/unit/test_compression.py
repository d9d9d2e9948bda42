"""The codec of message bodies on the wire: compressed above a threshold, inflated only up to a bound."""

from __future__ import annotations

import random
import zlib

import pytest

from hutch.compression import ZLIB, pack, unpack
from hutch.models import DecodeError
from hutch.settings import Settings

PAGE = b'{"v":1,"text":"' + b"<p>Some documentation text, said again and again.</p>" * 2000 + b'"}'


def test_a_large_body_packs_smaller_and_unpacks_to_the_same_bytes() -> None:
    packed, encoding = pack(PAGE, 16384)
    assert encoding == ZLIB
    assert len(packed) < len(PAGE) // 4
    assert unpack(packed, encoding, len(PAGE)) == PAGE


def test_a_body_at_the_threshold_or_below_is_left_as_it_is() -> None:
    body = PAGE[:16384]
    assert pack(body, 16384) == (body, None)


def test_a_threshold_of_zero_never_compresses() -> None:
    assert pack(PAGE, 0) == (PAGE, None)


def test_a_body_that_would_not_shrink_is_sent_as_it_is() -> None:
    noise = random.Random(7).randbytes(50_000)
    assert pack(noise, 16) == (noise, None)


def test_a_body_without_content_encoding_is_taken_as_it_is() -> None:
    assert unpack(b"not compressed", None, 4) == b"not compressed"


def test_a_body_inflating_to_exactly_the_limit_is_accepted() -> None:
    assert unpack(zlib.compress(PAGE), ZLIB, len(PAGE)) == PAGE


def test_a_bomb_is_refused_at_the_limit_without_inflating_it_all() -> None:
    bomb = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)
    assert len(bomb) < 100_000
    with pytest.raises(DecodeError, match="inflates beyond 1,048,576 bytes"):
        unpack(bomb, ZLIB, 1024 * 1024)


def test_one_byte_over_the_limit_is_refused() -> None:
    with pytest.raises(DecodeError, match="inflates beyond"):
        unpack(zlib.compress(PAGE), ZLIB, len(PAGE) - 1)


def test_a_corrupt_body_is_refused() -> None:
    with pytest.raises(DecodeError, match="corrupt zlib body"):
        unpack(b"this was never zlib", ZLIB, 1 << 20)


def test_a_stream_cut_short_is_refused() -> None:
    packed = zlib.compress(PAGE)
    with pytest.raises(DecodeError, match="cut short"):
        unpack(packed[: len(packed) // 2], ZLIB, 1 << 20)


def test_data_after_the_end_of_the_stream_is_refused() -> None:
    with pytest.raises(DecodeError, match="data after its end"):
        unpack(zlib.compress(PAGE) + b"tail", ZLIB, 1 << 20)


@pytest.mark.parametrize("encoding", ["gzip", "br", "ZLIB", "zlib, zlib"])
def test_an_unknown_content_encoding_is_refused(encoding: str) -> None:
    with pytest.raises(DecodeError, match="unknown content_encoding"):
        unpack(zlib.compress(PAGE), encoding, 1 << 20)


def test_the_inflate_limit_is_four_page_bodies_unless_set() -> None:
    assert Settings(max_body_bytes=1000).inflate_limit == 4000
    assert Settings(max_body_bytes=1000, max_inflated_bytes=123).inflate_limit == 123
