"""A job's items as a file: JSON lines or CSV, streamed from the store in constant memory.

JSONL is one item a line, as `hutch export` always wrote it (non-ASCII kept, control and
bidirectional characters escaped: `terminal.json_text`). CSV has a header row: `url`, then
the job's fields in the order its spec names them, then any other key an item carries (sorted),
found by a first pass over the items (two passes, each streamed: memory holds the column names,
never the items). A list or mapping value is written as JSON in its cell, a missing or null one
as an empty cell. Scraped text is hostile input, and a spreadsheet runs a cell that starts with
`=`, `+`, `-`, `@`, a tab or a carriage return as a formula: such a text cell gets a leading `'`
(numbers are written as they are).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import IO, Any

from hutch.services.control.terminal import json_text
from hutch.store import Store

FORMATS = ("jsonl", "csv")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def columns(store: Store, job: str) -> list[str]:
    """`url`, the spec's fields in order, then every other key seen, sorted."""
    spec = store.job_spec(job) or {}
    named = [str(name) for name in (spec.get("fields") or {})]
    seen: set[str] = set()
    for item in store.items(job):
        seen.update(item)
    rest = sorted(seen - {"url", *named})
    return ["url", *named, *rest]


def cell(value: Any) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_rows(store: Store, job: str) -> Iterator[list[Any]]:
    """The header, then a row an item."""
    names = columns(store, job)
    yield names
    for item in store.items(job):
        yield [cell(item.get(name)) for name in names]


class _Line:
    """A file-like target for csv.writer that keeps the last row written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)


def csv_lines(store: Store, job: str) -> Iterator[str]:
    """The CSV text, a row at a time (RFC 4180: CRLF line ends, quotes where needed)."""
    line = _Line()
    writer = csv.writer(line)
    for row in csv_rows(store, job):
        line.text = ""
        writer.writerow(row)
        yield line.text


def lines(store: Store, job: str, form: str) -> Iterator[str]:
    if form == "csv":
        return csv_lines(store, job)
    return (json_text(item) + "\n" for item in store.items(job))


def write(store: Store, job: str, form: str, out: IO[str]) -> int:
    """Write the job's items to `out` in `form`; how many items."""
    count = -1 if form == "csv" else 0  # the header is not an item
    for text in lines(store, job, form):
        out.write(text)
        count += 1
    return max(count, 0)
