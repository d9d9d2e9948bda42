"""Extraction: a page and a spec in, a dict of fields out. Pure and CPU-bound.

It runs in worker threads (see app.py) so a large page never blocks the event loop and
with it the connection's heartbeats. Without a spec the item is `url`, `status`, `title`.
"""

from __future__ import annotations

from typing import Any

from parsel import Selector

from hutch.models import Spec


def extract(text: str, url: str, status: int, spec: Spec | None) -> dict[str, Any]:
    selector = Selector(text=text, base_url=url)
    if spec is None:
        title = selector.css("title::text").get()
        return {"url": url, "status": status, "title": title.strip() if title else None}
    fields: dict[str, Any] = {}
    for name, rule in spec.fields.items():
        found = selector.css(rule.expr) if rule.kind == "css" else selector.xpath(rule.expr)
        if rule.many:
            fields[name] = [value.strip() for value in found.getall()]
        else:
            value = found.get()
            fields[name] = value.strip() if isinstance(value, str) else value
    return fields
