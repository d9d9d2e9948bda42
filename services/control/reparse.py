"""`hutch reparse JOB [--spec FILE] [--follow]`: extract every archived page of a job again,
with a new spec, fetching nothing.

A job whose spec says `archive: true` has its pages' bodies kept by the storer (compressed,
once per content: `Store.archive_page`). Reparsing reads them back and publishes each as a
page to the parsers, as a fetcher would have, with the task's spec replaced: the parsers
extract under their usual limits (time, memory, item size), and the storer writes each item
over the old one (items are keyed by task). Nothing goes to the frontier, so no request is
made. The new spec becomes the job's recorded one.

Without `--follow` the spec's crawl rules are left out, so no link is offered and no page is
admitted; with it, each page's links are offered again, and the ones new to the job (a new
`follow:` rule, a deeper `max_depth`) are admitted and fetched like any others.

Pages are read `BATCH` at a time from the store and published with confirms before the next
batch is read, so memory stays flat however large the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from hutch.amqp import Broker
from hutch.models import Page, Spec, Task
from hutch.store import ArchivedPage, AsyncStore
from hutch.topology import PARSE_KEY

BATCH = 200  # pages read and published at once


@dataclass
class Reparsed:
    job: str
    pages: int  # pages published to the parsers
    archived: int  # pages the archive holds for the job
    tasks: int  # tasks of the job


def without_crawl(spec: Spec) -> Spec:
    """`spec` with no links followed: what a reparse without `--follow` extracts with."""
    return spec.model_copy(update={"follow": [], "max_depth": None, "max_pages": None})


def page_of(archived: ArchivedPage, job: str, spec: Spec) -> Page:
    """The archived page as a fetcher would publish it, its task carrying `spec`."""
    if archived.message is not None:
        task = Task.model_validate_json(archived.message)
    else:
        task = Task(id=archived.task_id, job=job, url=archived.url, domain=archived.domain)
    task = task.model_copy(update={"spec": spec, "permit": None})
    return Page(
        task=task,
        status=archived.status,
        final_url=archived.final_url,
        content_type=archived.content_type,
        text=archived.text,
        fetched_at=archived.fetched_at,
        gzip_body=archived.gzip_body,
    )


async def reparse(
    broker: Broker,
    store: AsyncStore,
    job: str,
    spec: Spec,
    follow: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Reparsed:
    """Publish every archived page of `job` to the parsers with `spec` (crawl rules only
    with `follow`); record `spec` as the job's. Returns what was done."""
    used = spec if follow else without_crawl(spec)
    recorded = spec.model_copy(update={"archive": True})  # its pages are still archived
    await store.run(lambda s: s.add_job(job, recorded.model_dump()))
    archived, _ = await store.run(lambda s: s.archive_counts(job))
    tasks = len(await store.run(lambda s: s.tasks(job)))
    pages = 0
    topology = broker.topology

    # A batch at a time, in task id order (keyset: each read starts after the last id seen),
    # each published before the next is read.
    after = ""
    while True:
        batch = await store.run(lambda s, after=after: s.archived_batch(job, after, BATCH))  # type: ignore[misc]
        if not batch:
            break
        await asyncio.gather(
            *(broker.publish(topology.work, PARSE_KEY, page_of(found, job, used)) for found in batch)
        )
        pages += len(batch)
        after = batch[-1].task_id
        if progress is not None:
            progress(pages)
    return Reparsed(job=job, pages=pages, archived=archived, tasks=tasks)
