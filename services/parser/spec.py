"""Job specs: which fields to extract, checked before anything is submitted.

A spec is YAML with a `fields:` mapping. Each field is either a string, `css:SELECTOR` or
`xpath:EXPR`, which yields the first match, or a mapping `{css: SELECTOR, many: true}`
(or `xpath:`), which yields every match as a list:

    fields:
      title: "css:title::text"
      price: "xpath://span[@class='price']/text()"
      links: {css: "a::attr(href)", many: true}

An unknown selector kind or a selector that does not compile is refused with the field's
name, so a broken spec stops a submit before any URL is queued.

A spec file is outside input, so it is bounded before it is used: at most `MAX_SPEC_BYTES`
are read, YAML aliases are refused (a "billion laughs" file of a few hundred bytes names
billions of nodes through nested aliases; nothing here needs them), fields and expressions
have a count and a length cap, and every error message is one line that quotes at most a
short prefix of what it refuses.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml
from parsel import Selector
from parsel.csstranslator import HTMLTranslator

from hutch.models import FieldRule, Spec

DEFAULT_FIELDS = ("url", "status", "title")
MAX_SPEC_BYTES = 64 * 1024
MAX_FIELDS = 200
MAX_EXPR_CHARS = 4096
_QUOTE_CHARS = 80
_TRANSLATOR = HTMLTranslator()
_REPR = reprlib.Repr()
_REPR.maxstring = _QUOTE_CHARS
_REPR.maxother = _QUOTE_CHARS


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
    many = False
    if isinstance(value, dict):
        extra = set(value) - {"css", "xpath", "many"}
        kinds = [kind for kind in ("css", "xpath") if kind in value]
        if extra or len(kinds) != 1:
            raise SpecError(f"field {name}: give exactly one of css: or xpath: (and optionally many:)")
        kind, expr, many = kinds[0], value[kinds[0]], value.get("many", False)
        if not isinstance(many, bool):
            raise SpecError(f"field {name}: many: must be true or false, got {_quote(many)}")
    elif isinstance(value, str):
        kind, sep, expr = value.partition(":")
        if not sep or kind not in ("css", "xpath"):
            raise SpecError(f"field {name}: unknown selector kind in {_quote(value)}; use css:SELECTOR or xpath:EXPR")
    else:
        raise SpecError(f"field {name}: expected 'css:...' or 'xpath:...', got {type(value).__name__}")
    if not isinstance(expr, str) or not expr.strip():
        raise SpecError(f"field {name}: empty selector")
    if len(expr) > MAX_EXPR_CHARS:
        raise SpecError(f"field {name}: selector longer than {MAX_EXPR_CHARS} characters")
    try:
        if kind == "css":
            _TRANSLATOR.css_to_xpath(expr)
        else:
            Selector(text="<html/>").xpath(expr)
    except Exception as exc:
        raise SpecError(f"field {name}: broken {kind} selector {_quote(expr)}: {_one_line(str(exc), 120)}") from None
    return FieldRule(kind=kind, expr=expr, many=many)


def parse_spec(data: Any, source: str = "spec") -> Spec:
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict) or not data["fields"]:
        raise SpecError(f"{source}: expected a mapping with a non-empty 'fields:' mapping")
    unknown = set(data) - {"fields"}
    if unknown:
        shown = ", ".join(_quote(str(key), 40) for key in sorted(map(str, unknown))[:5])
        raise SpecError(f"{source}: unknown keys [{shown}]")
    if len(data["fields"]) > MAX_FIELDS:
        raise SpecError(f"{source}: {len(data['fields'])} fields; at most {MAX_FIELDS}")
    try:
        return Spec(fields={str(name): _rule(str(name), value) for name, value in data["fields"].items()})
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None


def spec_document(spec: Spec) -> dict[str, Any]:
    """`spec` in the spec file's form (what `parse_spec` reads back to the same Spec)."""
    return {"fields": {name: {rule.kind: rule.expr, "many": rule.many} for name, rule in spec.fields.items()}}


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
