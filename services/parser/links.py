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
count of those left out. Whether a link becomes a task (its depth, the job's `max_pages`, a
page already admitted) is the storer's decision, since it owns the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urljoin

from parsel import Selector

from hutch.models import FollowRule
from hutch.urls import InvalidURL, canonical_url, check_url

MAX_HREF_CHARS = 16384  # an attribute longer than this is no link worth resolving


@dataclass(frozen=True)
class CrawlBounds:
    """What `discover` needs besides the page: its domain, and the caps on what it returns."""

    domain: str
    max_links: int
    max_url_bytes: int


@dataclass
class Found:
    """The links to offer the storer, and what was left out on the way."""

    links: list[str] = field(default_factory=list)  # absolute, checked, unique by canonical form
    seen: int = 0  # strings the rules' selectors yielded
    invalid: int = 0  # not an http(s) URL Hutch would fetch
    filtered: int = 0  # another domain, not allowed, or denied
    over_limit: int = 0  # kept, but past `limit`


def _base(selector: Selector, page_url: str) -> str:
    href = selector.xpath("//base/@href").get()
    if href and len(href) <= MAX_HREF_CHARS:
        try:
            return urljoin(page_url, href.strip())
        except ValueError:
            return page_url
    return page_url


def _matches(patterns: list[re.Pattern[str]], url: str) -> bool:
    return any(pattern.search(url) for pattern in patterns)


def discover(
    selector: Selector, page_url: str, page_domain: str, rules: list[FollowRule], limit: int, max_url_bytes: int
) -> Found:
    """The links `rules` find on the page at `page_url` (in `page_domain`), at most `limit`."""
    found = Found()
    base = _base(selector, page_url)
    canonical_seen: set[str] = set()
    for rule in rules:
        allow = [re.compile(expr) for expr in rule.allow]
        deny = [re.compile(expr) for expr in rule.deny]
        matches = selector.css(rule.links.expr) if rule.links.kind == "css" else selector.xpath(rule.links.expr)
        for match in matches:
            href = match.get()
            found.seen += 1
            if not isinstance(href, str) or not href.strip() or len(href) > MAX_HREF_CHARS:
                found.invalid += 1
                continue
            try:
                checked = check_url(urljoin(base, href.strip()), max_url_bytes)
            except (InvalidURL, ValueError):
                found.invalid += 1
                continue
            if (rule.same_domain and checked.domain != page_domain) or (allow and not _matches(allow, checked.url)):
                found.filtered += 1
                continue
            if _matches(deny, checked.url):
                found.filtered += 1
                continue
            key = canonical_url(checked.url)
            if key in canonical_seen:
                continue
            if len(found.links) >= limit:
                found.over_limit += 1
                continue
            canonical_seen.add(key)
            found.links.append(checked.url)
    return found
