"""`hutch export JOB --format jsonl|csv`: every item, streamed, in either form."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from hutch.models import Item, Task, task_id
from hutch.settings import Settings
from hutch.store import Store

SPEC = {"fields": {"title": {"kind": "css", "expr": "h1::text"}, "tags": {"kind": "css", "expr": "li", "many": True}}}


def fill(store: Store) -> list[str]:
    store.add_job("shop", SPEC)
    urls = [f"http://shop.test/p/{n}" for n in range(5)]
    values = [
        {"title": "Plain", "tags": ["a", "b"]},
        {"title": '=HYPERLINK("http://evil.test")', "tags": []},  # a formula, scraped
        {"title": 'line\nbreak, "quoted"', "tags": None, "price": 12.5},  # another key, multi-line
        {"title": "-5 off", "tags": ["x"]},
        {"title": "Zürich ☃", "tags": ["@home"]},
    ]
    for url, fields in zip(urls, values, strict=True):
        task = Task(id=task_id("shop", url), job="shop", url=url, domain="shop.test")
        store.add_tasks([(task.id, task.job, task.url, task.domain)])
        store.store_item(Item(task=task, status=200, fields=fields, parsed_at=1.0))
    return urls


def export(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("hutch")), "export", "shop", *args],
        env=settings.to_env(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_csv_has_url_then_the_spec_fields_then_other_keys_and_defuses_formulas(
    settings: Settings, tmp_path: Path
) -> None:
    store = Store(settings.store_location)
    try:
        urls = fill(store)
    finally:
        store.close()
    out = tmp_path / "items.csv"  # the suffix picks CSV
    done = export(settings, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "exported 5 items" in done.stderr and "(csv)" in done.stderr
    rows = list(csv.reader(io.StringIO(out.read_text(encoding="utf-8"), newline="")))
    assert rows[0] == ["url", "title", "tags", "price"]
    by_url = {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert sorted(by_url) == sorted(urls)
    assert by_url[urls[0]]["tags"] == '["a","b"]'
    assert by_url[urls[1]]["title"] == '\'=HYPERLINK("http://evil.test")'
    assert by_url[urls[2]]["title"] == 'line\nbreak, "quoted"' and by_url[urls[2]]["price"] == "12.5"
    assert by_url[urls[2]]["tags"] == "" and by_url[urls[0]]["price"] == ""
    assert by_url[urls[3]]["title"] == "'-5 off" and by_url[urls[4]]["tags"] == '["@home"]'
    assert by_url[urls[4]]["title"] == "Zürich ☃"


def test_jsonl_stays_the_default_one_item_a_line(settings: Settings) -> None:
    store = Store(settings.store_location)
    try:
        urls = fill(store)
    finally:
        store.close()
    done = export(settings)
    assert done.returncode == 0, done.stderr
    items = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(item["url"] for item in items) == sorted(urls)
    assert {item["url"]: item for item in items}[urls[1]]["title"] == '=HYPERLINK("http://evil.test")'
    assert export(settings, "--format", "xml").returncode == 2
