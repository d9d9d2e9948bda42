"""`hutch.client.Client` from synchronous code: submit, wait, read items and control a job on
the running services, with the CLI's checks and errors. Each call runs in a thread, as a
blocking program would make it."""

from __future__ import annotations

import asyncio

import pytest
from hutch_sandbox import Sandbox

from hutch.client import Client, InvalidInput, TimedOut, Unavailable
from hutch.settings import Settings

from .conftest import Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_a_job_submitted_waited_for_and_read_from_synchronous_code(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["gamma"].base_url
    urls = [f"{base}/page/{n}" for n in range(10)]
    spec = {"fields": {"heading": "css:title::text"}}

    def run() -> tuple[int, object, list[dict[str, object]]]:
        with Client(settings) as hutch:
            sent = hutch.submit("from-python", urls + urls[:3], spec=spec)  # three twice: sent once
            progress = hutch.wait("from-python", timeout=60, poll=0.2, expected=sent)
            return sent, progress, list(hutch.items("from-python"))

    sent, progress, items = await asyncio.to_thread(run)
    assert sent == 10
    assert (progress.total, progress.stored, progress.pending, progress.done) == (10, 10, 0, True)  # type: ignore[attr-defined]
    assert sorted(item["url"] for item in items) == sorted(urls)  # type: ignore[type-var]
    assert all(item["heading"] for item in items)


async def test_controls_go_through_and_bad_input_is_refused_before_anything_is_sent(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["gamma"].base_url

    def run() -> None:
        with Client(settings) as hutch:
            with pytest.raises(InvalidInput, match="URL 2: "):
                hutch.submit("refused", [f"{base}/page/1", "ftp://example.com/x"])
            with pytest.raises(InvalidInput, match="invalid job name"):
                hutch.submit("../escape", [f"{base}/page/1"])
            with pytest.raises(InvalidInput, match="invalid spec"):
                hutch.submit("refused", [f"{base}/page/1"], spec={"fields": {"x": "nope:a"}})
            with pytest.raises(InvalidInput, match="tier_floor 'gold'"):
                hutch.submit("refused", [f"{base}/page/1"], tier_floor="gold")
            with pytest.raises(InvalidInput, match="weight"):
                hutch.weight("refused", 0)
            assert hutch.status("refused").total == 0  # nothing of it went out

            # A job paused before its URLs go: they wait; resumed, they finish.
            hutch.pause("held")
            sent = hutch.submit("held", [f"{base}/page/{n}" for n in range(20, 25)])
            with pytest.raises(TimedOut) as waited:
                hutch.wait("held", timeout=3, poll=0.2, expected=sent)
            assert waited.value.progress.stored == 0 and waited.value.progress.state == "paused"
            hutch.resume("held")
            assert hutch.wait("held", timeout=60, poll=0.2, expected=sent).stored == 5

        unreachable = settings.model_copy(update={"amqp_url": "amqp://guest:guest@127.0.0.1:1/"})
        with Client(unreachable, timeout=2) as hutch, pytest.raises(Unavailable, match="cannot reach RabbitMQ"):
            hutch.submit("nowhere", [f"{base}/page/1"])

    await asyncio.to_thread(run)
