"""`hutch trace` shows a task's whole life from the store, with no trace exporter configured:
a page that fails twice with a 500 and is then stored has five rows, in order, each with the
task's one trace id."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hutch_sandbox import Sandbox

from hutch.models import task_id
from hutch.settings import Settings

from ..conftest import service_env
from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HUTCH = str(Path(sys.executable).parent / "hutch")


async def hutch(settings: Settings, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        HUTCH, *args, env=service_env(settings), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_task_retried_twice_then_stored_shows_every_step_in_one_trace(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    url = f"{sandbox.sites['alpha'].base_url}/flaky/traced?fail=2&code=500"
    await submit_urls(settings, "timeline", [url])
    counts = await services.wait_done("timeline", timeout=60)
    assert counts.stored == 1

    code, out, err = await hutch(settings, "trace", "--job", "timeline", "--url", url, "--json")
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)
    rows = shown["timeline"]
    assert [(r["service"].split()[0], r["outcome"]) for r in rows] == [
        ("control", "submitted"),
        ("fetcher", "server_error"),
        ("fetcher", "server_error"),
        ("fetcher", "ok"),
        ("storer", "stored"),
    ]
    attempts = rows[1:4]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["status"] for a in attempts] == [500, 500, 200]
    assert [a["next"] for a in attempts] == ["retry", "retry", "parse"]
    assert attempts[0]["delay"] > 0 and attempts[1]["delay"] > 0 and attempts[2]["delay"] is None
    assert all(a["service"].startswith("fetcher ") for a in attempts)  # which fetcher, by its instance id
    assert all(a["span_id"] is None for a in attempts)  # no exporter: no spans, the trace id still
    traces = {r["trace_id"] for r in rows}
    assert len(traces) == 1 and re.fullmatch(r"[0-9a-f]{32}", traces.pop())
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    assert shown["task"]["id"] == task_id("timeline", url) and shown["task"]["state"] == "stored"

    # The table a person reads: the same rows, by the task's id.
    code, out, err = await hutch(settings, "trace", task_id("timeline", url))
    assert code == 0, err
    lines = out.splitlines()
    assert "stored after 3 attempt(s)" in lines[0]
    assert sum("server_error" in line for line in lines) == 2

    code, _, err = await hutch(settings, "trace", "0" * 32)
    assert code == 2 and "no task 00000000000000000000000000000000" in err
