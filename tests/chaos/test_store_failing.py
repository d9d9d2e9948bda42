"""The store refusing every write for a while in the middle of a job, then healed.

A store that cannot write (disk full, read-only, I/O errors) is the store's trouble, not any
message's: the storer must wait or requeue without spending anything, and once the store
heals every item is written. No good item may be dead-lettered because of it, and the
dead-letter ledger, which writes to the same store, must not feed its own failures back to
itself.

How the store is made to fail, from outside the storer and for the storer only: its process
gets a file-size limit of 0 bytes (`RLIMIT_FSIZE`, set with `prlimit` on its pid), so every
write(2) to a regular file fails with EFBIG (Python ignores SIGXFSZ) and SQLite reports a disk
I/O error; lifting the limit heals it. The obvious ways do not work here: a read-only chmod
means nothing to root, `PRAGMA max_page_count` binds only the connection that sets it, and a
full disk does not stop SQLite from overwriting its write-ahead log in place, so writes fail
late or not at all.
"""

from __future__ import annotations

import asyncio
import resource
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings
from hutch.store import sqlite_path

from ..e2e.conftest import Services
from .conftest import check_job, submit_job, wait_for_progress

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.e2e,
    pytest.mark.timeout(150),
]

FAILING_SECONDS = 8.0


@contextmanager
def writes_refused(pid: int) -> Iterator[None]:
    """While inside, process `pid` cannot write a byte to any regular file."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        except ProcessLookupError:
            pass  # it died; its successor starts without the limit


def stored_count(settings: Settings, job: str) -> int:
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COUNT(*) FROM items WHERE job = ?", (job,)).fetchone()[0])
    finally:
        db.close()


def dead_letters(settings: Settings) -> list[tuple[str | None, str, str]]:
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        return [tuple(row) for row in db.execute("SELECT url, stage, reason FROM dead")]
    finally:
        db.close()


def missing_fetched(sandbox: Sandbox) -> list[str]:
    return [r.path for r in sandbox.site_log("north") if r.path.startswith("/status/404")]


async def test_a_store_refusing_writes_for_a_while_delays_the_job_but_dead_letters_no_good_item(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.urls()
    missing = [sandbox.sites["north"].base_url + f"/status/404?n={i}" for i in range(8)]
    await submit_job(settings, "failing", urls)
    await wait_for_progress(services, "failing", stored=len(urls) // 6)
    storer = services.supervisor.child("storer")
    assert storer.process is not None
    with writes_refused(storer.process.pid):
        await asyncio.sleep(1.0)  # a write that began before has ended
        frozen = stored_count(settings, "failing")
        # Dead at once: the ledger has dead letters to write while the store refuses them.
        await submit_job(settings, "failing", missing)
        await asyncio.sleep(FAILING_SECONDS)
        for _ in range(100):  # up to 20 s more, should north's backlog be slow
            if len(missing_fetched(sandbox)) >= len(missing):
                break
            await asyncio.sleep(0.2)
        assert stored_count(settings, "failing") == frozen, "items were written: the store did not fail"
        assert len(missing_fetched(sandbox)) >= len(missing), "the 404s were not fetched while the store failed"
        assert storer.restarts == 0
    await services.wait_done("failing", timeout=100)
    counts = check_job(settings, sandbox, "failing", urls + missing)
    letters = dead_letters(settings)
    # Nothing was dead-lettered by the store stage: not an item, not a dead letter of the ledger.
    assert [x for x in letters if x[1] == "store"] == []
    # The pages died only of their sites' faults (at the fetch stage); the 404s died as such.
    assert {url for url, _, _ in letters} >= set(missing)
    assert all(stage == "fetch" for url, stage, _ in letters if url not in missing), letters
    assert counts.dead == len({url for url, _, _ in letters})
    assert counts.stored > len(urls) * 0.9, counts
