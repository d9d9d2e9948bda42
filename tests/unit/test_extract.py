"""Extraction: a page and a spec in, a dict of fields out; defaults when there is no spec."""

from __future__ import annotations

import json
import re

import pytest
from parsel import Selector

from hutch.models import FieldRule, Spec
from hutch.services.parser import extract as extract_module
from hutch.services.parser.extract import ItemTooLarge, NotJSON, extract
from hutch.services.parser.schema import ItemInvalid
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


# -- regular expressions on a selector's result ----------------------------------------------------

PRICES = """<html><body>
<span class="price"> Price: 12.50 EUR </span>
<span class="price">was 15.00 EUR, now 9.99 EUR</span>
<ul><li>size 38</li><li>size 40 &amp; 42 &euro;</li><li>no size</li></ul>
</body></html>"""


def test_re_without_many_gives_the_first_match_of_the_first_node_that_matches() -> None:
    item = extract(PRICES, URL, 200, spec_of({"price": {"css": "span.price::text", "re": r"[0-9]+\.[0-9]+"}}))
    assert item == {"price": "12.50"}


def test_re_with_many_gives_every_match_in_every_node_in_document_order() -> None:
    spec = spec_of({"prices": {"css": "span.price::text", "re": r"[0-9]+\.[0-9]+", "many": True}})
    assert extract(PRICES, URL, 200, spec) == {"prices": ["12.50", "15.00", "9.99"]}


def test_re_with_a_group_gives_the_group_and_with_two_gives_both_in_order() -> None:
    one = spec_of({"euros": {"css": "span.price::text", "re": r"([0-9]+)\.[0-9]+"}})
    assert extract(PRICES, URL, 200, one) == {"euros": "12"}
    two = spec_of({"parts": {"css": "span.price::text", "re": r"([0-9]+)\.([0-9]+)", "many": True}})
    assert extract(PRICES, URL, 200, two) == {"parts": ["12", "50", "15", "00", "9", "99"]}


def test_re_with_a_group_named_extract_gives_that_group_of_the_first_match_in_each_node() -> None:
    spec = spec_of({"sizes": {"xpath": "//li/text()", "re": r"size (?P<extract>[0-9]+)", "many": True}})
    assert extract(PRICES, URL, 200, spec) == {"sizes": ["38", "40"]}


def test_re_with_no_match_gives_none_or_an_empty_list() -> None:
    assert extract(PRICES, URL, 200, spec_of({"x": {"css": "li::text", "re": "zzz"}})) == {"x": None}
    assert extract(PRICES, URL, 200, spec_of({"x": {"css": "li::text", "re": "zzz", "many": True}})) == {"x": []}


def test_re_on_markup_sees_the_markup_and_its_matches_are_stripped() -> None:
    spec = spec_of({"tag": {"css": "span.price", "re": r'class="(\w+)">(\s*Price)'}})
    assert extract(PRICES, URL, 200, spec) == {"tag": "price"}
    spec = spec_of({"label": {"css": "span.price::text", "re": r"(\s*Price:)", "many": True}})
    assert extract(PRICES, URL, 200, spec) == {"label": ["Price:"]}


@pytest.mark.parametrize(
    "pattern",
    [r"[0-9.]+", r"([0-9]+)\.([0-9]+)", r"([0-9]+)( EUR)?", r"(?P<extract>[0-9]+)\.", r"(?P<extract>zz)?[0-9]",
     r"&\w+;", r"size (\d+)", r"(?i)SIZE"],
)  # fmt: skip
def test_re_matches_exactly_what_parsels_re_gives(pattern: str) -> None:
    selector = Selector(text=PRICES)
    for css in ("span.price::text", "li::text", "li", "ul"):
        spec = spec_of({"all": {"css": css, "re": pattern, "many": True}, "first": {"css": css, "re": pattern}})
        item = extract(PRICES, URL, 200, spec)
        expected = [value.strip() for value in selector.css(css).re(pattern)]
        assert item["all"] == expected, css
        first = selector.css(css).re_first(pattern)
        assert item["first"] == (first.strip() if first is not None else None), css


def test_re_replaces_entities_except_lt_and_amp_as_parsel_does() -> None:
    spec = spec_of({"x": {"css": "li", "re": r"40 (.*) 42 (.*)<", "many": True}})
    assert extract(PRICES, URL, 200, spec) == {"x": ["&amp;", "€"]}


def test_the_byte_cap_stops_re_matches_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    page = "<html><body><p>" + "ab " * 200_000 + "</p></body></html>"
    taken = 0
    real = extract_module.replace_entities

    def counting(text: str, keep: list[str]) -> str:  # called once per match, as it is taken
        nonlocal taken
        taken += 1
        return real(text, keep=keep)

    monkeypatch.setattr(extract_module, "replace_entities", counting)
    with pytest.raises(ItemTooLarge):
        extract(page, URL, 200, spec_of({"x": {"css": "p::text", "re": "ab", "many": True}}), max_bytes=10_000)
    assert taken < 2_000  # of 200,000 matches: each costs 5 bytes of JSON


def test_a_broken_re_that_skipped_spec_loading_names_the_field() -> None:
    spec = Spec(fields={"price": FieldRule(kind="css", expr="span::text", re="([0-9")})
    with pytest.raises(ValueError, match="field 'price': broken re"):
        extract(PRICES, URL, 200, spec)


# -- JMESPath on JSON pages -------------------------------------------------------------------------

PRODUCT = json.dumps(
    {
        "product": {
            "id": 7,
            "name": "Quiet Teapot",
            "price": {"amount": 12.5, "currency": "EUR"},
            "tags": ["kitchen", "tea"],
            "variants": [{"sku": "T-1", "stock": 3}, {"sku": "T-2", "stock": 0}],
            "in_stock": True,
            "maker": None,
        }
    }
)


def test_jmespath_gives_a_value_as_json_gave_it() -> None:
    spec = spec_of(
        {
            "name": "jmespath:product.name",
            "amount": "jmespath:product.price.amount",
            "price": "jmespath:product.price",
            "in_stock": "jmespath:product.in_stock",
        }
    )
    assert extract(PRODUCT, URL, 200, spec) == {
        "name": "Quiet Teapot",
        "amount": 12.5,
        "price": {"amount": 12.5, "currency": "EUR"},
        "in_stock": True,
    }


def test_a_jmespath_list_result_is_its_matches_the_first_or_all_with_many() -> None:
    spec = spec_of(
        {
            "tag": "jmespath:product.tags",
            "tags": {"jmespath": "product.tags", "many": True},
            "skus": {"jmespath": "product.variants[*].sku", "many": True},
            "available": {"jmespath": "product.variants[?stock > `0`].sku", "many": True},
        }
    )
    assert extract(PRODUCT, URL, 200, spec) == {
        "tag": "kitchen",
        "tags": ["kitchen", "tea"],
        "skus": ["T-1", "T-2"],
        "available": ["T-1"],
    }


def test_a_jmespath_null_or_missing_value_gives_none_or_an_empty_list() -> None:
    spec = spec_of(
        {"maker": "jmespath:product.maker", "gone": "jmespath:nope.x", "many": {"jmespath": "nope", "many": True}}
    )
    assert extract(PRODUCT, URL, 200, spec) == {"maker": None, "gone": None, "many": []}


def test_a_single_value_with_many_is_a_list_of_it() -> None:
    assert extract(PRODUCT, URL, 200, spec_of({"n": {"jmespath": "product.name", "many": True}})) == {
        "n": ["Quiet Teapot"]
    }


def test_jmespath_strings_are_not_stripped() -> None:
    assert extract('{"a": "  x  "}', URL, 200, spec_of({"a": "jmespath:a"})) == {"a": "  x  "}


def test_jmespath_functions_run() -> None:
    spec = spec_of({"n": "jmespath:length(product.variants)", "s": "jmespath:join(', ', product.tags)"})
    assert extract(PRODUCT, URL, 200, spec) == {"n": 2, "s": "kitchen, tea"}


def test_without_a_spec_a_json_page_gives_no_title_and_no_error() -> None:
    assert extract(PRODUCT, URL, 200, None) == {"url": URL, "status": 200, "title": None}
    assert extract("[" * 100_000 + "]" * 100_000, URL, 200, None)["title"] is None


def test_css_and_jmespath_fields_mix_on_one_page() -> None:
    spec = spec_of({"name": "jmespath:product.name", "title": "css:title::text"})
    assert extract(PRODUCT, URL, 200, spec) == {"name": "Quiet Teapot", "title": None}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (PAGE, "Expecting value"),
        ("", "Expecting value"),
        ('{"a": 1} trailing', "Extra data"),
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": Infinity}', "Infinity is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        ('{"a": ' + "9" * 5000 + "}", "integer string conversion"),
    ],
    ids=["html", "empty", "trailing", "nan", "infinity", "deep", "huge-int"],
)
def test_a_page_that_is_not_json_fails_a_jmespath_field_naming_it(body: str, why: str) -> None:
    spec = spec_of({"title": "css:title::text", "price": "jmespath:product.price"})
    with pytest.raises(NotJSON) as info:
        extract(body, URL, 200, spec)
    assert str(info.value).startswith("field 'price' reads JSON, and the page is not JSON: ")
    assert why in str(info.value)
    assert len(str(info.value)) < 300


def test_a_jmespath_type_error_at_run_time_names_the_field() -> None:
    with pytest.raises(ValueError, match="field 'n': jmespath: "):
        extract(PRODUCT, URL, 200, spec_of({"n": "jmespath:length(product.id)"}))


def test_jmespath_output_counts_against_the_byte_cap() -> None:
    body = json.dumps({"rows": ["x" * 100] * 10_000})
    with pytest.raises(ItemTooLarge):
        extract(body, URL, 200, spec_of({"rows": {"jmespath": "rows", "many": True}}), max_bytes=10_000)
    with pytest.raises(ItemTooLarge):
        extract(body, URL, 200, spec_of({"all": "jmespath:@"}), max_bytes=10_000)
    assert len(extract(body, URL, 200, spec_of({"rows": {"jmespath": "rows", "many": True}}))["rows"]) == 10_000


def test_a_json_page_is_not_parsed_as_html_when_no_field_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("parsed as HTML")

    monkeypatch.setattr(Selector, "__init__", refuse)
    assert extract(PRODUCT, URL, 200, spec_of({"id": "jmespath:product.id"})) == {"id": 7}


# -- the item schema ---------------------------------------------------------------------------------


def schema_spec(fields: dict[str, object], item: dict[str, object]) -> Spec:
    return parse_spec({"fields": fields, "item": item})


def test_an_item_that_fits_its_schema_comes_out_with_re_text_converted_to_numbers() -> None:
    spec = schema_spec(
        {"price": {"css": "span.price::text", "re": r"[0-9.]+"}, "size": {"css": "li::text", "re": r"\d+"},
         "sizes": {"css": "li::text", "re": r"\d+", "many": True}, "label": "css:li::text"},
        {"price": {"type": "number", "required": True}, "size": {"type": "integer"}, "sizes": {"type": "list"},
         "label": {"type": "string"}},
    )  # fmt: skip
    item = extract(PRICES, URL, 200, spec)
    assert item == {"price": 12.5, "size": 38, "sizes": ["38", "40", "42"], "label": "size 38"}
    assert list(item) == ["price", "size", "sizes", "label"]


def test_json_values_pass_a_schema_of_their_own_types() -> None:
    spec = schema_spec(
        {"id": "jmespath:product.id", "amount": "jmespath:product.price.amount", "in": "jmespath:product.in_stock",
         "price": "jmespath:product.price", "tags": {"jmespath": "product.tags", "many": True},
         "maker": "jmespath:product.maker"},
        {"id": {"type": "integer"}, "amount": {"type": "number"}, "in": {"type": "boolean"},
         "price": {"type": "object"}, "tags": {"type": "list"}, "maker": {"type": "string"}},
    )  # fmt: skip
    assert extract(PRODUCT, URL, 200, spec)["maker"] is None


def test_fields_the_schema_does_not_name_pass_unchanged() -> None:
    spec = schema_spec({"a": "css:li::text", "b": "css:nope::text"}, {"a": {"type": "string"}})
    assert extract(PRICES, URL, 200, spec) == {"a": "size 38", "b": None}


@pytest.mark.parametrize(
    ("field", "item", "message"),
    [
        ("css:li::text", {"type": "number"}, "field 'f': expected a number or null, got string 'size 38'"),
        ("css:nope::text", {"type": "string", "required": True}, "field 'f' is required, and is null"),
        ("jmespath:product.price", {"type": "list"}, "field 'f': expected a list or null, got object"),
        ("jmespath:product.in_stock", {"type": "number", "required": True},
         "field 'f': expected a number, got boolean True"),
        ("jmespath:product.price.amount", {"type": "integer"},
         "field 'f': expected an integer or null, got number 12.5"),
        ("jmespath:product.id", {"type": "string"}, "field 'f': expected a string or null, got number 7"),
        ("jmespath:product.name", {"type": "boolean"}, "field 'f': expected a boolean or null, got string"),
    ],
)  # fmt: skip
def test_an_item_that_does_not_fit_its_schema_fails_naming_the_field(
    field: str, item: dict[str, object], message: str
) -> None:
    spec = schema_spec({"f": field}, {"f": item})
    body = PRICES if field.startswith("css") else PRODUCT
    with pytest.raises(ItemInvalid, match=re.escape(message)):
        extract(body, URL, 200, spec)


@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity"])
def test_nan_and_infinity_are_not_numbers(text: str) -> None:
    spec = schema_spec({"f": {"css": "p::text", "re": r"\S+"}}, {"f": {"type": "number"}})
    with pytest.raises(ItemInvalid, match="field 'f': expected a number"):
        extract(f"<p>{text}</p>", URL, 200, spec)


def test_a_long_value_is_quoted_short_in_the_error() -> None:
    spec = schema_spec({"f": "css:p::text"}, {"f": {"type": "integer"}})
    with pytest.raises(ItemInvalid) as info:
        extract(f"<p>{'x' * 100_000}</p>", URL, 200, spec)
    assert len(str(info.value)) < 200


# -- the text as UTF-8 (what a worker reads) -------------------------------------------------------

UTF8_PAGES = [
    PAGE,
    "\u00a0\u3000 " + PAGE + "\u2003\n",  # whitespace outside ASCII around the document
    PAGE.replace("Quiet", "Qu\x00iet"),  # a NUL inside a word
    PAGE.replace("Teapot", "Th\u00e9i\u00e8re \u8336\u58fa \U0001f375"),
    "<p class='desc'>no head, no body</p>",
    "   ",
    "\x00\n" + PAGE,  # a NUL before ASCII whitespace at the start
    "\x1c " + PAGE + " \x1f",  # whitespace to Python, not to bytes.strip
    "\n\t " + PAGE + "\r\n",
]


@pytest.mark.parametrize("text", UTF8_PAGES, ids=range(len(UTF8_PAGES)))
def test_the_text_given_as_utf8_extracts_exactly_as_the_text_itself(text: str) -> None:
    spec = spec_of(
        {
            "title": "css:title::text",
            "h1": "xpath://h1/text()",
            "price": {"css": "span.price::text", "re": r"[\d.]+"},
            "all": {"xpath": "//text()", "many": True},
            "links": {"css": "ul.links a::attr(href)", "many": True},
        }
    )
    for page_spec in (spec, None):
        assert extract(text, URL, 200, page_spec, utf8=text.encode("utf-8")) == extract(text, URL, 200, page_spec)


# -- the fast paths: parsel's answers without a parsel Selector a match --------------------------

TRICKY = """<!DOCTYPE html><html xmlns:og="http://ogp.me/ns#"><head><title>Caf&eacute; "Müller" \\ 🫖</title>
<meta property="og:title" content="Tea &amp; more"></head><body>
<!-- a comment -->
<div id="a" class="x y">one <b>bold</b> tail<br>after</div>
<div class="x">two<script>var s = "</div>";</script></div>
<p data-n="3">line one
line two\ttabbed</p>
<a href="/p?a=1&amp;b=2">first</a><a href="mailto:me@example.org">second</a>
<table><tr><td>1</td><td>2.5</td></tr></table>
</body></html>"""
QUERIES = [
    ("css", "title::text"),
    ("css", "div.x"),
    ("css", "div.x::text"),
    ("css", "div#a *"),
    ("css", "a::attr(href)"),
    ("css", "p::attr(data-n)"),
    ("css", "p::text"),
    ("css", "meta::attr(content)"),
    ("css", "td:nth-child(2)::text"),
    ("css", "nothing-here"),
    ("xpath", "//comment()"),
    ("xpath", "//div/b"),
    ("xpath", "count(//div)"),
    ("xpath", "sum(//td)"),
    ("xpath", "boolean(//table)"),
    ("xpath", "boolean(//form)"),
    ("xpath", "string(//div[@id='a'])"),
    ("xpath", "//a/@href"),
    ("xpath", "//script/text()"),
    ("xpath", "//td/text() | //title/text()"),
    ("xpath", "//a[re:test(@href, '^mailto:')]/text()"),  # a namespace prefix: through parsel
    ("xpath", "set:distinct(//div/@class)"),
]


@pytest.mark.parametrize(("kind", "expr"), QUERIES)
def test_values_are_parsels_own(kind: str, expr: str) -> None:
    selector = Selector(text=TRICKY, type="html")
    found = selector.css(expr) if kind == "css" else selector.xpath(expr)
    expected = [match.get() for match in found]
    assert list(extract_module._values(selector, FieldRule(kind=kind, expr=expr))) == expected


def test_a_broken_xpath_fails_as_parsel_says() -> None:
    selector = Selector(text=TRICKY, type="html")
    with pytest.raises(ValueError) as parsel_error:
        selector.xpath("//div[")
    with pytest.raises(ValueError) as ours:
        list(extract_module._values(selector, FieldRule(kind="xpath", expr="//div[")))
    assert str(ours.value) == str(parsel_error.value)


JSON_VALUES = [
    "", "plain", 'a "quote"', "back\\slash", "new\nline", "tab\t", "\x00\x1f", "\x7f", "Müller 🫖", "\u2028",
    3, None, ["a", "b\n"], {"k": "v"},
]  # fmt: skip


@pytest.mark.parametrize("value", JSON_VALUES)
def test_json_size_is_the_length_of_the_json(value: object) -> None:
    assert extract_module._json_size(value) == len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def test_a_lone_surrogate_fails_as_its_json_would() -> None:
    with pytest.raises(UnicodeEncodeError):
        json.dumps("\ud800", ensure_ascii=False).encode("utf-8")
    with pytest.raises(UnicodeEncodeError):
        extract_module._json_size("\ud800")
