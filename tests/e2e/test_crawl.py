"""Crawls through all five services, a real RabbitMQ and the sandbox's crawl site.

The site (`hutch_sandbox.crawlsite`) has pagination, cycles, one page spelled many ways, links
to another domain (the same site under `localhost`), a printable copy of every item that a
`deny:` rule leaves out, and a section its robots.txt disallows. The test works out the
breadth-first walk of the same graph within `max_depth` on its own (the links as the site
writes them, resolved with urljoin, made canonical with w3lib), and checks that the crawl
admitted exactly that set, stored every page of it the robots.txt allows and fetched each
once, and that the other pages ended dead as `robots` without a request.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urljoin, urlsplit

import pytest
from hutch_sandbox import Sandbox, crawlsite
from hutch_sandbox.config import SandboxConfig
from w3lib.url import canonicalize_url

from hutch.models import Spec
from hutch.services.parser.spec import parse_spec
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROBOTS = "User-agent: *\nDisallow: /crawl/private/\n"
SERVICES = ("governor", "proxy-manager", "parser", "storer", "fetcher.1")


def spec(max_depth: int, max_pages: int | None = None) -> Spec:
    data: dict[str, object] = {
        "fields": {"title": "css:title::text"},
        "follow": [{"links": "css:a::attr(href)", "deny": ["/print/"], "same_domain": False}],
        "max_depth": max_depth,
    }
    if max_pages is not None:
        data["max_pages"] = max_pages
    return parse_spec(data)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 3, "sites": [{"name": "crawl", "port": 0, "pages": 1, "robots_txt": ROBOTS}]}
    )
    async with Sandbox(config) as box:
        yield box


@pytest.fixture
def extra_env(sandbox: Sandbox) -> dict[str, str]:
    """The site under both loopback names: two domains, each allowed and pinned to 127.0.0.1."""
    port = sandbox.sites["crawl"].port
    return {
        "HUTCH_ALLOWED_TARGETS": f"127.0.0.1:{port},localhost:{port}",
        "HUTCH_RESOLVE": f"localhost:{port}:127.0.0.1",
    }


def canonical(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.lower().removesuffix(":80")
    return canonicalize_url(f"{parts.scheme.lower()}://{host}{url[len(parts.scheme) + 3 + len(parts.netloc):]}")


def breadth_first(seed: str, port: int, max_depth: int) -> dict[str, int]:
    """Every page a breadth-first walk admits within `max_depth`: canonical URL -> depth.
    Pages under /crawl/private/ are admitted but never fetched (robots.txt), so not expanded."""
    depths = {canonical(seed): 0}
    frontier = [seed]
    for depth in range(1, max_depth + 1):
        following = []
        for url in frontier:
            parts = urlsplit(url)
            if parts.path.startswith("/crawl/private/"):
                continue
            hrefs = crawlsite.hrefs(parts.path, dict(parse_qsl(parts.query)), parts.netloc, port) or []
            for href in hrefs:
                found = urljoin(url, href)
                if not found.lower().startswith("http") or "/print/" in found:
                    continue
                key = canonical(found)
                if key not in depths:
                    depths[key] = depth
                    following.append(found)
        frontier = following
    return depths


def crawled(settings: Settings, job: str) -> dict[str, str]:
    """Each task of the job: canonical URL -> state."""
    store = Store(settings.store_location)
    try:
        return {canonical(task["url"]): task["state"] for task in store.tasks(job)}
    finally:
        store.close()


def requests_of(sandbox: Sandbox, since: int = 0) -> list[str]:
    """The crawl pages requested (canonical URLs), in order, from the log's record `since` on."""
    return [
        canonical(f"http://{record.host}{record.path}")
        for record in sandbox.log[since:]
        if record.path.startswith("/crawl") and record.host
    ]


async def test_a_crawl_admits_the_breadth_first_set_within_max_depth_and_fetches_each_page_once(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    site = sandbox.sites["crawl"]
    seed = f"{site.base_url}/crawl/"
    await submit_urls(settings, "walk", [seed], spec(max_depth=3))
    counts = await services.wait_done("walk", timeout=180)

    expected = breadth_first(seed, site.port, 3)
    states = crawled(settings, "walk")
    assert set(states) == set(expected)
    private = {url for url in expected if "/crawl/private/" in url}
    assert private and {states[url] for url in private} == {"dead"}
    assert {url for url, state in states.items() if state == "stored"} == set(expected) - private
    assert any(url.startswith(f"http://localhost:{site.port}/") for url in states)  # another domain
    requested = requests_of(sandbox)
    assert sorted(requested) == sorted(set(expected) - private)  # each page once, no private one
    assert counts.crawl is not None
    assert counts.crawl["admitted"] == len(expected) and counts.crawl["depth"] == 3
    assert counts.crawl["duplicates"] > 0 and counts.crawl["over_depth"] > 0
    store = Store(settings.store_location)
    try:
        depths = {canonical(url): depth for url, depth in store.db.execute(
            "SELECT url, COALESCE(depth, 0) FROM tasks WHERE job = ?", ("walk",))}  # fmt: skip
    finally:
        store.close()
    assert depths == expected  # each page at its shortest depth


async def test_a_crawl_never_admits_more_than_max_pages(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    seed = f"{sandbox.sites['crawl'].base_url}/crawl/"
    await submit_urls(settings, "small", [seed], spec(max_depth=5, max_pages=12))
    counts = await services.wait_done("small", timeout=120)
    assert counts.total == 12
    assert counts.crawl is not None and counts.crawl["over_pages"] > 0
    assert len(requests_of(sandbox)) <= 12


async def test_a_crawl_killed_midway_and_run_again_fetches_no_stored_page_again(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    site = sandbox.sites["crawl"]
    seed = f"{site.base_url}/crawl/"
    await submit_urls(settings, "resumed", [seed], spec(max_depth=3))
    midway = await services.wait_for("resumed", lambda c: c.stored >= 15, timeout=120)
    assert midway.crawl is not None and midway.crawl["admitted"] < 67, midway  # not all found yet
    pids = {label: services.supervisor.signal(label, signal.SIGKILL) for label in SERVICES}
    stored_before = {url for url, state in crawled(settings, "resumed").items() if state == "stored"}
    mark = len(sandbox.log)
    for label, pid in pids.items():
        await services.supervisor.wait_restarted(label, pid, timeout=60)
    await services.supervisor.wait_ready(timeout=60)
    await submit_urls(settings, "resumed", [seed], spec(max_depth=3))  # run again: nothing new
    counts = await services.wait_done("resumed", timeout=180)

    expected = breadth_first(seed, site.port, 3)
    states = crawled(settings, "resumed")
    assert set(states) == set(expected)
    assert counts.pending == 0
    after = requests_of(sandbox, mark)
    assert after  # the crawl went on after the kill
    again = [url for url in after if url in stored_before]
    assert again == [], again
