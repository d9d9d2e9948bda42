"""Job specs: which fields to extract, checked before anything is submitted.

A spec is YAML with a `fields:` mapping. Each field is either a string, `css:SELECTOR`,
`xpath:EXPR` or `jmespath:EXPR`, which yields the first match, or a mapping
`{css: SELECTOR, many: true}` (or `xpath:`, `jmespath:`), which yields every match as a list:

    fields:
      title: "css:title::text"
      price: "xpath://span[@class='price']/text()"
      links: {css: "a::attr(href)", many: true}
      amount: {css: "span.price::text", re: '([0-9.]+)'}
      sizes: {css: "li.size::text", re: '\\d+', many: true}
      name: "jmespath:product.name"
      tags: {jmespath: "product.tags", many: true}
    item:
      amount: {type: number, required: true}
      name: {type: string}

- `re:` (mapping form only, with `css:` or `xpath:`) filters the selector's matches through a
  regular expression, as parsel's `.re()` does: the whole match, or the text of its groups
  (every group, in order), or only the group named `extract` when there is one. With `many:`
  the field is every match in every selected node, otherwise the first (`.re_first()`); null
  when nothing matches. Values are stripped at their ends, like every selector's.
- `jmespath:` reads the page body as JSON and applies the expression. A list result is the
  matches (the first, or all with `many:`), any other non-null value is one match, null none;
  values are kept as JSON gave them. A page that is not JSON ends dead as `not_json` (stage
  `parse`), naming the field.
- `item:` (optional) gives some fields a type: `string`, `number`, `integer`, `boolean`,
  `list` or `object`; null is allowed unless `required: true`. The item is checked after
  extraction, strings converted where the type asks (`"12.50"` to 12.5 for `number`), and an
  item that does not fit ends dead as `item_invalid` (stage `parse`), naming the field.

- `headers:` and `cookies:` (mappings of names to values) go with every fetch of the job's
  pages, and `budget:` caps what its proxies may cost (the pool's cost units): both are the
  fetcher's and the storer's business, checked here (`hutch.request_options`); an error names
  the header or cookie, never its value.

An unknown selector kind or key, a selector, regular expression or JMESPath expression that
does not compile, or an `item:` entry that names no field or an unknown type, is refused with
the field's name, so a broken spec stops a submit before any URL is queued.

A spec file is outside input, so it is bounded before it is used: at most `MAX_SPEC_BYTES`
are read, YAML aliases are refused (a "billion laughs" file of a few hundred bytes names
billions of nodes through nested aliases; nothing here needs them), fields and expressions
(selectors and regular expressions alike) have a count and a length cap, and every error
message is one line that quotes at most a short prefix of what it refuses. Compiling a
regular expression does not bound its running time (`(a+)+$` backtracks exponentially): that
is the parser's time limit per page (pool.py), which ends such a page as `parse_timeout`.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import Path
from typing import Any, get_args

import jmespath
import jmespath.functions
import yaml
from parsel import Selector
from parsel.csstranslator import HTMLTranslator

from hutch.models import MAX_BUDGET, FieldRule, FollowRule, ItemField, ItemType, Spec
from hutch.request_options import OptionsError, check_options

DEFAULT_FIELDS = ("url", "status", "title")
MAX_SPEC_BYTES = 64 * 1024
MAX_FIELDS = 200
MAX_EXPR_CHARS = 4096
MAX_FOLLOW_RULES = 20
MAX_PATTERNS = 100  # allow: or deny: expressions of one rule
MAX_DEPTH = 1000
MAX_PAGES = 100_000_000
DEFAULT_MAX_PAGES = 100_000  # a crawl's pages when its spec does not say
_QUOTE_CHARS = 80
_TRANSLATOR = HTMLTranslator()
_REPR = reprlib.Repr()
_REPR.maxstring = _QUOTE_CHARS
_REPR.maxother = _QUOTE_CHARS
KINDS = ("css", "xpath", "jmespath")
OPTION_KEYS = ("headers", "cookies", "budget")  # what a job's fetches send, and what its proxies may cost
ITEM_TYPES: tuple[str, ...] = get_args(ItemType)


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file and field."""


def _quote(value: object, limit: int = _QUOTE_CHARS) -> str:
    """A repr of `value` of at most `limit` characters, however large or deep `value` is."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a spec never needs them, and a bomb is made of them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a spec", mark)
        return super().compose_node(parent, index)


def _rule(field: str, value: Any) -> FieldRule:
    name = _quote(field)
    many, pattern = False, None
    if isinstance(value, dict):
        kind, expr, many, pattern = _mapping(name, value)
    elif isinstance(value, str):
        kind, sep, expr = value.partition(":")
        if kind == "re" and sep:
            raise SpecError(
                f"field {name}: re: filters a selector; use {{css: ..., re: ...}} or {{xpath: ..., re: ...}}"
            )
        if not sep or kind not in KINDS:
            raise SpecError(
                f"field {name}: unknown selector kind in {_quote(value)}; use css:SELECTOR, xpath:EXPR or jmespath:EXPR"
            )
    else:
        raise SpecError(f"field {name}: expected 'css:...', 'xpath:...' or 'jmespath:...', got {type(value).__name__}")
    _check_expr(name, kind, expr)
    return FieldRule(kind=kind, expr=expr, many=many, re=pattern)


def _mapping(name: str, value: dict[Any, Any]) -> tuple[str, Any, bool, Any]:
    """(kind, expression, many, re) of a field in the mapping form."""
    extra = set(value) - {*KINDS, "many", "re"}
    kinds = [kind for kind in KINDS if kind in value]
    if extra or len(kinds) != 1:
        raise SpecError(f"field {name}: give exactly one of css:, xpath: or jmespath: (and optionally many:, re:)")
    kind, many = kinds[0], value.get("many", False)
    if not isinstance(many, bool):
        raise SpecError(f"field {name}: many: must be true or false, got {_quote(many)}")
    if "re" not in value:
        return kind, value[kind], many, None
    if kind == "jmespath":
        raise SpecError(f"field {name}: re: filters a css: or xpath: result, not jmespath:")
    _check_pattern(name, value["re"])
    return kind, value[kind], many, value["re"]


def _check_expr(name: str, kind: str, expr: Any) -> None:
    if not isinstance(expr, str) or not expr.strip():
        raise SpecError(f"field {name}: empty selector")
    if len(expr) > MAX_EXPR_CHARS:
        raise SpecError(f"field {name}: selector longer than {MAX_EXPR_CHARS} characters")
    try:
        if kind == "css":
            _TRANSLATOR.css_to_xpath(expr)
        elif kind == "xpath":
            Selector(text="<html/>").xpath(expr)
        else:
            _check_functions(jmespath.compile(expr).parsed)
    except Exception as exc:  # each library has errors of its own (and RecursionError when deep)
        raise SpecError(f"field {name}: broken {kind} selector {_quote(expr)}: {_one_line(str(exc), 120)}") from None


def _check_functions(tree: dict[str, Any]) -> None:
    """JMESPath checks function names and arities only when it runs: here before."""
    table = jmespath.functions.Functions.FUNCTION_TABLE
    stack = [tree]
    while stack:
        node = stack.pop()
        stack.extend(child for child in node.get("children", ()) if isinstance(child, dict))
        if node.get("type") != "function_expression":
            continue
        function, given = node["value"], len(node["children"])
        if function not in table:
            raise ValueError(f"unknown function {function}()")
        signature = table[function]["signature"]
        variadic = bool(signature) and signature[-1].get("variadic", False)
        if given < len(signature) or (given > len(signature) and not variadic):
            raise ValueError(f"{function}() takes {len(signature)}{' or more' if variadic else ''} arguments")


def _check_pattern(name: str, pattern: Any) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise SpecError(f"field {name}: re: must be a non-empty regular expression, got {_quote(pattern)}")
    if len(pattern) > MAX_EXPR_CHARS:
        raise SpecError(f"field {name}: re: longer than {MAX_EXPR_CHARS} characters")
    try:
        re.compile(pattern)
    except Exception as exc:  # re.error, and RecursionError or OverflowError on odd patterns
        raise SpecError(f"field {name}: broken re {_quote(pattern)}: {_one_line(str(exc), 120)}") from None


def _item(data: Any, fields: dict[str, FieldRule]) -> dict[str, ItemField]:
    """The `item:` schema: a known type for fields of the spec, and whether each is required."""
    if not isinstance(data, dict) or not data:
        raise SpecError("item: expected a non-empty mapping of field names to {type: ..., required: ...}")
    schema: dict[str, ItemField] = {}
    for key, value in data.items():
        field = str(key)
        name = _quote(field)
        if field not in fields:
            raise SpecError(f"item: field {name} is not among the spec's fields")
        if not isinstance(value, dict):
            raise SpecError(f"item: field {name}: expected {{type: ..., required: ...}}, got {type(value).__name__}")
        unknown = set(value) - {"type", "required"}
        if unknown:
            shown = ", ".join(_quote(str(k), 40) for k in sorted(map(str, unknown))[:5])
            raise SpecError(f"item: field {name}: unknown keys [{shown}]")
        kind, required = value.get("type"), value.get("required", False)
        if kind not in ITEM_TYPES:
            raise SpecError(f"item: field {name}: unknown type {_quote(kind)}; use one of {', '.join(ITEM_TYPES)}")
        if not isinstance(required, bool):
            raise SpecError(f"item: field {name}: required: must be true or false, got {_quote(required)}")
        schema[field] = ItemField(type=kind, required=required)
    return schema


def _patterns(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}: expected a list of regular expressions")
    if len(value) > MAX_PATTERNS:
        raise SpecError(f"{where}: {len(value)} expressions; at most {MAX_PATTERNS}")
    for n, pattern in enumerate(value):
        if not pattern or len(pattern) > MAX_EXPR_CHARS:
            raise SpecError(f"{where}[{n}]: expected 1 to {MAX_EXPR_CHARS} characters")
        try:
            re.compile(pattern)
        except Exception as exc:  # re.error, and RecursionError or OverflowError on odd patterns
            broken = f"broken regular expression {_quote(pattern)}"
            raise SpecError(f"{where}[{n}]: {broken}: {_one_line(str(exc), 120)}") from None
    return list(value)


def _follow(data: Any) -> list[FollowRule]:
    """The `follow:` rules of a crawl: which links of each page become tasks."""
    if not isinstance(data, list) or not data:
        raise SpecError("follow: expected a non-empty list of rules ({links: ..., allow: [...], deny: [...]})")
    if len(data) > MAX_FOLLOW_RULES:
        raise SpecError(f"follow: {len(data)} rules; at most {MAX_FOLLOW_RULES}")
    rules = []
    for n, value in enumerate(data):
        where = f"follow[{n}]"
        if not isinstance(value, dict) or "links" not in value:
            raise SpecError(f"{where}: expected a mapping with links: (a css: or xpath: selector)")
        unknown = set(value) - {"links", "allow", "deny", "same_domain"}
        if unknown:
            shown = ", ".join(_quote(str(key), 40) for key in sorted(map(str, unknown))[:5])
            raise SpecError(f"{where}: unknown keys [{shown}]")
        try:
            links = _rule("links", value["links"])
        except SpecError as exc:
            raise SpecError(f"{where}.{exc}") from None
        if links.kind == "jmespath":
            raise SpecError(f"{where}.links: a css: or xpath: selector (links are read from HTML)")
        same_domain = value.get("same_domain", True)
        if not isinstance(same_domain, bool):
            raise SpecError(f"{where}.same_domain: must be true or false, got {_quote(same_domain)}")
        allow = _patterns(f"{where}.allow", value.get("allow", []))
        deny = _patterns(f"{where}.deny", value.get("deny", []))
        rules.append(FollowRule(links=links, allow=allow, deny=deny, same_domain=same_domain))
    return rules


def _limit(key: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SpecError(f"{key}: expected a whole number from {low:,} to {high:,}, got {_quote(value)}")
    return value


def _crawl(data: dict[Any, Any]) -> dict[str, Any]:
    """The crawl keys of a spec (follow:, max_depth:, max_pages:), checked."""
    if "follow" not in data:
        extra = sorted({"max_depth", "max_pages"} & set(data))
        if extra:
            raise SpecError(f"{extra[0]}: only with follow: (a crawl)")
        return {}
    return {
        "follow": _follow(data["follow"]),
        "max_depth": _limit("max_depth", data["max_depth"], 0, MAX_DEPTH) if "max_depth" in data else None,
        "max_pages": _limit("max_pages", data.get("max_pages", DEFAULT_MAX_PAGES), 1, MAX_PAGES),
    }


def _options(data: dict[Any, Any]) -> dict[str, Any]:
    """The request keys of a spec (headers:, cookies:, budget:), checked."""
    try:
        headers, cookies = check_options(data.get("headers"), data.get("cookies"))
    except OptionsError as exc:
        raise SpecError(str(exc)) from None
    options: dict[str, Any] = {"headers": headers or None, "cookies": cookies or None}
    if "budget" in data:
        budget = data["budget"]
        if (
            isinstance(budget, bool)
            or not isinstance(budget, (int, float))
            or not math.isfinite(budget)
            or not 0 < budget <= MAX_BUDGET
        ):
            raise SpecError(f"budget: expected a number above 0 (in the proxies' cost units), got {_quote(budget)}")
        options["budget"] = float(budget)
    return options


def parse_spec(data: Any, source: str = "spec") -> Spec:
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict) or not data["fields"]:
        raise SpecError(f"{source}: expected a mapping with a non-empty 'fields:' mapping")
    unknown = set(data) - {"fields", "item", "follow", "max_depth", "max_pages", "archive", *OPTION_KEYS}
    if unknown:
        shown = ", ".join(_quote(str(key), 40) for key in sorted(map(str, unknown))[:5])
        raise SpecError(f"{source}: unknown keys [{shown}]")
    if len(data["fields"]) > MAX_FIELDS:
        raise SpecError(f"{source}: {len(data['fields'])} fields; at most {MAX_FIELDS}")
    try:
        fields = {str(name): _rule(str(name), value) for name, value in data["fields"].items()}
        item = _item(data["item"], fields) if "item" in data else None
        crawl = _crawl(data)
        archive = data.get("archive", False)
        if not isinstance(archive, bool):
            raise SpecError(f"archive: must be true or false, got {_quote(archive)}")
        options = _options(data)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None
    return Spec(fields=fields, item=item, archive=archive, **crawl, **options)


def spec_document(spec: Spec) -> dict[str, Any]:
    """`spec` in the spec file's form (what `parse_spec` reads back to the same Spec)."""
    fields: dict[str, Any] = {}
    for name, rule in spec.fields.items():
        fields[name] = {rule.kind: rule.expr, "many": rule.many}
        if rule.re is not None:
            fields[name]["re"] = rule.re
    document: dict[str, Any] = {"fields": fields}
    if spec.item is not None:
        document["item"] = {name: {"type": f.type, "required": f.required} for name, f in spec.item.items()}
    if spec.follow:
        document["follow"] = [
            {"links": {rule.links.kind: rule.links.expr}, "allow": rule.allow, "deny": rule.deny,
             "same_domain": rule.same_domain}
            for rule in spec.follow
        ]  # fmt: skip
        if spec.max_depth is not None:
            document["max_depth"] = spec.max_depth
        if spec.max_pages is not None:
            document["max_pages"] = spec.max_pages
    if spec.archive:
        document["archive"] = True
    for key in OPTION_KEYS:
        if getattr(spec, key) is not None:
            document[key] = getattr(spec, key)
    return document


def load_spec(path: str | Path) -> Spec:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror}") from None
    return spec_from_bytes(raw, str(path))


def spec_from_bytes(raw: bytes, source: str) -> Spec:
    """A spec file's bytes (YAML, or JSON, which is YAML) as a Spec; `source` names it in errors."""
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{source} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # a SafeLoader without aliases
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML: {_one_line(str(exc))}") from None
    return parse_spec(data, source)
