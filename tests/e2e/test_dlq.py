"""`hutch dlq`: dead letters listed by reason and domain, inspected, replayed and purged."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox

from hutch.settings import Settings

from .conftest import Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def hutch(settings: Settings, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from hutch.services.control.cli import main; main()",
        *args,
        env=settings.to_env(os.environ),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_dead_letters_are_listed_shown_replayed_after_healing_and_purged(
    settings: Settings, sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    alpha, beta = sandbox.sites["alpha"], sandbox.sites["beta"]
    urls = [
        alpha.base_url + "/status/404",
        beta.base_url + "/status/404",
        alpha.base_url + "/flaky/dlq?fail=3&code=500",  # exhausts 3 attempts, then heals
        *sandbox.sites["delta"].urls()[:3],
    ]
    urls_file = tmp_path / "urls.txt"
    urls_file.write_text("\n".join(urls) + "\n")
    code, _, err = await hutch(settings, "submit", str(urls_file), "--job", "dlq")
    assert code == 0, err
    counts = await services.wait_done("dlq", timeout=60)
    assert counts.dead == 3

    code, out, _ = await hutch(settings, "dlq", "list", "--job", "dlq", "--json")
    listing = json.loads(out)
    groups = {(g["reason"], g["domain"]): g["count"] for g in listing["groups"]}
    assert groups == {("not_found", alpha.domain): 1, ("not_found", beta.domain): 1, ("server_error", alpha.domain): 1}
    assert all({"id", "url", "domain", "stage", "reason", "attempts"} <= set(e) for e in listing["entries"])
    exhausted = next(e for e in listing["entries"] if e["reason"] == "server_error")
    assert exhausted["attempts"] == 3 and exhausted["stage"] == "fetch"

    code, out, _ = await hutch(settings, "dlq", "list", "--reason", "not_found", "--domain", beta.domain)
    assert code == 0 and "1 dead letters" in out and beta.base_url + "/status/404" in out
    assert alpha.base_url + "/status/404" not in out

    code, out, _ = await hutch(settings, "dlq", "show", str(exhausted["id"]))
    shown = json.loads(out)
    history = shown["letter"]["task"]["history"]
    assert [a["outcome"] for a in history] == ["server_error"] * 3
    assert all(a["status"] == 500 for a in history)

    replay = ("dlq", "replay", "--job", "dlq", "--reason", "server_error", "--reset-attempts")
    code, out, _ = await hutch(settings, *replay)
    assert code == 0 and "replayed 1" in out
    counts = await services.wait_done("dlq", timeout=60)
    assert (counts.stored, counts.dead) == (4, 2)
    code, out, _ = await hutch(settings, "dlq", "list", "--job", "dlq", "--json")
    assert {e["reason"] for e in json.loads(out)["entries"]} == {"not_found"}

    code, _, err = await hutch(settings, "dlq", "purge", "--reason", "not_found")
    assert code == 2 and "--yes" in err and "Traceback" not in err
    code, out, _ = await hutch(settings, "dlq", "purge", "--reason", "not_found", "--yes")
    assert code == 0 and "purged 2" in out
    code, out, _ = await hutch(settings, "dlq", "list", "--json")
    assert json.loads(out) == {"groups": [], "entries": []}

    code, _, err = await hutch(settings, "dlq", "show", "99999")
    assert code == 2 and "no dead letter with id 99999" in err
