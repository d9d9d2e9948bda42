"""Submitting with nothing but an AMQP client: a plain pika publisher (the blocking client a
synchronous program would use) sends JSON to the `intake` queue, and the job runs.

The storer records each submission, then publishes its tasks; a URL sent twice is recorded
and fetched once; a body that is no submission, or one with an invalid URL, goes dead with
its reason and records nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pytest
from hutch_sandbox import Sandbox

from hutch.amqp import topology_for
from hutch.settings import Settings
from hutch.store import Store
from hutch.topology import INTAKE_KEY

from .conftest import Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def publish(settings: Settings, *bodies: bytes) -> None:
    """What any producer does: a confirmed, persistent publish to `work` with key `intake`."""
    parts = urlsplit(settings.amqp_url)
    connection = pika.BlockingConnection(pika.URLParameters(urlunsplit(parts._replace(query=""))))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(
                topology_for(settings).work,
                INTAKE_KEY,
                body,
                pika.BasicProperties(content_type="application/json", delivery_mode=2),
                mandatory=True,
            )
    finally:
        connection.close()


def submission(job: str, urls: list[str], **more: Any) -> bytes:
    return json.dumps({"v": 1, "job": job, "urls": urls, **more}).encode()


def stored_urls(settings: Settings, job: str) -> list[str]:
    store = Store(settings.store_location)
    try:
        return [t["url"] for t in store.tasks(job) if t["state"] == "stored"]
    finally:
        store.close()


async def test_a_job_sent_by_a_plain_pika_publisher_is_recorded_and_completes_each_url_once(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["delta"].base_url
    first = [f"{base}/page/{n}" for n in range(12)]
    again = first[6:] + [f"{base}/page/{n}" for n in range(12, 16)]  # six of them a second time
    spec = {"fields": {"heading": {"kind": "css", "expr": "title::text"}}}
    # The first as a newer producer would send it, with a field this version does not know:
    # an addition, so it is read (and the field kept), not refused.
    bodies = (submission("piped", first, spec=spec, priority=5), submission("piped", again, spec=spec))
    await asyncio.to_thread(publish, settings, *bodies)
    counts = await services.wait_for("piped", lambda c: c.total == 16 and c.pending == 0, timeout=60)
    assert (counts.total, counts.stored) == (16, 16)
    assert sorted(stored_urls(settings, "piped")) == sorted(set(first + again))
    # Each URL recorded once, so each item stored once (the site's injected faults retry some).
    store = Store(settings.store_location)
    try:
        assert store.db.execute("SELECT COUNT(*) FROM items WHERE job = 'piped'").fetchone()[0] == 16
        assert all(item.get("heading") for item in store.items("piped"))  # the spec sent along applied
    finally:
        store.close()


async def test_a_body_that_is_no_submission_or_holds_a_bad_url_is_dead_with_its_reason(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["delta"].base_url
    bad_url = submission("refused", [f"{base}/page/1", "ftp://example.com/file"])
    bad_job = submission("../escape", [f"{base}/page/2"])
    bad_tier = submission("refused", [f"{base}/page/3"], tier_floor="residental")
    newer = json.dumps({"v": 2, "job": "refused", "urls": [f"{base}/page/4"]}).encode()  # a breaking change
    await asyncio.to_thread(publish, settings, b"{not json", bad_url, bad_job, bad_tier, newer)
    store = Store(settings.store_location)
    try:
        for _ in range(100):
            dead = store.dead_entries(limit=10)
            if len(dead) == 5:
                break
            await asyncio.sleep(0.1)
        reasons = sorted((d["stage"], d["reason"]) for d in dead)
        assert reasons == [*[("intake", "decode")] * 2, *[("intake", "invalid_submission")] * 3]
        details = " ".join(d["detail"] for d in dead)
        assert "URL 2 of 2" in details and "job name" in details and "tier_floor 'residental'" in details
        assert "schema version '2'" in details and "reads version 1" in details
        assert store.tasks("refused") == [] and store.counts() == []  # nothing of them recorded
    finally:
        store.close()
