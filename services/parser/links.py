"""The links a crawl follows from a page: found by the spec's `follow:` rules, resolved,
checked and filtered. Pure; it runs in the parser's worker processes, under their time limit.

Each rule's selector yields strings (`css:a::attr(href)`, any CSS or XPath). Each one is
resolved against the page's URL (or its `<base href>`), checked by the one URL validator
(`hutch.urls.check_url`: http or https, the byte limit, a valid host; anything else, such as
`mailto:` or `javascript:`, is skipped), then kept only if:

- `same_domain` (the default): its domain is the page's (the host and port Hutch keys a
  domain by: `localhost:8080` and `127.0.0.1:8080` are two);
- `allow` is empty, or one of its expressions matches the absolute URL (`re.search`);
- none of `deny` matches.

Links are returned once each by their canonical form (`hutch.urls.canonical_url`), in the
order found, at most `limit` of them: a page of a million anchors yields `limit` links and the
count of those left out, which are not even checked. A sitemap's URLs (sitemaps.py) go through
the same `Collector`. Whether a link becomes a task (its depth, the job's `max_pages`, a page
already admitted) is the storer's decision, since it owns the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urljoin

from parsel import Selector

from hutch.models import FollowRule
from hutch.urls import CheckedURL, InvalidURL, canonical_url, check_url

MAX_HREF_CHARS = 16384  # an attribute longer than this is no link worth resolving


@dataclass(frozen=True)
class CrawlBounds:
    """What `discover` needs besides the page: its domain, and the caps on what it returns."""

    domain: str
    max_links: int
    max_url_bytes: int
    max_body_bytes: int  # what a gzipped sitemap may inflate to (sitemaps.py)


@dataclass
class Found:
    """The links to offer the storer, and what was left out on the way."""

    links: list[str] = field(default_factory=list)  # absolute, checked, unique by canonical form
    seen: int = 0  # strings the rules' selectors yielded
    invalid: int = 0  # not an http(s) URL Hutch would fetch
    filtered: int = 0  # another domain, not allowed, or denied
    over_limit: int = 0  # found once `limit` links were kept: not looked at


def _base(selector: Selector, page_url: str) -> str:
    href = selector.xpath("//base/@href").get()
    if href and len(href) <= MAX_HREF_CHARS:
        try:
            return urljoin(page_url, href.strip())
        except ValueError:
            return page_url
    return page_url


class Filter:
    """One `follow:` rule's filter on a checked URL: `same_domain`, `allow` and `deny`."""

    def __init__(self, rule: FollowRule) -> None:
        self.same_domain = rule.same_domain
        self.allow = [re.compile(expr) for expr in rule.allow]
        self.deny = [re.compile(expr) for expr in rule.deny]

    def keeps(self, checked: CheckedURL, page_domain: str) -> bool:
        if self.same_domain and checked.domain != page_domain:
            return False
        if self.allow and not any(pattern.search(checked.url) for pattern in self.allow):
            return False
        return not any(pattern.search(checked.url) for pattern in self.deny)


class Collector:
    """The links of one page, one string at a time: resolved against `base`, checked, kept
    when one of `filters` keeps it, once each by canonical form, at most `limit` (links.py and
    sitemaps.py share it, so a sitemap's URLs pass exactly the checks a page's links do)."""

    def __init__(self, page_domain: str, limit: int, max_url_bytes: int) -> None:
        self.page_domain = page_domain
        self.limit = limit
        self.max_url_bytes = max_url_bytes
        self.found = Found()
        self._canonical: set[str] = set()

    def offer(self, href: object, base: str, filters: list[Filter]) -> None:
        found = self.found
        found.seen += 1
        if len(found.links) >= self.limit:  # full: what comes after is not even checked
            found.over_limit += 1
            return
        if not isinstance(href, str) or not href.strip() or len(href) > MAX_HREF_CHARS:
            found.invalid += 1
            return
        try:
            checked = check_url(urljoin(base, href.strip()), self.max_url_bytes)
        except (InvalidURL, ValueError):
            found.invalid += 1
            return
        if not any(one.keeps(checked, self.page_domain) for one in filters):
            found.filtered += 1
            return
        key = canonical_url(checked.url)
        if key in self._canonical:
            return
        self._canonical.add(key)
        found.links.append(checked.url)


def discover(
    selector: Selector, page_url: str, page_domain: str, rules: list[FollowRule], limit: int, max_url_bytes: int
) -> Found:
    """The links `rules` find on the page at `page_url` (in `page_domain`), at most `limit`."""
    base = _base(selector, page_url)
    collector = Collector(page_domain, limit, max_url_bytes)
    for rule in rules:
        keep = [Filter(rule)]  # a rule's filter applies to what its own selector finds
        matches = selector.css(rule.links.expr) if rule.links.kind == "css" else selector.xpath(rule.links.expr)
        for match in matches:
            collector.offer(match.get(), base, keep)
    return collector.found
