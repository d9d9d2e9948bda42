"""The parse pool: worker processes that are killed past their time limit, and the item cap.

These start real worker processes (a forkserver and its children), no network.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator

import pytest

from hutch.models import FieldRule, ItemField, Spec
from hutch.services.parser.extract import extract
from hutch.services.parser.pool import Limits, ParseFailed, ParsePool

pytestmark = pytest.mark.timeout(60)

URL = "http://127.0.0.1:8001/page/0"
PAGE = "<html><head><title> Teapot </title></head><body><a href='/1'>one</a><a href='/2'>two</a></body></html>"
LINKS = Spec(fields={"links": FieldRule(kind="css", expr="a::attr(href)", many=True)})
QUADRATIC = Spec(fields={"q": FieldRule(kind="xpath", expr="//*[.=//*]")})
DIVS = Spec(fields={"divs": FieldRule(kind="css", expr="div", many=True)})
# 60,000 elements: `//*[.=//*]` runs for tens of seconds; the limit below is half a second.
SLOW_PAGE = "<html><body>" + "".join(f"<i>aa{i}</i>" for i in range(60_000)) + "</body></html>"
# 6,000 elements: the same expression runs for a few tenths of a second.
MEDIUM_PAGE = "<html><body>" + "".join(f"<i>aa{i}</i>" for i in range(6_000)) + "</body></html>"
DEEP_PAGE = "<html><body>" + "<div>x" * 1000 + "</div>" * 1000 + "</body></html>"


@pytest.fixture
async def pool() -> AsyncIterator[ParsePool]:
    found = ParsePool(1, Limits(timeout=0.5, max_item_bytes=64 * 1024, memory_bytes=512 * 1024 * 1024))
    await found.start()
    try:
        yield found
    finally:
        await found.close()


@pytest.fixture
async def patient() -> AsyncIterator[ParsePool]:
    """One worker with time for a slow page, and no memory cap."""
    found = ParsePool(1, Limits(timeout=5.0, max_item_bytes=1 << 20, memory_bytes=0))
    await found.start()
    try:
        yield found
    finally:
        await found.close()


async def test_a_page_extracts_in_a_worker_exactly_as_in_process(pool: ParsePool) -> None:
    assert await pool.extract(PAGE, URL, 200, None) == extract(PAGE, URL, 200, None)
    assert await pool.extract(PAGE, URL, 200, LINKS) == {"links": ["/1", "/2"]}


async def test_a_pages_text_crosses_to_the_worker_whole_newlines_quotes_and_all(pool: ParsePool) -> None:
    """The text follows the request's JSON line raw: a newline first, in it or last, quotes,
    backslashes and characters beyond ASCII come out as they went in."""
    title = 'Tea\n"pot" \\ \u00e9\u4e2d\U0001f375\n'
    page = f"\n<html><head><title>{title}</title></head>\n<body>\r\n</body></html>\n"
    spec = Spec(fields={"title": FieldRule(kind="css", expr="title::text")})
    assert await pool.extract(page, URL, 200, spec) == extract(page, URL, 200, spec) == {"title": title.strip()}


async def test_a_page_past_the_time_limit_fails_with_parse_timeout_and_its_worker_is_replaced(
    pool: ParsePool,
) -> None:
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(SLOW_PAGE, URL, 200, QUADRATIC)
    assert failed.value.reason == "parse_timeout"
    assert pool.replaced == 1
    # The one slot serves the next page with a new worker.
    assert await pool.extract(PAGE, URL, 200, LINKS) == {"links": ["/1", "/2"]}


async def test_an_item_past_the_byte_cap_fails_with_item_too_large_and_the_worker_stays(pool: ParsePool) -> None:
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(DEEP_PAGE, URL, 200, DIVS)
    assert failed.value.reason == "item_too_large"
    assert pool.replaced == 0
    assert (await pool.extract(PAGE, URL, 200, None))["title"] == "Teapot"


async def test_an_item_just_under_the_cap_is_returned_whole() -> None:
    limits = Limits(timeout=5.0, max_item_bytes=10 * 1024 * 1024, memory_bytes=0)
    pool = ParsePool(1, limits)
    await pool.start()
    try:
        fields = await pool.extract(DEEP_PAGE, URL, 200, DIVS)
    finally:
        await pool.close()
    assert len(fields["divs"]) == 1000


async def test_a_broken_page_or_spec_fails_with_parse_error_and_the_reason_in_the_detail(pool: ParsePool) -> None:
    bad = Spec(fields={"x": FieldRule(kind="xpath", expr="//a[")})
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(PAGE, URL, 200, bad)
    assert failed.value.reason == "parse_error"
    assert "XPath" in failed.value.detail or "xpath" in failed.value.detail.lower()


async def test_a_worker_killed_under_a_page_fails_that_page_with_parse_crash(pool: ParsePool) -> None:
    slot = pool._slots[0]
    assert slot.process is not None and slot.process.pid is not None
    pid = slot.process.pid
    waiting = asyncio.ensure_future(pool.extract(SLOW_PAGE, URL, 200, QUADRATIC))
    await asyncio.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ParseFailed) as failed:
        await waiting
    assert failed.value.reason == "parse_crash"
    assert (await pool.extract(PAGE, URL, 200, None))["title"] == "Teapot"


async def test_a_page_past_the_memory_cap_fails_without_taking_the_pool_down() -> None:
    pool = ParsePool(1, Limits(timeout=10.0, max_item_bytes=1 << 20, memory_bytes=30 * 1024 * 1024))
    await pool.start()
    big = "<html><body>" + "".join(f"<p>aaaa{i}</p>" for i in range(300_000)) + "</body></html>"
    try:
        with pytest.raises(ParseFailed) as failed:
            await pool.extract(big, URL, 200, None)
        assert failed.value.reason == "parse_memory"
        assert pool.replaced == 1
        assert (await pool.extract(PAGE, URL, 200, None))["title"] == "Teapot"
    finally:
        await pool.close()


async def test_two_workers_serve_a_normal_page_while_the_other_is_stuck() -> None:
    pool = ParsePool(2, Limits(timeout=5.0, max_item_bytes=1 << 20, memory_bytes=0))
    await pool.start()
    try:
        stuck = asyncio.ensure_future(pool.extract(SLOW_PAGE, URL, 200, QUADRATIC))
        await asyncio.sleep(0.1)
        assert await pool.extract(PAGE, URL, 200, LINKS) == {"links": ["/1", "/2"]}
        assert not stuck.done()  # served while the other worker was still stuck
        with pytest.raises(ParseFailed):
            await stuck
    finally:
        await pool.close()


# A regular expression that backtracks exponentially: `(\w+\s?)*$` on a line of words that ends
# in a full stop tries every way to split the words before it fails (about 2**n for n letters).
BACKTRACKING = Spec(fields={"line": FieldRule(kind="css", expr="p::text", re=r"^(\w+\s?)*$")})
SENTENCE = "<html><body><p>" + "quiet river paper amber window stone bright winter." + "</p></body></html>"


async def test_a_catastrophically_backtracking_regex_fails_with_parse_timeout_and_its_worker_is_replaced(
    pool: ParsePool,
) -> None:
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(SENTENCE, URL, 200, BACKTRACKING)
    assert failed.value.reason == "parse_timeout"
    assert pool.replaced == 1
    assert await pool.extract(PAGE, URL, 200, LINKS) == {"links": ["/1", "/2"]}


async def test_a_jmespath_field_on_a_page_that_is_not_json_fails_with_not_json_naming_the_field(
    pool: ParsePool,
) -> None:
    spec = Spec(fields={"price": FieldRule(kind="jmespath", expr="product.price")})
    assert await pool.extract('{"product": {"price": 3.5}}', URL, 200, spec) == {"price": 3.5}
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(PAGE, URL, 200, spec)
    assert failed.value.reason == "not_json"
    assert failed.value.detail.startswith("field 'price' reads JSON, and the page is not JSON")
    assert pool.replaced == 0


async def test_an_item_that_does_not_fit_its_schema_fails_with_item_invalid_naming_the_field(pool: ParsePool) -> None:
    spec = Spec(
        fields={"title": FieldRule(kind="css", expr="title::text"), "n": FieldRule(kind="css", expr="a::text")},
        item={"title": ItemField(type="string", required=True), "n": ItemField(type="integer")},
    )
    with pytest.raises(ParseFailed) as failed:
        await pool.extract(PAGE, URL, 200, spec)
    assert failed.value.reason == "item_invalid"
    assert failed.value.detail == "field 'n': expected an integer or null, got string 'one'"
    assert pool.replaced == 0


async def test_an_item_converted_by_its_schema_comes_back_converted(pool: ParsePool) -> None:
    spec = Spec(
        fields={"n": FieldRule(kind="css", expr="a::attr(href)", re=r"\d+")},
        item={"n": ItemField(type="integer", required=True)},
    )
    assert await pool.extract(PAGE, URL, 200, spec) == {"n": 1}


async def test_a_caller_cancelled_while_its_page_is_in_the_worker_leaves_no_answer_for_the_next_page(
    patient: ParsePool,
) -> None:
    cancelled = asyncio.ensure_future(patient.extract(MEDIUM_PAGE, URL, 200, QUADRATIC))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # The one worker is still on the slow page: the next page waits for it, then gets
    # its own answer, never the cancelled page's.
    assert await patient.extract(PAGE, URL, 200, None) == extract(PAGE, URL, 200, None)
    assert patient.replaced == 0


async def test_a_call_cancelled_inside_the_pool_kills_its_worker_so_a_late_answer_is_never_read(
    patient: ParsePool,
) -> None:
    waiting = asyncio.ensure_future(patient.extract(SLOW_PAGE, URL, 200, QUADRATIC))
    await asyncio.sleep(0.2)
    (call,) = patient._calls
    call.cancel()  # what the loop does to every task when the service stops
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # Replaced before the next page: that page is served by a fresh worker.
    assert (await patient.extract(PAGE, URL, 200, None))["title"] == "Teapot"
    assert patient.replaced == 1


async def test_an_answer_announced_past_the_cap_is_refused_unread_and_its_worker_replaced(patient: ParsePool) -> None:
    slot = patient._slots[0]
    assert slot.sock is not None
    # A worker's peer end that announces 1 TB: what a corrupted worker could send.
    fake, peer = socket.socketpair()
    real = slot.sock
    slot.sock = fake
    fake.setblocking(False)
    peer.sendall((1 << 40).to_bytes(8, "big"))
    with pytest.raises(ParseFailed) as failed:
        await patient.extract(PAGE, URL, 200, None)
    assert failed.value.reason == "parse_crash"
    assert "1,099,511,627,776 bytes" in failed.value.detail
    real.close()
    peer.close()
    assert (await patient.extract(PAGE, URL, 200, None))["title"] == "Teapot"
