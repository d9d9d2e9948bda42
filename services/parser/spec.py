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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from parsel import Selector
from parsel.csstranslator import HTMLTranslator

from hutch.models import FieldRule, Spec

DEFAULT_FIELDS = ("url", "status", "title")
_TRANSLATOR = HTMLTranslator()


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file and field."""


def _rule(name: str, value: Any) -> FieldRule:
    many = False
    if isinstance(value, dict):
        extra = set(value) - {"css", "xpath", "many"}
        kinds = [kind for kind in ("css", "xpath") if kind in value]
        if extra or len(kinds) != 1:
            raise SpecError(f"field {name!r}: give exactly one of css: or xpath: (and optionally many:)")
        kind, expr, many = kinds[0], value[kinds[0]], value.get("many", False)
        if not isinstance(many, bool):
            raise SpecError(f"field {name!r}: many: must be true or false, got {many!r}")
    elif isinstance(value, str):
        kind, sep, expr = value.partition(":")
        if not sep or kind not in ("css", "xpath"):
            raise SpecError(
                f"field {name!r}: unknown selector kind in {value!r}; use css:SELECTOR or xpath:EXPR"
            )
    else:
        raise SpecError(f"field {name!r}: expected 'css:...' or 'xpath:...', got {type(value).__name__}")
    if not isinstance(expr, str) or not expr.strip():
        raise SpecError(f"field {name!r}: empty selector")
    try:
        if kind == "css":
            _TRANSLATOR.css_to_xpath(expr)
        else:
            Selector(text="<html/>").xpath(expr)
    except Exception as exc:
        raise SpecError(f"field {name!r}: broken {kind} selector {expr!r}: {exc}") from None
    return FieldRule(kind=kind, expr=expr, many=many)  # type: ignore[arg-type]


def parse_spec(data: Any, source: str = "spec") -> Spec:
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict) or not data["fields"]:
        raise SpecError(f"{source}: expected a mapping with a non-empty 'fields:' mapping")
    unknown = set(data) - {"fields"}
    if unknown:
        raise SpecError(f"{source}: unknown keys {sorted(unknown)}")
    try:
        return Spec(fields={str(name): _rule(str(name), value) for name, value in data["fields"].items()})
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None


def load_spec(path: str | Path) -> Spec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_spec(data, str(path))
