"""Hostile answers: page structure that makes extraction costly. See the package docstring.

Both are small on the wire and valid HTML; the trouble is in what a spec does with them.

- `deep-nesting?depth=N` (default 5,000): N nested `<div>`s. `{css: div, many: true}` returns
  every div with all its descendants, about 11 x depth² / 2 bytes: 25 MB from 60 KB. lxml
  (libxml2's HTML parser) keeps about 2,000 levels and drops deeper elements without an
  error, so the page parses, and the item cap, not the parser, is what stops it.
- `quadratic?elements=N` (default 100,000, about 1.3 MB): N sibling elements whose text starts
  alike. `//*[.=//*]` compares each element's text with every other's: minutes of libxml2 time
  in one call, which only the parser's time limit ends.
"""

from __future__ import annotations

from hutch_sandbox.hostile import route
from hutch_sandbox.site import HTML, Outcome, Reply

MAX_DEPTH = 100_000
MAX_ELEMENTS = 400_000


def _bounded(query: dict[str, str], name: str, default: int, most: int) -> int:
    value = int(query.get(name, str(default)))
    if not 1 <= value <= most:
        raise ValueError(f"{name} must be between 1 and {most}")
    return value


@route("deep-nesting")
def deep_nesting(query: dict[str, str]) -> Outcome:
    depth = _bounded(query, "depth", 5_000, MAX_DEPTH)
    html = (
        "<!DOCTYPE html>\n<html><head><title>deep</title></head><body>"
        + "<div>x" * depth
        + "</div>" * depth
        + "</body></html>\n"
    )
    return Reply(200, html.encode("utf-8"), HTML)


@route("quadratic")
def quadratic(query: dict[str, str]) -> Outcome:
    elements = _bounded(query, "elements", 100_000, MAX_ELEMENTS)
    items = "".join(f"<i>aa{i}</i>" for i in range(elements))
    html = f"<!DOCTYPE html>\n<html><head><title>quadratic</title></head><body>{items}</body></html>\n"
    return Reply(200, html.encode("utf-8"), HTML)
