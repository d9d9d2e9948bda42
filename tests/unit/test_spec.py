"""Job specs: both field forms, and every way a broken spec is refused before a submit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hutch.models import FieldRule, ItemField, Spec
from hutch.services.parser.spec import (
    MAX_EXPR_CHARS,
    MAX_SPEC_BYTES,
    SpecError,
    load_spec,
    parse_spec,
    spec_document,
    spec_from_bytes,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- accepted forms ------------------------------------------------------------------------------


def test_the_string_form_gives_a_first_match_rule_of_its_kind() -> None:
    spec = parse_spec(
        {"fields": {"title": "css:title::text", "price": "xpath://span[@class='price']/text()"}}
    )
    assert spec.fields["title"] == FieldRule(kind="css", expr="title::text", many=False)
    assert spec.fields["price"] == FieldRule(kind="xpath", expr="//span[@class='price']/text()", many=False)


def test_only_the_first_colon_separates_the_kind_from_the_expression() -> None:
    spec = parse_spec({"fields": {"href": "css:a::attr(href)"}})
    assert spec.fields["href"].expr == "a::attr(href)"


def test_the_mapping_form_with_many_true_gives_a_list_rule() -> None:
    spec = parse_spec({"fields": {"links": {"css": "a::attr(href)", "many": True}}})
    assert spec.fields["links"] == FieldRule(kind="css", expr="a::attr(href)", many=True)


def test_the_mapping_form_without_many_gives_a_first_match_rule() -> None:
    spec = parse_spec({"fields": {"h": {"xpath": "//h1/text()"}}})
    assert spec.fields["h"] == FieldRule(kind="xpath", expr="//h1/text()", many=False)


def test_the_mapping_form_with_many_false_gives_a_first_match_rule() -> None:
    assert parse_spec({"fields": {"h": {"css": "h1", "many": False}}}).fields["h"].many is False


def test_field_order_is_kept() -> None:
    spec = parse_spec({"fields": {"z": "css:z", "a": "css:a", "m": "css:m"}})
    assert list(spec.fields) == ["z", "a", "m"]


def test_field_names_are_turned_into_strings() -> None:
    spec = parse_spec({"fields": {2024: "css:h1"}})
    assert list(spec.fields) == ["2024"]


def test_a_yaml_file_with_both_forms_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'fields:\n  title: "css:title::text"\n'
        "  price: \"xpath://span[@class='price']/text()\"\n"
        '  links: {css: "a::attr(href)", many: true}\n',
    )
    spec = load_spec(path)
    assert list(spec.fields) == ["title", "price", "links"]
    assert spec.fields["links"].many is True
    assert spec.fields["price"].kind == "xpath"


def test_load_spec_accepts_a_string_path(tmp_path: Path) -> None:
    path = write(tmp_path, 'fields:\n  t: "css:title"\n')
    assert load_spec(str(path)).fields["t"].expr == "title"


# -- refused selectors ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["regex:\\d+", "CSS:title", "title::text", "jsonpath:$.a", ":title"])
def test_an_unknown_selector_kind_is_refused_with_the_field_name(value: str) -> None:
    with pytest.raises(SpecError, match=r"field 'price'.*unknown selector kind"):
        parse_spec({"fields": {"price": value}})


def test_a_broken_css_selector_is_refused_with_the_field_name() -> None:
    with pytest.raises(SpecError, match="field 'title': broken css selector"):
        parse_spec({"fields": {"title": "css:div[class="}})


def test_an_unknown_css_pseudo_element_is_refused() -> None:
    with pytest.raises(SpecError, match="field 'x': broken css"):
        parse_spec({"fields": {"x": "css:a::nonsense"}})


def test_a_broken_xpath_is_refused_with_the_field_name() -> None:
    with pytest.raises(SpecError, match="field 'price': broken xpath selector"):
        parse_spec({"fields": {"price": "xpath://span[@class='price'"}})


def test_an_xpath_calling_an_unknown_function_is_refused() -> None:
    with pytest.raises(SpecError, match="field 'n': broken xpath"):
        parse_spec({"fields": {"n": "xpath:no-such-function(//a)"}})


def test_a_broken_selector_in_the_mapping_form_is_refused_too() -> None:
    with pytest.raises(SpecError, match="field 'links': broken css"):
        parse_spec({"fields": {"links": {"css": "a[", "many": True}}})


@pytest.mark.parametrize("value", ["css:", "xpath:   ", {"css": ""}, {"xpath": " "}, {"css": None}])
def test_an_empty_selector_is_refused(value: object) -> None:
    with pytest.raises(SpecError, match="field 'f': empty selector"):
        parse_spec({"fields": {"f": value}})


@pytest.mark.parametrize(
    "value",
    [{"css": "a", "xpath": "//a"}, {"many": True}, {}, {"css": "a", "multiple": True}],
)
def test_a_mapping_needs_exactly_one_kind_and_nothing_unknown(value: dict[str, object]) -> None:
    with pytest.raises(SpecError, match="field 'f': give exactly one of css:, xpath: or jmespath:"):
        parse_spec({"fields": {"f": value}})


@pytest.mark.parametrize("value", [42, None, ["css:a"], True])
def test_a_field_that_is_neither_a_string_nor_a_mapping_is_refused(value: object) -> None:
    with pytest.raises(SpecError, match=re.escape("field 'f': expected 'css:...', 'xpath:...' or 'jmespath:...'")):
        parse_spec({"fields": {"f": value}})


@pytest.mark.parametrize("many", ["false", "no", "0"])
def test_a_string_many_that_says_false_does_not_give_a_list(many: str) -> None:
    try:
        rule = parse_spec({"fields": {"f": {"css": "a", "many": many}}}).fields["f"]
    except SpecError:
        return  # refusing it is fine too
    assert rule.many is False


# -- refused documents ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [None, [], "fields", {}, {"fields": {}}, {"fields": None}, {"fields": ["css:a"]}, {"other": {}}],
)
def test_a_spec_without_a_non_empty_fields_mapping_is_refused(data: object) -> None:
    with pytest.raises(SpecError, match="non-empty 'fields:' mapping"):
        parse_spec(data, "job.yaml")


def test_unknown_top_level_keys_are_refused() -> None:
    with pytest.raises(SpecError, match=r"unknown keys \['depth', 'limit'\]"):
        parse_spec({"fields": {"t": "css:title"}, "limit": 5, "depth": True})


def test_the_error_names_the_source_and_the_field() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"ok": "css:title", "bad": "css:a["}}, "jobs/books.yaml")
    message = str(info.value)
    assert message.startswith("jobs/books.yaml: field 'bad'")


def test_invalid_yaml_is_refused_with_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, "fields:\n  title: [unclosed\n")
    with pytest.raises(SpecError, match=re.escape(f"{path}: not valid YAML")):
        load_spec(path)


def test_a_tab_indented_yaml_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "fields:\n\ttitle: css:title\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    with pytest.raises(SpecError, match="non-empty 'fields:' mapping"):
        load_spec(path)


def test_a_broken_selector_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'fields:\n  price: "xpath://span["\n')
    with pytest.raises(SpecError, match=re.escape(f"{path}: field 'price': broken xpath")):
        load_spec(path)


def test_a_missing_file_is_refused_with_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "absent.yaml")


def test_a_file_that_is_not_utf8_is_refused_with_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes('fields:\n  t: "css:p.café"\n'.encode("latin-1"))
    with pytest.raises(SpecError, match=re.escape("spec.yaml")):
        load_spec(path)


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


# -- hostile spec files --------------------------------------------------------------------------

BILLION_LAUGHS = """\
fields:
  title:
    css: a
    many:
      - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
      - &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      - &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      - &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      - &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      - &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
      - &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
      - &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
      - &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.mark.timeout(10)
def test_a_billion_laughs_spec_is_refused_with_a_short_one_line_error(tmp_path: Path) -> None:
    path = write(tmp_path, BILLION_LAUGHS)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "aliases" in message and "not allowed" in message
    assert "\n" not in message
    assert len(message) < 300 + len(str(path))


def test_even_a_harmless_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, 'sel: &s "css:title"\nfields:\n  title: *s\n')
    with pytest.raises(SpecError, match="aliases"):
        load_spec(path)


def test_an_anchor_without_an_alias_is_fine(tmp_path: Path) -> None:
    path = write(tmp_path, 'fields: &f\n  title: "css:title"\n')
    assert list(load_spec(path).fields) == ["title"]


def test_a_spec_file_past_the_size_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = write(tmp_path, "fields:\n  t: css:title\n" + "# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    with pytest.raises(SpecError, match="larger than 64 KiB"):
        load_spec(path)


def test_an_expanded_alias_structure_handed_in_directly_gives_a_bounded_error() -> None:
    laughs: object = ["lol"] * 9
    for _ in range(8):
        laughs = [laughs] * 9  # 9**9 strings by reference, as the YAML above would expand
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"title": {"css": "a", "many": laughs}}})
    assert len(str(info.value)) < 200
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"title": laughs}})
    assert len(str(info.value)) < 200


def test_a_huge_selector_is_refused_and_not_quoted_whole() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"t": "css:" + "a " * 10_000}})
    assert "longer than" in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"t": "regex:" + "x" * 10_000}})
    assert len(str(info.value)) < 300


def test_a_long_field_name_and_many_unknown_keys_are_quoted_short() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"n" * 10_000: 42}})
    assert len(str(info.value)) < 200
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"t": "css:a"}, **{f"k{i}" * 100: 1 for i in range(1000)}})
    assert len(str(info.value)) < 400


def test_too_many_fields_are_refused() -> None:
    with pytest.raises(SpecError, match="at most 200"):
        parse_spec({"fields": {f"f{i}": "css:a" for i in range(201)}})


# -- regular expressions on a selector's result ---------------------------------------------------


def test_re_in_the_mapping_form_is_kept_beside_its_selector() -> None:
    spec = parse_spec({"fields": {"price": {"css": "span.price::text", "re": r"([0-9.]+)"}}})
    assert spec.fields["price"] == FieldRule(kind="css", expr="span.price::text", re=r"([0-9.]+)")


def test_re_goes_with_xpath_and_many_too() -> None:
    spec = parse_spec({"fields": {"n": {"xpath": "//li/text()", "re": r"\d+", "many": True}}})
    assert spec.fields["n"] == FieldRule(kind="xpath", expr="//li/text()", many=True, re=r"\d+")


def test_a_yaml_file_with_re_loads_its_backslashes_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, "fields:\n  price: {css: 'span.price::text', re: '(\\d+)\\.(\\d\\d)'}\n")
    assert load_spec(path).fields["price"].re == r"(\d+)\.(\d\d)"


def test_re_alone_in_the_string_form_is_refused_with_how_to_write_it() -> None:
    with pytest.raises(SpecError, match=r"field 'price': re: filters a selector; use \{css: \.\.\., re: \.\.\.\}"):
        parse_spec({"fields": {"price": r"re:\d+"}})


def test_re_without_a_selector_in_the_mapping_form_is_refused() -> None:
    with pytest.raises(SpecError, match="field 'price': give exactly one of"):
        parse_spec({"fields": {"price": {"re": r"\d+"}}})


def test_a_regular_expression_that_does_not_compile_is_refused_with_the_field_name() -> None:
    with pytest.raises(SpecError, match=r"field 'price': broken re '\(\[0-9': "):
        parse_spec({"fields": {"price": {"css": "span::text", "re": "([0-9"}}})


@pytest.mark.parametrize("pattern", ["", None, 42, ["a"], True])
def test_re_must_be_a_non_empty_string(pattern: object) -> None:
    with pytest.raises(SpecError, match="field 'p': re: must be a non-empty regular expression"):
        parse_spec({"fields": {"p": {"css": "span::text", "re": pattern}}})


def test_a_regular_expression_past_the_length_cap_is_refused_and_not_quoted_whole() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"p": {"css": "span::text", "re": "a" * (MAX_EXPR_CHARS + 1)}}})
    assert "field 'p': re: longer than 4096 characters" in str(info.value)
    assert len(str(info.value)) < 200


def test_a_regular_expression_nested_past_the_compilers_depth_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"p": {"css": "span::text", "re": "(" * 2000 + ")" * 2000}}})
    assert str(info.value).startswith("spec: field 'p': broken re")
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_catastrophic_regular_expression_compiles_its_running_time_is_the_parsers_limit() -> None:
    assert parse_spec({"fields": {"p": {"css": "p::text", "re": "(a+)+$"}}}).fields["p"].re == "(a+)+$"


def test_re_with_jmespath_is_refused() -> None:
    with pytest.raises(SpecError, match="field 'p': re: filters a css: or xpath: result, not jmespath:"):
        parse_spec({"fields": {"p": {"jmespath": "price", "re": r"\d+"}}})


# -- JMESPath --------------------------------------------------------------------------------------


def test_the_jmespath_string_form_gives_a_first_match_rule() -> None:
    spec = parse_spec({"fields": {"name": "jmespath:product.name"}})
    assert spec.fields["name"] == FieldRule(kind="jmespath", expr="product.name")


def test_the_jmespath_mapping_form_takes_many() -> None:
    spec = parse_spec({"fields": {"tags": {"jmespath": "product.tags[*].label", "many": True}}})
    assert spec.fields["tags"] == FieldRule(kind="jmespath", expr="product.tags[*].label", many=True)


@pytest.mark.parametrize(
    "expr", ["product.", "a[?b ==", "[*", "foo(@)", "a[?no_such(b)].c", "length(a, b)", "join(a)", "to_string()"]
)
def test_a_jmespath_expression_that_does_not_compile_is_refused_with_the_field_name(expr: str) -> None:
    with pytest.raises(SpecError, match="field 'x': broken jmespath selector"):
        parse_spec({"fields": {"x": f"jmespath:{expr}"}})


def test_jmespath_functions_with_their_arities_are_accepted() -> None:
    spec = parse_spec(
        {"fields": {"x": "jmespath:join(', ', items[?length(tags) > `1`].name)", "m": "jmespath:max_by(a, &b)"}}
    )
    assert spec.fields["x"].kind == "jmespath"
    assert parse_spec({"fields": {"x": "jmespath:not_null(a, b, c)"}}).fields["x"].expr == "not_null(a, b, c)"


def test_a_deeply_nested_jmespath_expression_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"fields": {"x": "jmespath:" + "(" * 2000 + "a" + ")" * 2000}})
    assert "field 'x': broken jmespath selector" in str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("value", ["jmespath:", {"jmespath": "  "}])
def test_an_empty_jmespath_expression_is_refused(value: object) -> None:
    with pytest.raises(SpecError, match="field 'f': empty selector"):
        parse_spec({"fields": {"f": value}})


# -- the item schema -------------------------------------------------------------------------------


def test_an_item_schema_gives_each_named_field_a_type_optional_by_default() -> None:
    spec = parse_spec(
        {
            "fields": {"title": "css:title::text", "price": "css:span.price::text", "links": "css:a"},
            "item": {"price": {"type": "number", "required": True}, "title": {"type": "string"}},
        }
    )
    assert spec.item == {
        "price": ItemField(type="number", required=True),
        "title": ItemField(type="string", required=False),
    }


def test_a_spec_without_an_item_schema_has_none() -> None:
    assert parse_spec({"fields": {"t": "css:title"}}).item is None


@pytest.mark.parametrize("kind", ["string", "number", "integer", "boolean", "list", "object"])
def test_every_item_type_is_accepted(kind: str) -> None:
    spec = parse_spec({"fields": {"f": "css:a"}, "item": {"f": {"type": kind}}})
    assert spec.item is not None and spec.item["f"].type == kind


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"nope": {"type": "string"}}, "item: field 'nope' is not among the spec's fields"),
        ({"f": {"type": "float"}}, "item: field 'f': unknown type 'float'; use one of string, number, integer"),
        ({"f": {}}, "item: field 'f': unknown type None"),
        ({"f": {"type": "string", "min": 1}}, r"item: field 'f': unknown keys \['min'\]"),
        ({"f": {"type": "string", "required": "yes"}}, "item: field 'f': required: must be true or false"),
        ({"f": "string"}, r"item: field 'f': expected \{type: \.\.\., required: \.\.\.\}, got str"),
        ({}, "item: expected a non-empty mapping"),
        (["f"], "item: expected a non-empty mapping"),
        (None, "item: expected a non-empty mapping"),
    ],
)
def test_a_broken_item_schema_is_refused_naming_the_key(item: object, message: str) -> None:
    with pytest.raises(SpecError, match=f"^job.yaml: {message}"):
        parse_spec({"fields": {"f": "css:a"}, "item": item}, "job.yaml")


def test_a_yaml_file_with_an_item_schema_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "fields:\n  price: {css: 'span.price::text', re: '([0-9.]+)'}\n  name: 'jmespath:name'\n"
        "item:\n  price: {type: number, required: true}\n  name: {type: string}\n",
    )
    spec = load_spec(path)
    assert spec.item == {"price": ItemField(type="number", required=True), "name": ItemField(type="string")}


# -- the file form, round trip ---------------------------------------------------------------------

EVERY_FORM = {
    "fields": {
        "title": "css:title::text",
        "h1": {"xpath": "//h1/text()"},
        "links": {"css": "a::attr(href)", "many": True},
        "price": {"css": "span.price::text", "re": r"([0-9.]+)"},
        "digits": {"xpath": "//li/text()", "re": r"(?P<extract>\d+)", "many": True},
        "name": "jmespath:product.name",
        "tags": {"jmespath": "product.tags[*]", "many": True},
    },
    "item": {"price": {"type": "number", "required": True}, "tags": {"type": "list"}},
}


def test_spec_document_reads_back_to_the_same_spec_for_every_form() -> None:
    spec = parse_spec(EVERY_FORM)
    assert parse_spec(spec_document(spec)) == spec


def test_spec_document_survives_json_and_the_wire_model() -> None:
    import json

    spec = parse_spec(EVERY_FORM)
    assert spec_from_bytes(json.dumps(spec_document(spec)).encode(), "api") == spec
    assert Spec.model_validate_json(spec.model_dump_json()) == spec


def test_spec_document_leaves_out_what_a_spec_does_not_use() -> None:
    document = spec_document(parse_spec({"fields": {"t": "css:title"}}))
    assert document == {"fields": {"t": {"css": "title", "many": False}}}


def test_a_crawl_spec_reads_its_follow_rules_and_limits_and_writes_them_back() -> None:
    spec = parse_spec(
        {
            "fields": {"title": "css:title::text"},
            "follow": [{"links": "css:a::attr(href)", "allow": [r"\.html$"], "deny": ["/print/"]}],
            "max_depth": 2,
        }
    )
    (rule,) = spec.follow
    assert (rule.links.kind, rule.links.expr) == ("css", "a::attr(href)")
    assert (rule.allow, rule.deny) == ([r"\.html$"], ["/print/"])
    assert rule.same_domain and spec.max_depth == 2 and spec.max_pages == 100_000
    assert parse_spec(spec_document(spec)) == spec


@pytest.mark.parametrize(
    ("crawl", "message"),
    [
        ({"max_depth": 2}, "max_depth: only with follow:"),
        ({"follow": []}, "follow: expected a non-empty list"),
        ({"follow": [{"allow": ["x"]}]}, r"follow\[0\]: expected a mapping with links:"),
        ({"follow": [{"links": "css:a", "bogus": 1}]}, r"follow\[0\]: unknown keys \['bogus'\]"),
        ({"follow": [{"links": "jmespath:a"}]}, r"follow\[0\].links: a css: or xpath: selector"),
        ({"follow": [{"links": "css:a["}]}, r"follow\[0\].field 'links': broken css selector"),
        ({"follow": [{"links": "css:a", "deny": ["("]}]}, r"follow\[0\].deny\[0\]: broken regular expression"),
        ({"follow": [{"links": "css:a", "allow": "x"}]}, r"follow\[0\].allow: expected a list"),
        ({"follow": [{"links": "css:a", "same_domain": "yes"}]}, r"follow\[0\].same_domain: must be true or false"),
        ({"follow": [{"links": "css:a"}], "max_depth": -1}, "max_depth: expected a whole number from 0"),
        ({"follow": [{"links": "css:a"}], "max_pages": 0}, "max_pages: expected a whole number from 1"),
    ],
)
def test_crawl_keys_are_checked_and_the_error_names_the_key(crawl: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({"fields": {"t": "css:title"}, **crawl})
