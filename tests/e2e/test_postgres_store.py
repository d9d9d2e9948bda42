"""A job on the PostgreSQL store, end to end: the five services on the sandbox, the storer
SIGKILLed in the middle, and every URL stored or dead with no item lost or doubled."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox, expected_page

from hutch.models import FieldRule, Spec
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

SPEC = Spec(fields={"title": FieldRule(kind="css", expr="h1::text")})
PAGE = re.compile(r"^/page/(\d+)$")


@pytest.fixture
def settings(settings: Settings, postgres_url: str) -> Settings:
    return settings.model_copy(update={"store_url": postgres_url})


async def test_a_job_on_postgresql_survives_its_storer_sigkilled_midway_with_no_item_lost_or_doubled(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.urls()
    missing = sandbox.sites["alpha"].base_url + "/status/404"
    await submit_urls(settings, "pg", [*urls, missing], SPEC)
    await services.wait_for("pg", lambda c: c.stored >= len(urls) // 3, timeout=120)
    pid = services.supervisor.signal("storer")
    await services.supervisor.wait_restarted("storer", pid)
    counts = await services.wait_done("pg", timeout=180)

    assert counts.total == len(urls) + 1
    assert counts.stored + counts.dead == counts.total and counts.dead >= 1
    store = Store(settings.store_location)
    try:
        assert store.backend == "postgresql"
        rows = store.db.execute("SELECT COUNT(*), COUNT(DISTINCT url) FROM items WHERE job = ?", ("pg",)).fetchone()
        assert (rows[0], rows[1]) == (counts.stored, counts.stored)
        items = {item["url"]: item for item in store.items("pg")}
        stored = {t["url"] for t in store.tasks("pg") if t["state"] == "stored"}
        dead = {d["url"]: d for d in store.dead_letters("pg")}
    finally:
        store.close()
    assert set(items) == stored
    for url, item in items.items():
        site = next(name for name, s in sandbox.sites.items() if s.port == urlsplit(url).port)
        match = PAGE.match(urlsplit(url).path)
        assert match, url
        assert item["title"] == expected_page(site, int(match.group(1)))["h1"], url
    assert dead[missing]["reason"] == "not_found"
