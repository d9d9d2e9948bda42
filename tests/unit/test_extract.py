"""Extraction: a page and a spec in, a dict of fields out; defaults when there is no spec."""

from __future__ import annotations

import pytest
from parsel import Selector

from hutch.models import FieldRule, Spec
from hutch.services.parser.extract import ItemTooLarge, extract
from hutch.services.parser.spec import DEFAULT_FIELDS, parse_spec

PAGE = """<!DOCTYPE html>
<html><head><title>
   The Quiet Teapot
</title></head>
<body>
<h1>  Quiet   Teapot  </h1>
<span class="price">
  12.50 EUR
</span>
<p class="desc">A teapot. Quiet.</p>
<ul class="links">
  <li><a href="/page/1">  one </a></li>
  <li><a href="/page/2">two</a></li>
  <li><a href="https://other.example/x">  three</a></li>
</ul>
</body></html>
"""
URL = "http://127.0.0.1:8001/page/0"


def spec_of(fields: dict[str, object]) -> Spec:
    return parse_spec({"fields": fields})


# -- without a spec ------------------------------------------------------------------------------


def test_without_a_spec_the_item_is_url_status_and_stripped_title() -> None:
    item = extract(PAGE, URL, 200, None)
    assert item == {"url": URL, "status": 200, "title": "The Quiet Teapot"}
    assert tuple(item) == DEFAULT_FIELDS


def test_without_a_spec_a_page_without_a_title_gives_none() -> None:
    assert extract("<html><body><p>x</p></body></html>", URL, 404, None) == {
        "url": URL,
        "status": 404,
        "title": None,
    }


def test_without_a_spec_an_empty_page_gives_no_title() -> None:
    assert extract("", URL, 204, None)["title"] is None


# -- with a spec ---------------------------------------------------------------------------------


def test_a_string_field_gives_the_first_match_stripped() -> None:
    item = extract(PAGE, URL, 200, spec_of({"price": "css:span.price::text", "link": "css:a::text"}))
    assert item == {"price": "12.50 EUR", "link": "one"}


def test_an_xpath_field_gives_the_first_match_stripped() -> None:
    item = extract(PAGE, URL, 200, spec_of({"price": "xpath://span[@class='price']/text()"}))
    assert item == {"price": "12.50 EUR"}


def test_inner_white_space_is_kept_only_the_ends_are_stripped() -> None:
    assert extract(PAGE, URL, 200, spec_of({"h1": "css:h1::text"})) == {"h1": "Quiet   Teapot"}


def test_many_true_gives_every_match_as_a_list_each_stripped() -> None:
    item = extract(PAGE, URL, 200, spec_of({"links": {"css": "a::text", "many": True}}))
    assert item == {"links": ["one", "two", "three"]}


def test_many_true_with_xpath_gives_attribute_values_in_document_order() -> None:
    item = extract(PAGE, URL, 200, spec_of({"hrefs": {"xpath": "//a/@href", "many": True}}))
    assert item == {"hrefs": ["/page/1", "/page/2", "https://other.example/x"]}


def test_a_css_attribute_selector_gives_the_attribute_value() -> None:
    assert extract(PAGE, URL, 200, spec_of({"href": "css:a::attr(href)"})) == {"href": "/page/1"}


def test_a_field_with_no_match_gives_none() -> None:
    assert extract(PAGE, URL, 200, spec_of({"missing": "css:.nope::text"})) == {"missing": None}


def test_a_many_field_with_no_match_gives_an_empty_list() -> None:
    assert extract(PAGE, URL, 200, spec_of({"missing": {"css": ".nope", "many": True}})) == {"missing": []}


def test_a_spec_gives_exactly_its_fields_and_not_the_defaults() -> None:
    item = extract(PAGE, URL, 200, spec_of({"desc": "css:p.desc::text"}))
    assert item == {"desc": "A teapot. Quiet."}


def test_a_selector_without_text_gives_the_element_markup() -> None:
    assert extract(PAGE, URL, 200, spec_of({"p": "css:p.desc"})) == {
        "p": '<p class="desc">A teapot. Quiet.</p>'
    }


def test_an_xpath_number_result_is_returned_as_text() -> None:
    assert extract(PAGE, URL, 200, spec_of({"n": "xpath:count(//a)"})) == {"n": "3.0"}


def test_fields_come_out_in_spec_order() -> None:
    spec = Spec(
        fields={
            "z": FieldRule(kind="css", expr="title::text"),
            "a": FieldRule(kind="css", expr="h1::text"),
        }
    )
    assert list(extract(PAGE, URL, 200, spec)) == ["z", "a"]


def test_non_ascii_text_comes_through_unchanged() -> None:
    html = "<html><head><title> Café Müller · 東京の本屋 </title></head></html>"
    assert extract(html, URL, 200, None)["title"] == "Café Müller · 東京の本屋"


# -- the per-item byte cap -----------------------------------------------------------------------

DEEP = "<html><body>" + "<div>x" * 2000 + "</div>" * 2000 + "</body></html>"


def test_an_item_under_the_cap_is_the_same_as_without_one() -> None:
    spec = spec_of({"links": {"css": "a::text", "many": True}, "price": "css:span.price::text"})
    assert extract(PAGE, URL, 200, spec, max_bytes=1024) == extract(PAGE, URL, 200, spec)


def test_many_divs_of_a_deeply_nested_page_pass_the_cap() -> None:
    with pytest.raises(ItemTooLarge):
        extract(DEEP, URL, 200, spec_of({"divs": {"css": "div", "many": True}}), max_bytes=1024 * 1024)


def test_the_cap_stops_extraction_before_the_whole_list_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    serialised = 0
    real_get = Selector.get

    def counting_get(self: Selector) -> object:
        nonlocal serialised
        serialised += 1
        return real_get(self)

    monkeypatch.setattr(Selector, "get", counting_get)
    with pytest.raises(ItemTooLarge):
        extract(DEEP, URL, 200, spec_of({"divs": {"css": "div", "many": True}}), max_bytes=100_000)
    assert serialised < 10  # of 2,000 divs: each of the first alone is ~20 KB of markup


def test_a_single_match_over_the_cap_is_refused_too() -> None:
    with pytest.raises(ItemTooLarge):
        extract(DEEP, URL, 200, spec_of({"body": "css:body"}), max_bytes=10_000)


def test_the_default_item_is_held_to_the_cap_too() -> None:
    page = f"<html><head><title>{'t' * 5000}</title></head></html>"
    with pytest.raises(ItemTooLarge):
        extract(page, URL, 200, None, max_bytes=1000)


def test_lxml_keeps_a_bounded_depth_of_a_very_deep_page_without_an_error() -> None:
    deeper = "<html><body>" + "<div>" * 5000 + "</div>" * 5000 + "</body></html>"
    found = extract(deeper, URL, 200, spec_of({"n": "xpath:count(//div)"}))
    assert 0 < float(found["n"]) < 5000  # libxml2 stops nesting past its depth limit
