"""Sitemaps (sitemaps.org): a crawl's page whose body is a sitemap offers the URLs it lists.

In a crawl, a page is read as a sitemap instead of HTML when its body is XML whose root
element is `urlset` or `sitemapindex` in the sitemaps.org namespace, plain or gzipped (the
fetcher sends a gzip file's bytes as they are: `Page.gzip_body`). The text of its `<loc>`
elements (under `url`, or under `sitemap` in an index) are the page's links: resolved against
the sitemap's URL, checked, kept when one of the spec's `follow:` rules keeps them
(`same_domain`, `allow`, `deny`; a rule's `links:` selector is for HTML and is not used), once
each by canonical form and at most `HUTCH_MAX_LINKS_PER_PAGE`, exactly as a page's links
(`links.Collector`). An index's entries are sitemaps: fetched as the crawl's next depth and
read the same way. Anything else (an HTML page, an RSS feed, a gzip file of something else)
is a page as before, a gzip file's text made as the fetcher would have made it.

A sitemap is outside input, so it is read with bounds of its own besides the worker's time
and memory limits:

- The root element must start within the first `SNIFF_BYTES` of the document, or the body is
  no sitemap; a page that does not mention `urlset` or `sitemapindex` near its start is never
  given to the XML parser at all.
- No DTD: a sitemap never needs one, and entity declarations are how a "billion laughs"
  document or an external entity (XXE) works. lxml reads with `resolve_entities=False`,
  `load_dtd=False`, `no_network=True` and `huge_tree=False` (libxml2's limits on depth and
  text size hold), and a DOCTYPE that names a sitemap's root is refused (`SitemapInvalid`)
  as soon as its name is read, before any declaration in it; any other DOCTYPE (`html`)
  means no sitemap.
- A gzip file is inflated in steps of 64 KiB (`decoding.gunzip`, the fetcher's bounded
  decoder), each step fed to an incremental parser, and the inflated size is counted: past
  `max_body_bytes` (`HUTCH_MAX_BODY_BYTES`, the cap on every decoded body) the page fails
  with `SitemapTooLarge` at once, so a gzip bomb costs a step of memory and a few
  milliseconds. A plain sitemap came within that cap already.
- No tree is built: the parser reports elements and text to `_Reader` as it reads them, so
  memory does not grow with the number of URLs, and a loc's text is kept up to the longest
  link worth resolving.
- A sitemap that is not well-formed XML after its root (an unescaped `&`, a cut-short file,
  a corrupt gzip stream) fails with `SitemapInvalid`, naming the line: XML recovery mangles
  what follows an error (and drops `&amp;`), so no part of a broken sitemap is trusted.

The page's item is `{"sitemap": "urlset" | "sitemapindex", "urls": <loc elements read>}`; the
spec's fields and `item:` schema describe pages, not sitemaps, and are not applied to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from lxml import etree

from hutch.models import FollowRule
from hutch.services.fetcher.decoding import BadEncoding, gunzip
from hutch.services.parser.links import MAX_HREF_CHARS, Collector, CrawlBounds, Filter, Found

NAMESPACE = "http://www.sitemaps.org/schemas/sitemap/0.9"
Kind = Literal["urlset", "sitemapindex"]
ROOTS: dict[str, Kind] = {f"{{{NAMESPACE}}}urlset": "urlset", f"{{{NAMESPACE}}}sitemapindex": "sitemapindex"}
ENTRY: dict[Kind, str] = {"urlset": f"{{{NAMESPACE}}}url", "sitemapindex": f"{{{NAMESPACE}}}sitemap"}
LOC = f"{{{NAMESPACE}}}loc"
SNIFF_BYTES = 64 * 1024  # the root element starts within this much of the document, or it is no sitemap
TEXT_STEP = 64 * 1024  # characters of a plain sitemap's text fed to the parser at a time
_MAYBE = re.compile(r"\s*<")


class SitemapInvalid(Exception):
    """A sitemap (its root or DOCTYPE says so) that cannot be read: a DOCTYPE, XML that is not
    well-formed, or a corrupt gzip stream."""


class SitemapTooLarge(Exception):
    """A gzipped sitemap that inflates past the body cap."""


class _NoSitemap(Exception):
    """The document's root (or its DOCTYPE) names no sitemap: reading stops there."""


@dataclass
class Sitemap:
    kind: Kind
    found: Found

    def item(self) -> dict[str, Any]:
        return {"sitemap": self.kind, "urls": self.found.seen}


def _maybe(text: str) -> bool:
    """Whether a page's text could be a sitemap: a cheap test, so HTML pages skip the XML parser."""
    head = text[:SNIFF_BYTES]
    return _MAYBE.match(head) is not None and ("urlset" in head or "sitemapindex" in head)


def _pieces(text: str) -> Iterator[bytes]:
    for start in range(0, len(text), TEXT_STEP):
        yield text[start : start + TEXT_STEP].encode("utf-8", "surrogatepass")


class _Reader:
    """lxml's parser target: the document's events as they are parsed, no tree kept, so
    memory stays flat however many URLs; each loc of an entry of the root is offered."""

    def __init__(self, url: str, rules: list[FollowRule], bounds: CrawlBounds) -> None:
        self.url = url
        self.filters = [Filter(rule) for rule in rules]
        self.collector = Collector(bounds.domain, bounds.max_links, bounds.max_url_bytes)
        self.kind: Kind | None = None
        self.depth = 0
        self.entry = False  # in an entry of the root (`url` or `sitemap`, as the root asks)
        self.loc: list[str] | None = None  # the text of the loc being read
        self.loc_chars = 0

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        # Called before the DTD's declarations are read: none of them ever is.
        if name.rpartition(":")[2] in ("urlset", "sitemapindex"):
            raise SitemapInvalid("a sitemap declares no DOCTYPE (its entities are not read)")
        raise _NoSitemap

    def start(self, tag: str, attrib: object, nsmap: object = None) -> None:
        self.depth += 1
        if self.depth == 1:
            self.kind = ROOTS.get(tag)
            if self.kind is None:
                raise _NoSitemap
        elif self.depth == 2:
            self.entry = self.kind is not None and tag == ENTRY[self.kind]
        elif self.depth == 3 and self.entry and tag == LOC:
            self.loc, self.loc_chars = [], 0

    def data(self, text: str) -> None:
        if self.loc is not None and self.depth == 3 and self.loc_chars <= MAX_HREF_CHARS:
            self.loc.append(text)  # past MAX_HREF_CHARS the loc is invalid anyway: not kept
            self.loc_chars += len(text)

    def end(self, tag: str) -> None:
        if self.depth == 3 and self.loc is not None:
            self.collector.offer("".join(self.loc), self.url, self.filters)
            self.loc = None
        self.depth -= 1

    def close(self) -> None:
        return None


def read_sitemap(
    text: str, gzip_body: bytes | None, url: str, rules: list[FollowRule], bounds: CrawlBounds
) -> Sitemap | None:
    """The sitemap at `url` (its `text`, or its gzip file's bytes), or None when it is none.
    `SitemapInvalid` or `SitemapTooLarge` for a sitemap that cannot be read within bounds."""
    if gzip_body is None and not _maybe(text):
        return None
    reader = _Reader(url, rules, bounds)
    parser = etree.XMLParser(
        target=reader,
        # A plain sitemap is text already (the fetcher decoded it): fed as UTF-8 whatever its
        # XML declaration says. A gzip file's bytes are read as their declaration says.
        encoding="utf-8" if gzip_body is None else None,
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        huge_tree=False,
    )
    pieces = gunzip(gzip_body) if gzip_body is not None else _pieces(text)
    size = 0
    try:
        for piece in pieces:
            if reader.kind is None and size >= SNIFF_BYTES:
                return None  # no root element near the start: no sitemap
            size += len(piece)
            parser.feed(piece)
            if gzip_body is not None and size > bounds.max_body_bytes and reader.kind is not None:
                raise SitemapTooLarge(f"the gzip file inflates beyond {bounds.max_body_bytes:,} bytes")
        parser.close()
    except _NoSitemap:
        return None
    except etree.XMLSyntaxError as exc:
        if reader.kind is None:
            return None
        raise SitemapInvalid(f"not well-formed XML: {' '.join(str(exc).split())[:200]}") from None
    except BadEncoding as exc:
        if reader.kind is None:
            return None
        raise SitemapInvalid(str(exc)) from None
    if reader.kind is None:
        return None
    return Sitemap(reader.kind, reader.collector.found)
