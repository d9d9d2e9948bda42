"""A crawl's identities: which task a URL found on a page, or submitted to a crawl, becomes.

In a crawl (a job whose spec has `follow:`) a URL is admitted at most once per job by its
canonical form (`hutch.urls.canonical_url`), so its task id comes from that form, submitted or
found: `http://site/b?x=1&y=2` and `HTTP://site:80/b?y=2&x=1#top` are one task. A job without
`follow:` keeps the ids of the URL as checked, as it always had.

Links arrive from the parser over the broker, so they are checked here again, with the same
bounds as a submitted URL, before the storer admits any.
"""

from __future__ import annotations

from hutch.models import Spec, task_id
from hutch.store import Link
from hutch.urls import InvalidURL, canonical_url, check_url


def is_crawl(spec: Spec | None) -> bool:
    return spec is not None and bool(spec.follow)


def crawl_task_id(job: str, url: str) -> str:
    """The task id of `url` (as `check_url` returned it) in the crawl `job`."""
    return task_id(job, canonical_url(url))


def crawl_links(job: str, links: list[str], max_url_bytes: int, limit: int) -> list[Link]:
    """`links` as the storer admits them: (id, URL, domain), each valid, once, at most `limit`."""
    found: dict[str, Link] = {}
    for text in links:
        if len(found) >= limit:
            break
        try:
            checked = check_url(text, max_url_bytes)
        except InvalidURL:
            continue
        link_id = crawl_task_id(job, checked.url)
        found.setdefault(link_id, (link_id, checked.url, checked.domain))
    return list(found.values())
