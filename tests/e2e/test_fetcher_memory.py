"""The fetcher's memory while it fetches a 2 GiB gzip bomb (about 2 MiB on the wire).

The peak resident set of the fetcher process (`VmHWM` in /proc/<pid>/status, the high-water
mark over its whole life) must stay under 256 MiB, and the task must end dead `too_large`
with nothing pending. The same job holds the stacked bomb (2 GiB of zeros, gzip inside gzip,
5 KiB on the wire): decoded a network chunk at a time, as httpx's own decoders do, it took a
process to about 300 MiB before the cap could look; a bomb made for it takes all it has.
The figures are printed (run with -s to see them); no timing is asserted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(150),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/<pid>/status"),
]
LIMIT = 256 * 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's peak resident memory in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


async def test_the_fetcher_stays_under_256_mib_while_2_gib_gzip_bombs_go_dead_too_large(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    process = services.supervisor.child("fetcher.1").process
    assert process is not None
    before = peak_rss(process.pid)
    base = sandbox.sites["alpha"].base_url
    urls = [base + "/hostile/gzip-bomb?gib=2", base + "/hostile/stacked-bomb?gib=2"]
    started = time.monotonic()
    await submit_urls(settings, "bomb", urls)
    counts = await services.wait_done("bomb", timeout=90)
    took = time.monotonic() - started
    after = peak_rss(process.pid)
    assert services.supervisor.child("fetcher.1").process is process  # the same process, alive
    print(f"\n2 GiB gzip and stacked bombs: job done in {took:.2f}s; fetcher peak RSS "
          f"{before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB after")
    assert counts.pending == 0 and counts.dead == 2, counts
    store = Store(settings.store_location)
    try:
        dead = store.dead_entries(job="bomb")
    finally:
        store.close()
    assert sorted(d["url"] for d in dead) == sorted(urls)
    assert {d["reason"] for d in dead} == {"too_large"}
    assert after < LIMIT
