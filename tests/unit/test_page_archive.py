"""The page archive (Store.archive_page, archived_batch, expire_archive), on each backend."""

from __future__ import annotations

import base64
import gzip
from collections.abc import Iterator

import pytest

from hutch.models import Page, Task
from hutch.services.control.reparse import page_of, without_crawl
from hutch.services.parser.spec import parse_spec, spec_document
from hutch.store import Store

JOB = "kept"


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    s = Store(store_location)
    yield s
    s.close()


def page(n: int, text: str, at: float = 100.0) -> Page:
    task = Task(id=f"t{n:03d}", job=JOB, url=f"http://site.test/{n}", domain="site.test")
    return Page(task=task, status=200, final_url=task.url, content_type="text/html", text=text, fetched_at=at)


def record(store: Store, *pages: Page) -> None:
    rows = [(p.task.id, JOB, p.task.url, p.task.domain) for p in pages]
    store.add_tasks(rows, {p.task.id: p.task.model_dump_json() for p in pages})
    for p in pages:
        store.archive_page(p)


def test_bodies_are_kept_once_per_content_and_read_back_whole(store: Store) -> None:
    same = "<html><title>same</title>" + "x" * 10_000 + "</html>"
    record(store, page(1, same), page(2, same), page(3, "<title>é ünïcode \U0001f600</title>"))
    assert store.archive_counts(JOB) == (3, 2)
    size = store.db.execute("SELECT SUM(LENGTH(body)) FROM bodies").fetchone()[0]
    assert size < 1_000  # compressed
    found = store.archived_batch(JOB, "", 10)
    texts = [(p.task_id, p.text) for p in found]
    assert texts == [("t001", same), ("t002", same), ("t003", "<title>é ünïcode \U0001f600</title>")]


def test_a_gzip_file_is_kept_as_its_bytes_and_read_back_as_the_page_carried_it(store: Store) -> None:
    """A crawl's `sitemap.xml.gz` reaches the storer as `gzip_body` with no text: the archive
    keeps those bytes, and a reparse's page carries them again for the parser to inflate."""
    sitemap = b'<?xml version="1.0"?><urlset><url><loc>http://site.test/1</loc></url></urlset>'
    encoded = base64.b64encode(gzip.compress(sitemap)).decode("ascii")
    gz = page(1, "").model_copy(update={"gzip_body": encoded, "content_type": "application/gzip"})
    record(store, gz, page(2, "<title>2</title>"))
    first, second = store.archived_batch(JOB, "", 10)
    assert (first.text, first.gzip_body) == ("", encoded)
    assert gzip.decompress(base64.b64decode(first.gzip_body or "")) == sitemap
    assert (second.text, second.gzip_body) == ("<title>2</title>", None)
    again = page_of(first, JOB, parse_spec({"fields": {"t": "css:title::text"}}))
    assert again.gzip_body == encoded and again.text == ""


def test_the_archive_is_read_a_batch_at_a_time_in_task_order(store: Store) -> None:
    record(store, *(page(n, f"<title>{n}</title>") for n in range(7)))
    first = store.archived_batch(JOB, "", 3)
    second = store.archived_batch(JOB, first[-1].task_id, 3)
    third = store.archived_batch(JOB, second[-1].task_id, 3)
    assert [p.task_id for p in first + second + third] == [f"t{n:03d}" for n in range(7)]
    assert store.archived_batch(JOB, third[-1].task_id, 3) == []


def test_a_page_fetched_again_replaces_the_older_one_never_the_other_way(store: Store) -> None:
    record(store, page(1, "old", at=100.0))
    store.archive_page(page(1, "new", at=200.0))
    store.archive_page(page(1, "late copy of an older fetch", at=150.0))
    (found,) = store.archived_batch(JOB, "", 10)
    assert found.text == "new"
    # The replaced body went with it; the late copy's, written and replaced in turn, too.
    assert store.db.execute("SELECT COUNT(*) FROM bodies").fetchone()[0] == 1


def test_expiry_drops_old_pages_and_the_bodies_no_page_names(store: Store) -> None:
    record(store, page(1, "a", at=100.0), page(2, "b", at=300.0))
    assert store.expire_archive(before=200.0) == 1
    assert store.archive_counts(JOB) == (1, 1)
    assert store.db.execute("SELECT COUNT(*) FROM bodies").fetchone()[0] == 1
    gone = store.delete_job(JOB)
    assert gone is not None and gone["pages"] == 1
    assert store.db.execute("SELECT COUNT(*) FROM bodies").fetchone()[0] == 0


def test_a_reparsed_page_carries_the_new_spec_and_no_crawl_rules_unless_asked(store: Store) -> None:
    record(store, page(1, "<title>t</title>"))
    spec = parse_spec({"fields": {"h": "css:h1::text"}, "follow": [{"links": "css:a::attr(href)"}], "max_depth": 1})
    (archived,) = store.archived_batch(JOB, "", 1)
    again = page_of(archived, JOB, without_crawl(spec))
    assert again.task.spec is not None and again.task.spec.follow == [] and "h" in again.task.spec.fields
    assert again.task.id == "t001" and again.text == "<title>t</title>" and again.task.permit is None


def test_archive_is_a_spec_key_that_reads_back() -> None:
    spec = parse_spec({"fields": {"t": "css:title"}, "archive": True})
    assert spec.archive and parse_spec(spec_document(spec)) == spec
