"""The store's disk full for a while in the middle of a job, then freed.

A full disk is the store's trouble, not any message's: the storer must wait or requeue without
spending anything, and once the disk has room every item is written. No good item may be
dead-lettered because of it, and the dead-letter ledger, which writes to the same store, must
not feed its own failures back to itself. The store lives on a small tmpfs of the test's own,
filled to the last byte by a filler file (SQLite then answers "database or disk is full")
and freed by deleting that file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.sandbox import Sandbox
from hutch.settings import Settings
from hutch.store import sqlite_path

from .conftest import Services, check_job, submit_job, wait_for_progress

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.e2e,
    pytest.mark.timeout(150),
    pytest.mark.xfail(reason="needs storer storage-error handling (h-store)", strict=False),
]

FULL_SECONDS = 8.0


class SmallDisk:
    """A tmpfs of a few MiB at `path` that `fill()` makes full and `free()` frees."""

    def __init__(self, path: Path, size_mib: int = 16) -> None:
        self.path = path
        self.size_mib = size_mib
        self.filler = path / "filler"

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m,mode=0700", "tmpfs", str(self.path)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for the store: {done.stderr.strip()}")

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30, check=False)

    def fill(self) -> int:
        """Write zeros until the disk refuses a byte more; returns the bytes written."""
        written = 0
        with self.filler.open("wb", buffering=0) as out:
            for size in (1 << 20, 4096, 1):
                chunk = bytes(size)
                while True:
                    try:
                        written += out.write(chunk) or 0
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "data")
    disk.mount()
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.fixture
def settings(settings: Settings, disk: SmallDisk) -> Settings:
    assert settings.data_dir == disk.path  # the store is created on the small disk
    return settings


def stored_count(settings: Settings, job: str) -> int:
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COUNT(*) FROM items WHERE job = ?", (job,)).fetchone()[0])
    finally:
        db.close()


def dead_letters(settings: Settings) -> list[tuple[str | None, str, str]]:
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        return [tuple(row) for row in db.execute("SELECT url, stage, reason FROM dead")]  # type: ignore[misc]
    finally:
        db.close()


def missing_fetched(sandbox: Sandbox) -> list[str]:
    return [r.path for r in sandbox.site_log("north") if r.path.startswith("/status/404")]


async def test_a_full_store_disk_delays_the_job_but_dead_letters_no_good_item(
    settings: Settings, sandbox: Sandbox, disk: SmallDisk, services: Services
) -> None:
    urls = sandbox.urls()
    base = sandbox.sites["north"].base_url
    # Dead at once, and queued behind north's pages: fetched while the disk is full, so the
    # ledger has dead letters to write then.
    missing = [f"{base}/status/404?n={i}" for i in range(8)]
    await submit_job(settings, "full", urls + missing)
    await wait_for_progress(services, "full", stored=len(urls) // 6)
    assert await asyncio.to_thread(disk.fill) > 0
    try:
        await asyncio.sleep(1.0)  # writes that began before the disk filled have ended
        frozen = stored_count(settings, "full")
        for _ in range(150):  # up to 30 s
            if len(missing_fetched(sandbox)) >= len(missing):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(FULL_SECONDS)
        assert stored_count(settings, "full") == frozen, "items were written to a full disk: nothing failed"
        assert len(missing_fetched(sandbox)) >= len(missing), "the 404s were not fetched while the disk was full"
    finally:
        with contextlib.suppress(OSError):
            disk.free()
    await services.wait_done("full", timeout=100)
    counts = check_job(settings, sandbox, "full", urls + missing)
    letters = dead_letters(settings)
    # Nothing was dead-lettered by the store stage: not an item, not a dead letter of the ledger.
    assert [x for x in letters if x[1] == "store"] == []
    # The pages died only of their sites' faults (at the fetch stage); the 404s died as such.
    assert {url for url, _, _ in letters} >= set(missing)
    assert all(stage == "fetch" for url, stage, _ in letters if url not in missing), letters
    assert counts.dead == len({url for url, _, _ in letters})
    assert counts.stored > len(urls) * 0.9, counts
