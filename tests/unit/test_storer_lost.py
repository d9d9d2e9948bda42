"""The storer's look for a broker that lost its transient messages: when it sweeps, and when not.

The look and the marker are scripted here; `tests/chaos/test_broker_restart.py` drives the
whole of it through a broker that really restarts.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hutch.services.storer import lost


async def run_watch(monkeypatch: pytest.MonkeyPatch, looks: list[str], current: list[bool]) -> dict[str, Any]:
    """Watch through `looks` (one a turn), with `store_current` answering from `current`."""
    stopping = asyncio.Event()
    seen: dict[str, Any] = {"sweeps": [], "marks": 0, "asked": 0}

    async def look(_: object) -> str:
        if not looks:
            stopping.set()
            return "unknown"
        return looks.pop(0)

    async def mark(_: object) -> None:
        seen["marks"] += 1

    async def store_current() -> bool:
        seen["asked"] += 1
        return current.pop(0) if current else True

    async def sweep(before: float) -> int:
        seen["sweeps"].append(before)
        return 3

    monkeypatch.setattr(lost, "look", look)
    monkeypatch.setattr(lost, "mark", mark)
    monkeypatch.setattr(lost, "DRAINED_WAIT", 5.0)
    broker = SimpleNamespace(topology=SimpleNamespace(alive="t.v3.alive"))
    await asyncio.wait_for(lost.watch(broker, store_current, sweep, stopping, every=0.001), 10)  # type: ignore[arg-type]
    return seen


async def test_a_missing_marker_is_swept_twice_with_one_moment_once_the_store_is_current_then_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = await run_watch(monkeypatch, ["kept", "missing", "kept"], current=[False, False, True])
    assert len(seen["sweeps"]) == 2 and seen["sweeps"][0] == seen["sweeps"][1]
    assert seen["asked"] == 3  # it waited for the outcome events that came back
    assert seen["marks"] == 1


async def test_a_broker_that_does_not_keep_the_marker_gets_no_look_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lost, "REFUSED_PAUSE", 0.3)
    started = asyncio.get_running_loop().time()
    # Missing, swept, marked, and missing again at once: the pause comes before the next look.
    seen = await run_watch(monkeypatch, ["missing", "missing", "missing", "kept"], current=[])
    assert len(seen["sweeps"]) == 4  # two sweeps for each of the two losses looked at
    assert seen["marks"] == 2
    assert asyncio.get_running_loop().time() - started >= 0.3


async def test_a_restart_soon_after_the_storer_started_is_swept_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first look of a storer finds no marker (a fresh broker), sweeps and places it; the
    # broker then restarts before the next look.
    seen = await run_watch(monkeypatch, ["missing", "kept", "missing", "kept"], current=[])
    assert len(seen["sweeps"]) == 4 and seen["marks"] == 2


async def test_an_unreadable_marker_sweeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = await run_watch(monkeypatch, ["unknown", "unknown"], current=[])
    assert seen["sweeps"] == [] and seen["marks"] == 0
