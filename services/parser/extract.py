"""Extraction: a page and a spec in, a dict of fields out. Pure and CPU-bound.

It runs in the parser's worker processes (see pool.py), which put a time limit on it; this
module bounds what it produces. A spec picks the output, and `{css: div, many: true}` on a
page of deeply nested divs returns every div with all of its descendants: thousands of times
the page. So the output is counted as it is built, in bytes of its JSON, and extraction stops
with `ItemTooLarge` as soon as it passes `max_bytes`, before a huge list exists. That holds
for regular expressions too: their matches are taken one at a time (`re.finditer`), where
parsel's `.re()` would first build the list of every match in a node.

The time limit is what bounds a regular expression that backtracks catastrophically
(`(a+)+$`): Python's `re` cannot be interrupted, and the worker is killed (`parse_timeout`).

The page is parsed as HTML (lxml, through parsel) only when a field uses CSS or XPath, and as
JSON only when one uses JMESPath; a page that is not JSON makes such a field fail with
`NotJSON`, naming it. After extraction the item is checked against the spec's `item:`
schema, if any (schema.py, `ItemInvalid`).

Without a spec the item is `url`, `status`, `title`. A crawl's page that is a sitemap is read
as one (sitemaps.py).
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError
from lxml import etree
from parsel import Selector
from parsel.csstranslator import css2xpath
from w3lib.html import replace_entities

from hutch.models import FieldRule, Spec
from hutch.services.fetcher.charsets import decode_body
from hutch.services.parser.links import CrawlBounds, Found, discover
from hutch.services.parser.schema import check_item
from hutch.services.parser.sitemaps import read_sitemap

_REPR = reprlib.Repr()
_REPR.maxstring = 80


class ItemTooLarge(Exception):
    """The item's JSON would pass the per-item byte cap."""


# What `json.dumps(..., ensure_ascii=False)` escapes in a string; a string without any of it
# takes its UTF-8 and two quotes.
_ESCAPED = re.compile(r'[\x00-\x1f"\\]')


def _json_size(value: Any) -> int:
    """Bytes of `value` as JSON in UTF-8. A string is counted without being encoded as JSON
    when nothing in it needs escaping (a listing page's hundreds of matches are: written as
    JSON to be counted, they were a fifth of its extraction; docs/benchmarks.md, 21st round)."""
    if type(value) is str and _ESCAPED.search(value) is None:
        return len(value.encode("utf-8")) + 2
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


class _Budget:
    """Bytes of JSON an item may still take; counts each value as it is added."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.used = 2  # the braces of the object

    def spend(self, value: Any) -> None:
        if self.max_bytes is None:
            return
        self.used += _json_size(value) + 1  # and the separator after it
        if self.used > self.max_bytes:
            raise ItemTooLarge(f"item passes {self.max_bytes} bytes of JSON")


class NotJSON(Exception):
    """A JMESPath field on a page whose body is not JSON; the message names the field."""


class _Page:
    """One page's text, parsed as HTML and as JSON on first use, each at most once. `utf8`,
    when given, is the text as UTF-8 (what a worker reads): lxml parses it as it is, where a
    text would first be stripped and encoded again (0.1 ms of a ~100 KB page)."""

    def __init__(self, text: str, url: str, utf8: bytes | None = None) -> None:
        self.text = text
        self.url = url
        self.utf8 = utf8
        self._selector: Selector | None = None
        self._json: tuple[Any] | None = None
        self._not_json: str | None = None

    @property
    def selector(self) -> Selector:
        if self._selector is None:
            # type="html": parsel would otherwise try the text as JSON first, unbounded
            # (RecursionError on deep nesting), and refuse CSS and XPath on a page that is JSON.
            if self.utf8 is not None and _strips_alike(self.text):
                self._selector = Selector(body=self.utf8, encoding="utf-8", base_url=self.url, type="html")
            else:
                self._selector = Selector(text=self.text, base_url=self.url, type="html")
        return self._selector

    def json(self, field: str) -> Any:
        if self._json is None and self._not_json is None:
            try:
                self._json = (json.loads(self.text, parse_constant=_no_constant),)
            except RecursionError:  # the C scanner recurses once per level of nesting
                self._not_json = "nested too deep"
            except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
                self._not_json = " ".join(str(exc).split())[:200]
        if self._json is None:
            raise NotJSON(f"field {_REPR.repr(field)} reads JSON, and the page is not JSON: {self._not_json}")
        return self._json[0]


_ASCII_SPACE = " \t\n\r\x0b\x0c"  # what `bytes.strip` strips


def _strips_alike(text: str) -> bool:
    """Whether parsel makes the same document of `text` and of its UTF-8. Of a text it strips
    every whitespace, Unicode's too, then drops NULs; of bytes it drops NULs, then strips ASCII
    whitespace. So the two agree unless the text has a NUL, or whitespace outside ASCII's at
    either end once ASCII's is gone (rare: the text is then what lxml parses)."""
    if not text or "\x00" in text:
        return False
    start, end = 0, len(text)
    while start < end and text[start] in _ASCII_SPACE:
        start += 1
    while end > start and text[end - 1] in _ASCII_SPACE:
        end -= 1
    return start < end and not text[start].isspace() and not text[end - 1].isspace()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads takes NaN and Infinity by default


def _regex_matches(pattern: re.Pattern[str], text: str) -> Iterator[str]:
    """parsel's `extract_regex`, one match at a time: the group named `extract` (its first
    match only), else every group of every match in order, else every whole match; entities
    replaced except `&lt;` and `&amp;`."""
    if "extract" in pattern.groupindex:
        found = pattern.search(text)
        strings: Iterator[str] = iter(() if found is None or found["extract"] is None else (found["extract"],))
    elif pattern.groups:
        strings = (group for match in pattern.finditer(text) for group in match.groups(""))
    else:
        strings = (match[0] for match in pattern.finditer(text))
    for string in strings:
        yield replace_entities(string, keep=["lt", "amp"])


def _selected(page: _Page, name: str, rule: FieldRule) -> Iterator[Any]:
    """A CSS or XPath field's matches, each filtered through `rule.re` when it has one."""
    try:  # checked at spec load, but a spec may come from any AMQP client
        pattern = re.compile(rule.re) if rule.re is not None else None
    except re.error as exc:
        raise ValueError(f"field {_REPR.repr(name)}: broken re: {exc}") from None
    for value in _values(page.selector, rule):  # one match at a time: the cap holds before the list is whole
        if pattern is None:
            yield value
        else:
            yield from _regex_matches(pattern, value)


def _values(selector: Selector, rule: FieldRule) -> Iterable[str]:
    """A CSS or XPath field's matches as strings, exactly as parsel's `.css(...)` or
    `.xpath(...)` then `.get()` of each match gives them. A query with a namespace prefix
    (`re:test(...)`) goes through parsel; any other is evaluated on lxml's tree directly,
    without a parsel `Selector` a match: those objects and their `.get()` were a third of
    extracting a listing page (docs/benchmarks.md, 21st round)."""
    query = css2xpath(rule.expr) if rule.kind == "css" else rule.expr
    if any(f"{prefix}:" in query for prefix in selector.namespaces):
        found = selector.css(rule.expr) if rule.kind == "css" else selector.xpath(rule.expr)
        return (match.get() for match in found)
    try:
        result = _evaluator(query)(selector.root)
    except etree.XPathError as exc:  # parsel's error, word for word
        raise ValueError(f"XPath error: {exc} in {query}") from None
    return map(_serialized, result if isinstance(result, list) else [result])


@lru_cache(maxsize=2048)
def _evaluator(query: str) -> etree.XPath:
    """`query` compiled once per worker, as parsel compiles it (plain strings, no smart ones).
    A syntax error is raised here, an `etree.XPathError` as parsel's is."""
    return etree.XPath(query, smart_strings=False)


def _serialized(node: Any) -> str:
    """One XPath result as parsel's `Selector.get()` makes it: a string as it is, an element
    as HTML without its tail, a boolean as "1" or "0", a number as `str` does."""
    if type(node) is str:
        return node
    try:
        return str(etree.tostring(node, method="html", encoding="unicode", with_tail=False))
    except (AttributeError, TypeError):
        if node is True:
            return "1"
        if node is False:
            return "0"
        return str(node)


def _queried(page: _Page, name: str, rule: FieldRule) -> Iterator[Any]:
    """A JMESPath field's matches: a list result's elements, or any other value but null."""
    document = page.json(name)
    try:
        result = jmespath.compile(rule.expr).search(document)  # compiled once: jmespath caches
    except JMESPathError as exc:
        raise ValueError(f"field {_REPR.repr(name)}: jmespath: {' '.join(str(exc).split())}") from None
    if isinstance(result, list):
        yield from result
    elif result is not None:
        yield result


def _matches(page: _Page, name: str, rule: FieldRule) -> Iterator[Any]:
    if rule.kind == "jmespath":
        yield from _queried(page, name, rule)
        return
    for value in _selected(page, name, rule):
        yield value.strip() if isinstance(value, str) else value


def extract(
    text: str, url: str, status: int, spec: Spec | None, max_bytes: int | None = None, utf8: bytes | None = None
) -> dict[str, Any]:
    """The item of one page; `ItemTooLarge` when its JSON would pass `max_bytes`, `NotJSON`
    for a JMESPath field on a page that is not JSON, `ItemInvalid` when the item does not
    fit the spec's `item:` schema. `utf8`: the same text as UTF-8, when the caller has it."""
    return _fields(_Page(text, url, utf8), url, status, spec, max_bytes)


def extract_crawled(
    text: str,
    url: str,
    status: int,
    spec: Spec,
    max_bytes: int | None,
    crawl: CrawlBounds,
    gzip_body: bytes | None = None,
    content_type: str | None = None,
    utf8: bytes | None = None,
) -> tuple[dict[str, Any], Found]:
    """A crawl's page: its item (as `extract`) and the links its `follow:` rules find (see
    `links.discover`), the page parsed once for both. A sitemap (its text, or a gzip file's
    bytes) gives its own item and its URLs instead (see `sitemaps.read_sitemap`). `utf8` as
    for `extract`."""
    sitemap = read_sitemap(text, gzip_body, url, spec.follow, crawl)
    if sitemap is not None:
        return sitemap.item(), sitemap.found
    if gzip_body is not None:  # a gzip file that is no sitemap: its text as the fetcher makes it
        text, utf8 = decode_body(gzip_body, content_type)[0], None
    page = _Page(text, url, utf8)
    fields = _fields(page, url, status, spec, max_bytes)
    return fields, discover(page.selector, url, crawl.domain, spec.follow, crawl.max_links, crawl.max_url_bytes)


def _fields(page: _Page, url: str, status: int, spec: Spec | None, max_bytes: int | None) -> dict[str, Any]:
    budget = _Budget(max_bytes)
    if spec is None:
        title = page.selector.css("title::text").get()
        fields: dict[str, Any] = {"url": url, "status": status, "title": title.strip() if title else None}
        budget.spend(fields)
        return fields
    fields = {}
    for name, rule in spec.fields.items():
        budget.spend(name)
        matches = _matches(page, name, rule)
        if rule.many:
            values: list[Any] = []
            for value in matches:
                budget.spend(value)
                values.append(value)
            fields[name] = values
        else:
            fields[name] = next(matches, None)
            budget.spend(fields[name])
    return check_item(spec.item, fields) if spec.item else fields
