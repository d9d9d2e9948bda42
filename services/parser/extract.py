"""Extraction: a page and a spec in, a dict of fields out. Pure and CPU-bound.

It runs in the parser's worker processes (see pool.py), which put a time limit on it; this
module bounds what it produces. A spec picks the output, and `{css: div, many: true}` on a
page of deeply nested divs returns every div with all of its descendants: thousands of times
the page. So the output is counted as it is built, in bytes of its JSON, and extraction stops
with `ItemTooLarge` as soon as it passes `max_bytes`, before a huge list exists.

Without a spec the item is `url`, `status`, `title`.
"""

from __future__ import annotations

import json
from typing import Any

from parsel import Selector

from hutch.models import Spec


class ItemTooLarge(Exception):
    """The item's JSON would pass the per-item byte cap."""


def _json_size(value: Any) -> int:
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


def extract(text: str, url: str, status: int, spec: Spec | None, max_bytes: int | None = None) -> dict[str, Any]:
    """The item of one page; `ItemTooLarge` when its JSON would pass `max_bytes`."""
    budget = _Budget(max_bytes)
    selector = Selector(text=text, base_url=url)
    if spec is None:
        title = selector.css("title::text").get()
        fields: dict[str, Any] = {"url": url, "status": status, "title": title.strip() if title else None}
        budget.spend(fields)
        return fields
    fields = {}
    for name, rule in spec.fields.items():
        budget.spend(name)
        found = selector.css(rule.expr) if rule.kind == "css" else selector.xpath(rule.expr)
        if rule.many:
            values: list[Any] = []
            for match in found:  # one match at a time: the cap holds before the list is whole
                value = match.get()
                value = value.strip() if isinstance(value, str) else value
                budget.spend(value)
                values.append(value)
            fields[name] = values
        else:
            value = found.get()
            fields[name] = value.strip() if isinstance(value, str) else value
            budget.spend(fields[name])
    return fields
