"""Submitting a job: validate the URL file, record the tasks in the store, then publish.

The file is read twice, line by line, so memory stays flat for a file of any length: the
first pass refuses the whole file at its first invalid line (or, with `skip_invalid`,
notes the lines it skips), the second records tasks in batches and publishes each batch
with confirms in flight together. A task is recorded (state `new`) before it is published
and marked `queued` once the broker confirmed it, so a submit that dies half-way is
finished by submitting again: recorded-but-unpublished tasks are published then, tasks
already queued or done are not touched, and no URL is ever stored twice (its id is derived
from the job and the URL).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hutch.amqp import Broker
from hutch.crawl import crawl_task_id, is_crawl
from hutch.frontier import publish_new
from hutch.models import MAX_SUBMISSION_URLS, Spec, Submission, Task, task_id
from hutch.store import AsyncStore
from hutch.topology import INTAKE_KEY
from hutch.urls import DEFAULT_MAX_URL_BYTES, InvalidURL, check_url

BATCH = 500
FIRST_BATCH = 32  # tasks recorded and published first (`submit`), so the first fetches start early
LEAD_WINDOW = 5000  # URLs over which each domain's first one goes ahead (`submissions`)
# A job name becomes a file name (`<data dir>/<job>.jsonl`): no separator, no `..`, no control.
JOB_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


class UrlFileError(ValueError):
    """A URL file that cannot be submitted as it is."""


class JobNameError(ValueError):
    """A job name outside the rule of `check_job_name`."""


def check_job_name(name: str) -> str:
    """`name` when it is a valid job name: 1-100 letters, digits, `.`, `_`, `-`, no leading dot."""
    if not JOB_NAME.fullmatch(name):
        raise JobNameError(
            f"invalid job name {name[:120]!r}: use 1 to 100 letters, digits, '.', '_' or '-', not starting with a dot"
        )
    return name


def default_job_name(path: Path) -> str:
    """A valid job name from a URL file's name: its stem, other characters replaced by `-`."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).lstrip(".")[:100]
    return name or "job"


@dataclass
class Checked:
    valid: int = 0
    skipped: list[tuple[int, str, str]] = field(default_factory=list)  # (line, text, why)


@dataclass
class Submitted:
    job: str
    lines: int
    published: int
    already: int  # recorded by an earlier submit of the same job (queued or done)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8-sig") as handle:  # a BOM from a Windows editor is fine
            for number, line in enumerate(handle, 1):
                text = line.strip()
                if text and not text.startswith("#"):
                    yield number, text
    except OSError as exc:
        raise UrlFileError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UrlFileError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def check_urls(path: Path, skip_invalid: bool = False, max_url_bytes: int = DEFAULT_MAX_URL_BYTES) -> Checked:
    """Every line through the URL validator: the first bad one refuses the file, by number."""
    checked = Checked()
    for number, text in _lines(path):
        try:
            check_url(text, max_url_bytes)
        except InvalidURL as exc:
            if not skip_invalid:
                raise UrlFileError(f"{path} line {number}: {exc}") from None
            checked.skipped.append((number, text, str(exc)))
            continue
        checked.valid += 1
    if checked.valid == 0:
        raise UrlFileError(f"{path} holds no valid URL")
    return checked


def valid_urls(path: Path, max_url_bytes: int = DEFAULT_MAX_URL_BYTES) -> Iterator[str]:
    """The lines `check_urls` accepted, as written (`submit` normalises them)."""
    for _, text in _lines(path):
        try:
            check_url(text, max_url_bytes)
        except InvalidURL:
            continue
        yield text


@dataclass
class Sent:
    """What `send` put on the intake queue: URLs (distinct within each message) in how many messages."""

    job: str
    lines: int
    urls: int
    messages: int


def submissions(
    job: str,
    urls: Iterable[str],
    spec: Spec | None,
    tier_floor: str | None = None,
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES,
) -> Iterator[Submission]:
    """`urls` as intake messages of up to `MAX_SUBMISSION_URLS` URLs, each URL checked (an
    invalid one raises InvalidURL) and normalised.

    They are taken `LEAD_WINDOW` at a time, and in each window the first URL of every domain
    goes ahead of the others, which follow in the file's order. The storer records and
    publishes the URLs in the order they come, so in a file sorted by site the last site's
    first fetch (and its robots.txt before it) would otherwise wait for every URL above it to
    be recorded. A URL repeated within a window goes once; repeats across windows are the
    storer's to drop (a task id per job and URL), so memory stays one window's whatever the
    file's length."""
    window: dict[str, str] = {}  # normalised URL -> its domain, in the file's order
    for text in urls:
        checked = check_url(text, max_url_bytes)
        window[checked.url] = checked.domain
        if len(window) >= LEAD_WINDOW:
            yield from _window_messages(job, window, spec, tier_floor)
            window.clear()
    if window:
        yield from _window_messages(job, window, spec, tier_floor)


def _window_messages(
    job: str, window: dict[str, str], spec: Spec | None, tier_floor: str | None
) -> Iterator[Submission]:
    """One window's messages: each domain's first URL, then the others, in the file's order."""
    leaders: dict[str, str] = {}  # domain -> its first URL
    for url, domain in window.items():
        leaders.setdefault(domain, url)
    ordered = [*leaders.values(), *(url for url, domain in window.items() if leaders[domain] != url)]
    for start in range(0, len(ordered), MAX_SUBMISSION_URLS):
        yield Submission(job=job, urls=ordered[start : start + MAX_SUBMISSION_URLS], spec=spec, tier_floor=tier_floor)


async def send(
    broker: Broker,
    job: str,
    urls: Iterator[str],
    spec: Spec | None,
    tier_floor: str | None = None,
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES,
) -> Sent:
    """Submit `urls` as job `job` through the broker alone: `submissions` on the intake queue,
    each confirmed before the next is made. The storer records them and publishes their
    tasks; a URL it already has for the job is not published again."""
    check_job_name(job)
    sent = Sent(job, 0, 0, 0)

    def counted() -> Iterator[str]:
        for text in urls:
            sent.lines += 1
            yield text

    for submission in submissions(job, counted(), spec, tier_floor, max_url_bytes):
        await broker.publish(broker.topology.work, INTAKE_KEY, submission)
        sent.urls += len(submission.urls)
        sent.messages += 1
    return sent


async def submit(
    broker: Broker,
    store: AsyncStore,
    job: str,
    urls: Iterator[str],
    spec: Spec | None,
    progress: Callable[[int], None] | None = None,
    tier_floor: str | None = None,
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES,
) -> Submitted:
    """Record and publish every URL of `urls` as a task of `job`.

    Each task holds its URL as the validator normalised it (the form the fetcher sends, see
    hutch.urls), and its id derives from that form; an invalid URL raises InvalidURL.
    """
    check_job_name(job)
    spec_data = spec.model_dump() if spec else None
    await store.run(lambda s: s.add_job(job, spec_data))
    result = Submitted(job, 0, 0, 0)
    batch: dict[str, Task] = {}
    crawl = is_crawl(spec)  # a crawl admits a URL once by its canonical form (hutch.crawl)

    async def flush() -> None:
        rows = [(t.id, t.job, t.url, t.domain) for t in batch.values()]
        messages = {t.id: t.model_dump_json(exclude_none=True) for t in batch.values()}  # for the reconciler
        # Both writes may be run again: the tasks are recorded once, and only `new` ones marked.
        waiting = await store.run_again_on_conflict(lambda s: s.add_tasks(rows, messages))
        await publish_new(broker, (batch[i] for i in waiting))  # a domain's, a few to a message (hutch.frontier)
        await store.run_again_on_conflict(lambda s: s.mark_queued(waiting))
        result.published += len(waiting)
        result.already += len(batch) - len(waiting)
        if progress is not None:
            progress(len(batch))
        batch.clear()

    for text in urls:
        result.lines += 1
        checked = check_url(text, max_url_bytes)
        url = checked.url
        tid = crawl_task_id(job, url) if crawl else task_id(job, url)
        if tid not in batch:
            batch[tid] = Task(id=tid, job=job, url=url, domain=checked.domain, spec=spec, tier_floor=tier_floor)
        # The first batch is small, so the first tasks (each domain's first, `submissions`)
        # are out while the rest are recorded.
        if len(batch) >= (BATCH if result.published or result.already else FIRST_BATCH):
            await flush()
    if batch:
        await flush()
    return result
