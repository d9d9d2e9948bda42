"""Which links a crawl's page offers (services/parser/links.discover): resolved, checked,
filtered by the follow rules, once each by their canonical form, and capped."""

from __future__ import annotations

from parsel import Selector

from hutch.models import FieldRule, FollowRule
from hutch.services.parser.links import discover

PAGE = "http://site.test/dir/page.html"
HREFS = FieldRule(kind="css", expr="a::attr(href)")


def page(*hrefs: str, base: str | None = None) -> Selector:
    head = f'<base href="{base}">' if base else ""
    anchors = "".join(f'<a href="{href}">x</a>' for href in hrefs)
    return Selector(text=f"<html><head>{head}</head><body>{anchors}</body></html>", type="html")


def test_relative_links_resolve_and_non_pages_are_skipped() -> None:
    found = discover(
        page("next.html", "../up.html", "/root", "mailto:a@b.c", "javascript:void(0)", " ", "http://[::1"),
        PAGE, "site.test", [FollowRule(links=HREFS)], 100, 8192,
    )  # fmt: skip
    assert found.links == ["http://site.test/dir/next.html", "http://site.test/up.html", "http://site.test/root"]
    assert (found.seen, found.invalid) == (7, 4)


def test_a_base_href_is_what_relative_links_resolve_against() -> None:
    found = discover(page("a.html", base="/other/"), PAGE, "site.test", [FollowRule(links=HREFS)], 100, 8192)
    assert found.links == ["http://site.test/other/a.html"]


def test_one_page_spelled_many_ways_is_offered_once_as_first_found() -> None:
    hrefs = ("b?y=2&x=1", "HTTP://SITE.TEST:80/dir/b?x=1&y=2#top", "./b?x=1&y=2", "c")
    found = discover(page(*hrefs), PAGE, "site.test", [FollowRule(links=HREFS)], 100, 8192)
    assert found.links == ["http://site.test/dir/b?y=2&x=1", "http://site.test/dir/c"]


def test_same_domain_allow_and_deny_filter_the_absolute_url() -> None:
    hrefs = ("a.html", "print/a.html", "b.txt", "http://other.test/a.html", "http://site.test:8080/a.html")
    rule = FollowRule(links=HREFS, allow=[r"\.html$"], deny=["/print/"])
    found = discover(page(*hrefs), PAGE, "site.test", [rule], 100, 8192)
    assert found.links == ["http://site.test/dir/a.html"]
    assert found.filtered == 4
    anywhere = FollowRule(links=HREFS, allow=[r"\.html$"], deny=["/print/"], same_domain=False)
    found = discover(page(*hrefs), PAGE, "site.test", [anywhere], 100, 8192)
    assert found.links == ["http://site.test/dir/a.html", "http://other.test/a.html", "http://site.test:8080/a.html"]


def test_a_page_of_many_links_offers_at_most_the_limit_and_counts_the_rest() -> None:
    found = discover(page(*(f"p{i}" for i in range(50))), PAGE, "site.test", [FollowRule(links=HREFS)], 10, 8192)
    assert len(found.links) == 10 and found.over_limit == 40


def test_urls_over_the_byte_limit_are_invalid() -> None:
    found = discover(page("a" * 200, "b"), PAGE, "site.test", [FollowRule(links=HREFS)], 10, 100)
    assert found.links == ["http://site.test/dir/b"] and found.invalid == 1
