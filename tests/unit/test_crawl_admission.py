"""The storer's admission of a crawl's links (Store.admit_links), on each store backend.

Each test plays the storer: a page of the crawl is stored with the links its parser found,
and what the store admits (tasks to publish, depths, counts) is checked against what a
breadth-first walk of the same links gives.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hutch.crawl import crawl_links, crawl_task_id
from hutch.models import FieldRule, FollowRule, Item, Spec, Task
from hutch.services.api.routes import status_of
from hutch.store import CrawlLimits, Link, Store

JOB = "crawl"
SPEC = Spec(
    fields={"title": FieldRule(kind="css", expr="title::text")},
    follow=[FollowRule(links=FieldRule(kind="css", expr="a::attr(href)"))],
)


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    s = Store(store_location)
    yield s
    s.close()


def url(name: str) -> str:
    return f"http://site.test/{name}"


def links(*names: str) -> list[Link]:
    return crawl_links(JOB, [url(n) for n in names], 8192, 1000)


def seed(store: Store, *names: str) -> list[Task]:
    tasks = [Task(id=crawl_task_id(JOB, url(n)), job=JOB, url=url(n), domain="site.test", spec=SPEC) for n in names]
    store.add_job(JOB, SPEC.model_dump())
    store.add_tasks([(t.id, t.job, t.url, t.domain) for t in tasks], {t.id: t.model_dump_json() for t in tasks})
    store.mark_queued([t.id for t in tasks])
    return tasks


def task_of(store: Store, name: str) -> Task:
    row = store.db.execute("SELECT message FROM tasks WHERE id = ?", (crawl_task_id(JOB, url(name)),)).fetchone()
    return Task.model_validate_json(row[0])


def crawl(store: Store, task: Task, found: list[Link], limits: CrawlLimits) -> list[str]:
    """Store the page's item and admit its links, as the storer does; the URLs admitted."""
    store.store_item(Item(task=task, status=200, fields={}, parsed_at=0.0, links=[link[1] for link in found]))
    admitted = store.admit_links(task, found, limits)
    store.mark_queued([t.id for t in admitted])
    return sorted(t.url for t in admitted)


def depth_of(store: Store, name: str) -> int | None:
    row = store.db.execute("SELECT depth FROM tasks WHERE id = ?", (crawl_task_id(JOB, url(name)),)).fetchone()
    return None if row is None else row[0]


def test_links_spelled_differently_are_admitted_once_at_the_next_depth(store: Store) -> None:
    (root,) = seed(store, "")
    found = crawl_links(
        JOB,
        [url("a?x=1&y=2"), "HTTP://SITE.test:80/a?y=2&x=1#top", url("b/../a?x=1&y=2"), url("c")],
        8192,
        1000,
    )
    assert len(found) == 2  # one page spelled three ways, and c
    assert crawl(store, root, found, CrawlLimits(2, 100)) == [url("a?x=1&y=2"), url("c")]
    assert depth_of(store, "a?x=1&y=2") == 1
    counts = store.crawl_counts(JOB)
    assert counts == {"discovered": 2, "admitted": 3, "duplicates": 0, "over_depth": 0, "over_pages": 0, "depth": 1}


def test_a_page_offered_again_admits_nothing_new_and_counts_nothing_twice(store: Store) -> None:
    (root,) = seed(store, "")
    found = links("a", "b")
    assert crawl(store, root, found, CrawlLimits(None, 100)) == [url("a"), url("b")]
    before = store.crawl_counts(JOB)
    assert crawl(store, root, found, CrawlLimits(None, 100)) == []  # redelivered, all published
    assert store.crawl_counts(JOB) == before


def test_a_redelivered_page_returns_the_children_recorded_but_never_published(store: Store) -> None:
    (root,) = seed(store, "")
    found = links("a", "b")
    store.store_item(Item(task=root, status=200, fields={}, parsed_at=0.0, links=[x[1] for x in found]))
    first = store.admit_links(root, found, CrawlLimits(None, 100))
    assert sorted(t.url for t in first) == [url("a"), url("b")]
    # The storer stopped before publishing: the item comes again, and the same two are offered.
    again = store.admit_links(root, found, CrawlLimits(None, 100))
    assert sorted(t.url for t in again) == [url("a"), url("b")]
    assert all(t.spec == SPEC for t in again)
    assert store.crawl_counts(JOB)["discovered"] == 2  # type: ignore[index]


def test_links_past_max_depth_are_counted_not_admitted(store: Store) -> None:
    (root,) = seed(store, "")
    assert crawl(store, root, links("a"), CrawlLimits(1, 100)) == [url("a")]
    assert crawl(store, task_of(store, "a"), links("b", "c"), CrawlLimits(1, 100)) == []
    counts = store.crawl_counts(JOB)
    assert counts is not None and counts["over_depth"] == 2 and counts["depth"] == 1


def test_the_job_never_has_more_than_max_pages_tasks_its_submitted_urls_included(store: Store) -> None:
    (root,) = seed(store, "")
    assert crawl(store, root, links("a", "b", "c", "d"), CrawlLimits(None, 3)) == [url("a"), url("b")]
    assert crawl(store, task_of(store, "a"), links("e"), CrawlLimits(None, 3)) == []
    counts = store.crawl_counts(JOB)
    assert counts is not None and (counts["admitted"], counts["over_pages"]) == (3, 3)
    assert len(store.tasks(JOB)) == 3


def test_a_page_found_closer_later_has_its_links_followed_from_there(store: Store) -> None:
    """root -> a -> a2 -> b puts b at depth 3, where its link c is past max_depth 3. Then a
    submitted URL's page (depth 0) offers b: b is at 1, and c is admitted at 2, as a
    breadth-first walk would have it."""
    (root,) = seed(store, "")
    limits = CrawlLimits(3, 100)
    assert crawl(store, root, links("a"), limits) == [url("a")]
    assert crawl(store, task_of(store, "a"), links("a2"), limits) == [url("a2")]
    assert crawl(store, task_of(store, "a2"), links("b"), limits) == [url("b")]
    assert crawl(store, task_of(store, "b"), links("c"), limits) == []  # b at 3: c would be 4
    assert depth_of(store, "b") == 3 and depth_of(store, "c") is None
    # The root's page offers b again (say its item came late): b is at 1, and c admitted at 2.
    late = Task(id=crawl_task_id(JOB, url("late")), job=JOB, url=url("late"), domain="site.test", spec=SPEC)
    seed(store, "late")
    assert crawl(store, late, links("b"), limits) == [url("c")]
    assert (depth_of(store, "b"), depth_of(store, "c")) == (1, 2)
    assert crawl(store, late, links("b"), limits) == []  # and only once


def test_a_page_reparsed_with_other_links_records_them_and_a_closer_find_reoffers_those(store: Store) -> None:
    """A reparse with a new `follow:` rule offers page a's links again, now with d: d is
    admitted and counted, and a's recorded links are the new ones, so when a is later found
    closer, d (not only the old b) is offered one step further."""
    (root,) = seed(store, "")
    limits = CrawlLimits(None, 100)
    assert crawl(store, root, links("x"), limits) == [url("x")]
    assert crawl(store, task_of(store, "x"), links("a"), limits) == [url("a")]
    a = task_of(store, "a")  # depth 2
    assert crawl(store, a, links("b"), limits) == [url("b")]
    discovered = store.crawl_counts(JOB)["discovered"]  # type: ignore[index]
    assert crawl(store, a, links("b", "d"), limits) == [url("d")]  # the reparse's rules find d too
    assert store.crawl_counts(JOB)["discovered"] == discovered + 2  # type: ignore[index]
    assert (depth_of(store, "b"), depth_of(store, "d")) == (3, 3)
    seed(store, "late")
    late = task_of(store, "late")
    assert crawl(store, late, links("a"), limits) == []
    assert (depth_of(store, "a"), depth_of(store, "b"), depth_of(store, "d")) == (1, 2, 2)


def test_a_submitted_url_found_on_a_page_stays_at_depth_0(store: Store) -> None:
    root, other = seed(store, "", "other")
    assert crawl(store, root, links("other", "a"), CrawlLimits(None, 100)) == [url("a")]
    assert depth_of(store, "other") is None  # a submitted URL: depth 0
    assert store.crawl_counts(JOB)["duplicates"] == 1  # type: ignore[index]
    assert other.id == crawl_task_id(JOB, url("other"))


def test_crawl_links_are_checked_again_and_capped(store: Store) -> None:
    found = crawl_links(JOB, ["javascript:void(0)", "http://", url("a"), url("a#x"), url("b"), url("c")], 8192, 2)
    assert [link[1] for link in found] == [url("a"), url("b")]


def test_status_counts_carry_the_crawl(store: Store) -> None:
    (root,) = seed(store, "")
    crawl(store, root, links("a"), CrawlLimits(None, 100))
    (row,) = store.counts(JOB)
    assert row.crawl is not None and row.crawl["admitted"] == 2
    assert status_of(row).crawl == row.crawl  # the API's /jobs/{job} carries them too
    assert store.delete_job(JOB) is not None
    assert store.crawl_counts(JOB) is None
