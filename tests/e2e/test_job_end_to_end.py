"""A whole job through all five services, a real RabbitMQ and the sandbox's real HTTP.

What a user relies on: every URL ends stored or dead, every stored item holds exactly what
the site served, and neither a crashed fetcher nor a restarted governor loses a URL.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox, expected_page

from hutch.models import FieldRule, Spec
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPEC = Spec(
    fields={
        "title": FieldRule(kind="css", expr="title::text"),
        "h1": FieldRule(kind="xpath", expr="//h1/text()"),
        "price": FieldRule(kind="css", expr="span.price::text"),
        "description": FieldRule(kind="css", expr="p.desc::text"),
        "links": FieldRule(kind="css", expr="a::attr(href)", many=True),
    }
)
PAGE = re.compile(r"^/page/(\d+)$")


@pytest.fixture
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """The test's settings; a test may ask for others (indirect `settings`: the updates)."""
    return settings.model_copy(update=getattr(request, "param", {}))


async def submit_job(settings: Settings, job: str, urls: list[str]) -> None:
    await submit_urls(settings, job, urls, SPEC)


def site_of(sandbox: Sandbox, url: str) -> str:
    port = urlsplit(url).port
    return next(name for name, site in sandbox.sites.items() if site.port == port)


def check_every_item_against_the_sandbox(settings: Settings, sandbox: Sandbox, job: str) -> int:
    store = Store(settings.store_location)
    try:
        items = list(store.items(job))
        tasks = store.tasks(job)
    finally:
        store.close()
    assert {t["state"] for t in tasks} <= {"stored", "dead"}
    stored_urls = {t["url"] for t in tasks if t["state"] == "stored"}
    assert {item["url"] for item in items} == stored_urls
    for item in items:
        match = PAGE.match(urlsplit(item["url"]).path)
        assert match, item["url"]
        expected = expected_page(site_of(sandbox, item["url"]), int(match.group(1)))
        assert {k: item[k] for k in expected} == expected, item["url"]
    return len(items)


async def test_a_job_over_four_faulty_sites_with_its_fetcher_sigkilled_midway_ends_with_every_url_stored_or_dead(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.urls()
    extra = [
        sandbox.sites["alpha"].base_url + "/status/404",
        sandbox.sites["beta"].base_url + "/status/410",
    ]
    await submit_job(settings, "e2e", urls + urls[:10])  # duplicates submitted once
    await services.wait_for("e2e", lambda c: c.stored >= len(urls) // 4, timeout=120)
    pid = services.supervisor.signal("fetcher.1")
    await services.supervisor.wait_restarted("fetcher.1", pid)
    # Sent after the kill, so that no crash can count against their single attempt.
    await submit_job(settings, "e2e", extra)
    counts = await services.wait_done("e2e", timeout=180)
    assert counts.total == len(urls) + len(extra)
    assert counts.stored + counts.dead == counts.total
    assert counts.dead >= 2
    stored = check_every_item_against_the_sandbox(settings, sandbox, "e2e")
    assert stored == counts.stored
    # Faults really happened and were retried: the sites saw more requests than URLs.
    page_requests = [r for r in sandbox.log if PAGE.match(r.path)]
    assert len(page_requests) > len(urls)
    store = Store(settings.store_location)
    try:
        dead = {d["url"]: d for d in store.dead_letters("e2e")}
    finally:
        store.close()
    for url in extra:
        assert dead[url]["reason"] == "not_found"
        assert dead[url]["attempts"] == 1


# A restarted governor waits one permit lifetime before it releases anything again: 4 s here,
# rather than the tests' 10 s; what is tested is that it resumes at all, and every domain.
# It also counts every release it reads back from the released log as a fetch in flight until
# that release's deadline (4 s + the fetch deadline, 14 s), not hearing the outcomes that came
# before it: limits on fetches in flight above what the job released before the kill (about a
# quarter of its 320 pages) let the permit lifetime, not those deadlines, decide when it resumes.
RESTART = {"permit_ttl": 4.0, "concurrency_per_domain": 128, "concurrency": 512}


@pytest.mark.parametrize("settings", [RESTART], ids=["permit-ttl-4s"], indirect=True)
async def test_governor_restarted_mid_job_resumes_every_domain(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.urls()
    await submit_job(settings, "restart", urls)
    await services.wait_for("restart", lambda c: c.stored >= len(urls) // 4, timeout=120)
    killed_at = time.time()
    pid = services.supervisor.signal("governor")
    await services.supervisor.wait_restarted("governor", pid)
    counts = await services.wait_done("restart", timeout=180)
    assert counts.stored + counts.dead == len(urls)
    assert check_every_item_against_the_sandbox(settings, sandbox, "restart") == counts.stored
    # The new governor resumed every domain: each site kept receiving its pages.
    for name in sandbox.sites:
        assert any(r.ts > killed_at and PAGE.match(r.path) for r in sandbox.site_log(name)), name
