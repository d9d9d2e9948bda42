"""Sitemaps in a crawl (services/parser/sitemaps.py): a urlset's or an index's `<loc>` URLs are
the page's links, filtered like a page's; anything else is a page as before; DTDs, gzip bombs
and broken XML end as failures with a reason. The fetcher's side: a crawl's gzip file reaches
the parser as bytes (`page_text`). No network; the pool's tests start real worker processes."""

from __future__ import annotations

import base64
import gzip
import json
import time
import tracemalloc

import pytest
from hutch_sandbox import sitemaps as sandbox_sitemaps

from hutch.models import FieldRule, FollowRule, Spec
from hutch.services.fetcher.charsets import decode_body, page_text
from hutch.services.parser.extract import extract_crawled
from hutch.services.parser.links import CrawlBounds
from hutch.services.parser.pool import Limits, ParseFailed, ParsePool, answer, request_bytes
from hutch.services.parser.sitemaps import (
    NAMESPACE,
    SNIFF_BYTES,
    SitemapInvalid,
    SitemapTooLarge,
    read_sitemap,
)

pytestmark = pytest.mark.timeout(60)

URL = "http://site.test/sitemap.xml"
HREFS = FieldRule(kind="css", expr="a::attr(href)")
ANY = [FollowRule(links=HREFS)]
MIB = 1024 * 1024


def bounds(max_links: int = 1000, max_body_bytes: int = 5 * MIB) -> CrawlBounds:
    return CrawlBounds("site.test", max_links, 8192, max_body_bytes)


def urlset(*locs: str, declaration: str = '<?xml version="1.0" encoding="UTF-8"?>') -> str:
    entries = "".join(f"<url><loc>{loc}</loc><lastmod>2024-01-01</lastmod></url>\n" for loc in locs)
    return f'{declaration}\n<urlset xmlns="{NAMESPACE}">\n{entries}</urlset>\n'


def read(text: str = "", gzip_body: bytes | None = None, rules: list[FollowRule] = ANY, **kw: int) -> list[str]:
    found = read_sitemap(text, gzip_body, URL, rules, bounds(**kw))
    assert found is not None
    return found.found.links


# -- what a sitemap offers -----------------------------------------------------------------------


def test_a_urlsets_locs_are_its_links_checked_once_each_and_filtered_like_a_pages_links() -> None:
    text = urlset(
        " http://site.test/a?x=1&amp;y=2 ",  # white space around a loc is not part of it
        "http://site.test/a?y=2&amp;x=1#top",  # the first, spelled another way
        "/relative.html",  # resolved against the sitemap's URL
        "http://site.test/print/a",
        "http://other.test/b",
        "mailto:someone@site.test",
        "http://site.test/b.pdf",
    )
    assert read(text) == ["http://site.test/a?x=1&y=2", "http://site.test/relative.html", "http://site.test/print/a",
                          "http://site.test/b.pdf"]  # fmt: skip
    rules = [
        FollowRule(links=HREFS, allow=[r"/a\b", r"\.html$"], deny=["/print/"]),
        FollowRule(links=HREFS, allow=[r"\.pdf$"], same_domain=False),
    ]
    # A URL passes when one rule keeps it; a rule's links: selector plays no part.
    assert read(text, rules=rules) == ["http://site.test/a?x=1&y=2", "http://site.test/relative.html",
                                       "http://site.test/b.pdf"]  # fmt: skip
    sitemap = read_sitemap(text, None, URL, rules, bounds())
    assert sitemap is not None and sitemap.item() == {"sitemap": "urlset", "urls": 7}
    assert (sitemap.found.invalid, sitemap.found.filtered) == (1, 2)


def test_a_sitemap_index_offers_its_sitemaps() -> None:
    text = (
        f'<sitemapindex xmlns="{NAMESPACE}"><sitemap><loc>http://site.test/s1.xml</loc><lastmod>2024</lastmod>'
        "</sitemap><sitemap><loc>http://site.test/s2.xml.gz</loc></sitemap></sitemapindex>"
    )
    sitemap = read_sitemap(text, None, URL, ANY, bounds())
    assert sitemap is not None and sitemap.kind == "sitemapindex"
    assert sitemap.found.links == ["http://site.test/s1.xml", "http://site.test/s2.xml.gz"]
    assert sitemap.item() == {"sitemap": "sitemapindex", "urls": 2}


def test_only_locs_of_entries_of_the_sitemaps_namespace_count() -> None:
    text = (
        f'<urlset xmlns="{NAMESPACE}" xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">'
        "<url><loc>http://site.test/a</loc><image:image><image:loc>http://site.test/a.jpg</image:loc></image:image>"
        "</url><sitemap><loc>http://site.test/not-in-a-urlset.xml</loc></sitemap><loc>http://site.test/bare</loc>"
        "</urlset>"
    )
    assert read(text) == ["http://site.test/a"]


def test_a_sitemap_offers_at_most_the_limit() -> None:
    assert read(urlset(*(f"http://site.test/p{i}" for i in range(50))), max_links=10) == [
        f"http://site.test/p{i}" for i in range(10)
    ]


def test_a_gzipped_sitemap_is_read_as_its_declaration_says() -> None:
    text = urlset("http://site.test/café", declaration='<?xml version="1.0" encoding="ISO-8859-1"?>')
    assert read(gzip_body=gzip.compress(text.encode("latin-1"))) == ["http://site.test/café"]
    assert read(gzip_body=gzip.compress(urlset("http://site.test/ü").encode())) == ["http://site.test/ü"]


def test_a_plain_sitemap_is_its_text_whatever_its_declaration_says() -> None:
    # The fetcher decoded the body already (decode_body reads the XML declaration).
    body = urlset("http://site.test/café", declaration='<?xml version="1.0" encoding="ISO-8859-1"?>')
    text, _ = decode_body(body.encode("latin-1"), "application/xml")
    assert read(text) == ["http://site.test/café"]


def test_the_sandboxs_sitemaps_list_their_locs() -> None:
    host, port = "127.0.0.1:8080", 8080
    for path, name in (("/sitemap.xml", "sitemap.xml"), ("/sitemaps/pages.xml", "pages.xml")):
        reply = sandbox_sitemaps.answer(path, {}, host, port)
        assert not isinstance(reply, str) and reply.status == 200
        found = read_sitemap(reply.body.decode(), None, f"http://{host}{path}", ANY, bounds())
        assert found is not None and found.found.seen == len(sandbox_sitemaps.locs(name, host, port))
    reply = sandbox_sitemaps.answer("/sitemaps/items.xml.gz", {}, host, port)
    assert not isinstance(reply, str) and reply.content_type == sandbox_sitemaps.GZIP
    here = CrawlBounds(host, 1000, 8192, 5 * MIB)
    found = read_sitemap("", reply.body, f"http://{host}/sitemaps/items.xml.gz", ANY, here)
    assert found is not None and found.found.links == [f"http://{host}/crawl/item/{n}" for n in ("2-5", "3-12", "1-7")]


# -- what is no sitemap --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<!doctype html><html><head><title>urlset</title></head><body>sitemapindex</body></html>",
        '<?xml version="1.0"?><rss version="2.0"><channel><title>urlset</title></channel></rss>',
        "<urlset><url><loc>http://site.test/a</loc></url></urlset>",  # not the sitemaps namespace
        "urlset, not XML at all",
        " " * SNIFF_BYTES + urlset("http://site.test/a"),  # the root starts too late
        "",
    ],
)
def test_a_page_that_is_no_sitemap_is_left_to_be_read_as_html(text: str) -> None:
    assert read_sitemap(text, None, URL, ANY, bounds()) is None
    assert read_sitemap("", gzip.compress(text.encode()), URL, ANY, bounds()) is None


def test_a_gzip_file_that_is_no_sitemap_is_the_page_the_fetcher_would_have_made() -> None:
    spec = Spec(fields={"title": FieldRule(kind="css", expr="title::text")}, follow=ANY)
    for raw in (gzip.compress(b"<html><title>zipped</title><a href='/x'>x</a></html>"), b"\x1f\x8bnot gzip at all"):
        fields, found = extract_crawled("", URL, 200, spec, None, bounds(), raw, "application/gzip")
        text = decode_body(raw, "application/gzip")[0]
        assert (fields, found) == extract_crawled(text, URL, 200, spec, None, bounds())
        assert found.links == []  # the gzip file's text is binary: no anchors


def test_an_html_page_in_a_crawl_is_read_as_before() -> None:
    spec = Spec(fields={"title": FieldRule(kind="css", expr="title::text")}, follow=ANY)
    html = "<html><head><title>urlset</title></head><body><a href='/next'>sitemapindex</a></body></html>"
    fields, found = extract_crawled(html, URL, 200, spec, None, bounds())
    assert fields == {"title": "urlset"} and found.links == ["http://site.test/next"]


# -- hostile sitemaps ----------------------------------------------------------------------------


def test_a_billion_laughs_sitemap_is_refused_for_its_doctype_without_expanding_anything() -> None:
    reply = sandbox_sitemaps.answer("/sitemaps/entities.xml", {}, "site.test", 80)
    assert not isinstance(reply, str)
    started = time.monotonic()
    with pytest.raises(SitemapInvalid, match="DOCTYPE"):
        read_sitemap(reply.body.decode(), None, URL, ANY, bounds())
    with pytest.raises(SitemapInvalid, match="DOCTYPE"):
        read_sitemap("", gzip.compress(reply.body), URL, ANY, bounds())
    assert time.monotonic() - started < 1.0


def test_an_external_entity_is_never_read(tmp_path: pytest.TempPathFactory) -> None:
    text = (
        '<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
        f'<urlset xmlns="{NAMESPACE}"><url><loc>http://site.test/&secret;</loc></url></urlset>'
    )
    with pytest.raises(SitemapInvalid, match="DOCTYPE"):
        read_sitemap(text, None, URL, ANY, bounds())
    external = f'<!DOCTYPE urlset SYSTEM "http://127.0.0.1:9/dtd"><urlset xmlns="{NAMESPACE}"></urlset>'
    with pytest.raises(SitemapInvalid, match="DOCTYPE"):
        read_sitemap(external, None, URL, ANY, bounds())


def test_a_gzip_bomb_stops_at_the_body_cap_in_bounded_memory_and_time() -> None:
    reply = sandbox_sitemaps.answer("/sitemaps/bomb.xml.gz", {"mib": "1024"}, "site.test", 80)
    assert not isinstance(reply, str) and len(reply.body) < 2 * MIB  # 1 GiB inflated
    started = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(SitemapTooLarge, match="5,242,880"):
            read_sitemap("", reply.body, URL, ANY, bounds())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, peak  # the gzip file (1 MiB) and a few steps, not the cap, nor 1 GiB
    assert time.monotonic() - started < 2.0


def test_a_sitemap_just_under_the_cap_is_read_whole() -> None:
    text = urlset(*(f"http://site.test/p{i}" for i in range(100)))
    size = len(text.encode())
    assert len(read(gzip_body=gzip.compress(text.encode()), max_body_bytes=size)) == 100
    with pytest.raises(SitemapTooLarge):
        read(gzip_body=gzip.compress(text.encode()), max_body_bytes=size - 1)


def test_a_sitemap_that_is_not_well_formed_is_invalid_naming_the_line() -> None:
    broken = sandbox_sitemaps.answer("/sitemaps/broken.xml", {}, "site.test", 80)
    assert not isinstance(broken, str)
    with pytest.raises(SitemapInvalid, match="line 4"):
        read_sitemap(broken.body.decode(), None, URL, ANY, bounds())
    whole = gzip.compress(urlset(*(f"http://site.test/p{i}" for i in range(100))).encode())
    with pytest.raises(SitemapInvalid, match="not well-formed"):  # a gzip file cut short
        read_sitemap("", whole[: len(whole) // 2], URL, ANY, bounds())
    large = gzip.compress(urlset(*(f"http://site.test/p{i}" for i in range(20_000))).encode())
    middle = len(large) // 2
    corrupt = large[:middle] + bytes(b ^ 0xFF for b in large[middle : middle + 200]) + large[middle + 200 :]
    with pytest.raises(SitemapInvalid):  # garbled XML or a corrupt stream, whichever comes first
        read_sitemap("", corrupt, URL, ANY, bounds())


# -- in the parser's worker ----------------------------------------------------------------------


def request(gzip_body: bytes | None, text: str = "", max_body_bytes: int = 5 * MIB) -> bytes:
    spec = Spec(fields={"title": FieldRule(kind="css", expr="title::text")}, follow=ANY)
    crawl = {"domain": "site.test", "max_links": 1000, "max_url_bytes": 8192, "max_body_bytes": max_body_bytes}
    return request_bytes({
        "url": URL, "status": 200, "spec": spec.model_dump(), "crawl": crawl,
        "gzip_body": base64.b64encode(gzip_body).decode() if gzip_body is not None else None,
        "content_type": "application/x-gzip",
    }, text)  # fmt: skip


def test_a_worker_answers_a_sitemap_with_its_item_and_its_urls_as_links() -> None:
    body = gzip.compress(urlset("http://site.test/a", "http://site.test/b").encode())
    assert json.loads(answer(request(body), 64 * 1024)) == {
        "fields": {"sitemap": "urlset", "urls": 2},
        "links": ["http://site.test/a", "http://site.test/b"],
    }
    assert json.loads(answer(request(None, urlset("http://site.test/c")), 64 * 1024))["links"] == ["http://site.test/c"]


def test_a_worker_answers_a_hostile_sitemap_with_its_reason() -> None:
    bomb = sandbox_sitemaps.answer("/sitemaps/bomb.xml.gz", {}, "site.test", 80)
    laughs = sandbox_sitemaps.answer("/sitemaps/entities.xml", {}, "site.test", 80)
    assert not isinstance(bomb, str) and not isinstance(laughs, str)
    assert json.loads(answer(request(bomb.body), 64 * 1024))["failure"] == "sitemap_too_large"
    assert json.loads(answer(request(None, laughs.body.decode()), 64 * 1024))["failure"] == "sitemap_invalid"


async def test_the_pool_reads_a_gzipped_sitemap_and_fails_a_bomb_then_goes_on() -> None:
    pool = ParsePool(1, Limits(timeout=5.0, max_item_bytes=64 * 1024, memory_bytes=512 * MIB))
    await pool.start()
    try:
        spec = Spec(fields={"title": FieldRule(kind="css", expr="title::text")}, follow=ANY)
        crawl = bounds()
        bomb = sandbox_sitemaps.answer("/sitemaps/bomb.xml.gz", {}, "site.test", 80)
        assert not isinstance(bomb, str)
        with pytest.raises(ParseFailed) as failed:
            await pool.extract_page("", URL, 200, spec, crawl, base64.b64encode(bomb.body).decode())
        assert failed.value.reason == "sitemap_too_large" and pool.replaced == 0
        body = base64.b64encode(gzip.compress(urlset("http://site.test/a").encode())).decode()
        assert await pool.extract_page("", URL, 200, spec, crawl, body) == (
            {"sitemap": "urlset", "urls": 1},
            ["http://site.test/a"],
        )
    finally:
        await pool.close()


# -- the fetcher's side --------------------------------------------------------------------------


def test_a_crawls_gzip_file_reaches_the_parser_as_bytes_and_every_other_body_as_before() -> None:
    zipped = gzip.compress(urlset("http://site.test/a").encode())
    text, kept = page_text(zipped, "application/x-gzip", crawl=True)
    assert text == "" and kept is not None and base64.b64decode(kept) == zipped
    assert page_text(zipped, "application/x-gzip", crawl=False) == (decode_body(zipped, "application/x-gzip")[0], None)
    html = "<html><title>café</title></html>".encode("cp1252")
    assert page_text(html, "text/html", crawl=True) == (decode_body(html, "text/html")[0], None)
