"""Crawls that start from a sitemap, through all five services, a real RabbitMQ and the sandbox.

`/sitemap.xml` is an index of two sitemaps of the crawl site (`hutch_sandbox.sitemaps`): a
plain urlset, and a gzipped one served as a file (application/x-gzip, no Content-Encoding),
so the fetcher must pass its bytes to the parser. Between them they list crawl pages (one
spelled twice), a printable copy the `deny:` rule leaves out, a page on another domain that
`same_domain` leaves out, and a page outside `/crawl/` that `allow:` leaves out. The test works
out the breadth-first walk on its own (the sitemaps' URLs as `locs` gives them, then the
pages' links as `crawlsite.hrefs` gives them) and checks that the crawl admitted exactly that
set at those depths, fetched each page once and nothing else, and stored each sitemap's item.
Hostile sitemaps (a gzip bomb, a billion-laughs DTD, an unescaped `&`) end dead at stage
`parse` with their reasons, and the services go on without a restart.

The sandbox and the five services are started once for the module; each test a job of its own.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qsl, urljoin, urlsplit

import pytest
import pytest_asyncio
from hutch_sandbox import Sandbox, crawlsite, sitemaps
from hutch_sandbox.config import SandboxConfig

from hutch.models import Spec
from hutch.services.parser.spec import parse_spec
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import module_settings
from .conftest import Services, running_services, submit_urls
from .test_crawl import ROBOTS, canonical, requests_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="module")]

SITE = "crawl"
ALLOW = ["/crawl/", "/sitemaps/"]  # the sitemaps themselves must pass the rules too
DENY = ["/print/"]


@pytest.fixture(scope="module")
def settings(
    amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    yield from module_settings(amqp_url, "sitemaps", tmp_path_factory, request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 3, "sites": [{"name": SITE, "port": 0, "pages": 1, "robots_txt": ROBOTS}]}
    )
    async with Sandbox(config) as box:
        yield box


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(settings: Settings, sandbox: Sandbox) -> AsyncIterator[Services]:
    port = sandbox.sites[SITE].port
    extra_env = {  # the site under both loopback names: two domains, each allowed
        "HUTCH_ALLOWED_TARGETS": f"127.0.0.1:{port},localhost:{port}",
        "HUTCH_RESOLVE": f"localhost:{port}:127.0.0.1",
    }
    async with running_services(settings, sandbox, extra_env) as running:
        yield running


def spec(max_depth: int) -> Spec:
    return parse_spec(
        {
            "fields": {"title": "css:title::text"},
            "follow": [{"links": "css:a::attr(href)", "allow": ALLOW, "deny": DENY}],  # same_domain: the default
            "max_depth": max_depth,
        }
    )


def followed(url: str, host: str) -> bool:
    """Whether the spec's one rule keeps `url` (absolute), found on a page of `host`."""
    parts = urlsplit(url)
    return (
        parts.scheme.lower() == "http"
        and parts.netloc.lower() == host
        and any(re.search(expr, url) for expr in ALLOW)
        and not any(re.search(expr, url) for expr in DENY)
    )


def links_of(url: str, port: int) -> list[str]:
    """What the page at `url` offers, before the rules: a sitemap's locs, a page's links."""
    parts = urlsplit(url)
    if parts.path == "/sitemap.xml" or parts.path.startswith("/sitemaps/"):
        return sitemaps.locs(parts.path.rpartition("/")[2], parts.netloc, port)
    if parts.path.startswith("/crawl/private/"):
        return []  # disallowed by robots.txt: admitted, never fetched
    hrefs = crawlsite.hrefs(parts.path, dict(parse_qsl(parts.query)), parts.netloc, port) or []
    return [urljoin(url, href) for href in hrefs]


def breadth_first(seed: str, port: int, max_depth: int) -> dict[str, int]:
    """Every URL a breadth-first walk from `seed` admits within `max_depth`: canonical -> depth."""
    host = urlsplit(seed).netloc
    depths = {canonical(seed): 0}
    frontier = [seed]
    for depth in range(1, max_depth + 1):
        following = []
        for url in frontier:
            for found in links_of(url, port):
                key = canonical(found)
                if followed(found, host) and key not in depths:
                    depths[key] = depth
                    following.append(found)
        frontier = following
    return depths


def ended(settings: Settings, job: str) -> tuple[dict[str, tuple[str, int]], dict[str, dict[str, Any]]]:
    """(canonical URL -> (state, depth), canonical URL -> item) of a job."""
    store = Store(settings.store_location)
    try:
        tasks = {
            canonical(url): (state, depth)
            for url, state, depth in store.db.execute(
                "SELECT url, state, COALESCE(depth, 0) FROM tasks WHERE job = ?", (job,)
            )
        }
        items = {canonical(item["url"]): item for item in store.items(job)}
    finally:
        store.close()
    return tasks, items


async def crawl_from_sitemap(settings: Settings, sandbox: Sandbox, services: Services, job: str, depth: int) -> None:
    site = sandbox.sites[SITE]
    seed = f"{site.base_url}/sitemap.xml"
    mark = len(sandbox.log)
    await submit_urls(settings, job, [seed], spec(max_depth=depth))
    counts = await services.wait_done(job, timeout=180)

    expected = breadth_first(seed, site.port, depth)
    tasks, items = ended(settings, job)
    assert {url: depth for url, (_, depth) in tasks.items()} == expected  # each at its shortest depth
    private = {url for url in expected if "/crawl/private/" in url}
    assert {url for url, (state, _) in tasks.items() if state == "stored"} == set(expected) - private
    assert {tasks[url][0] for url in private} <= {"dead"}  # robots
    requested = requests_of(sandbox, mark) + [
        canonical(f"http://{record.host}{record.path}")
        for record in sandbox.log[mark:]
        if record.path.startswith(("/sitemap.xml", "/sitemaps/")) and record.host
    ]
    assert sorted(requested) == sorted(set(expected) - private)  # each once, nothing left out fetched
    host = f"127.0.0.1:{site.port}"
    assert items[canonical(seed)]["sitemap"] == "sitemapindex" and items[canonical(seed)]["urls"] == 2
    assert items[canonical(f"http://{host}/sitemaps/pages.xml")]["urls"] == len(sitemaps.locs("pages.xml", host, 0))
    assert items[canonical(f"http://{host}/sitemaps/items.xml.gz")]["sitemap"] == "urlset"  # gzipped, read
    assert counts.crawl is not None and counts.crawl["admitted"] == len(expected)


async def test_a_crawl_from_sitemap_xml_admits_exactly_the_urls_its_sitemaps_list_that_the_rules_allow(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    site = sandbox.sites[SITE]
    expected = breadth_first(f"{site.base_url}/sitemap.xml", site.port, 2)
    kept = ("/crawl/", "/crawl/cat/1?page=1&sort=name", "/crawl/cat/3?page=2&sort=name", "/crawl/item/2-5",
            "/crawl/item/3-12", "/crawl/item/1-7")  # fmt: skip
    # Of the 11 URLs listed: one twice in each sitemap, a printable copy, another domain, /status/.
    assert {url for url, depth in expected.items() if depth == 2} == {f"{site.base_url}{path}" for path in kept}
    await crawl_from_sitemap(settings, sandbox, services, "sitemap-only", depth=2)


async def test_a_crawl_from_sitemap_xml_follows_the_listed_pages_links_within_max_depth(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    expected = breadth_first(f"{sandbox.sites[SITE].base_url}/sitemap.xml", sandbox.sites[SITE].port, 3)
    assert any(depth == 3 for depth in expected.values())
    await crawl_from_sitemap(settings, sandbox, services, "sitemap-and-links", depth=3)


async def test_hostile_sitemaps_end_dead_with_their_reasons_and_the_services_go_on(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites[SITE].base_url
    hostile = {
        f"{base}/sitemaps/bomb.xml.gz?mib=1024": ("sitemap_too_large", "inflates beyond"),  # 1 GiB in 1 MiB
        f"{base}/sitemaps/entities.xml": ("sitemap_invalid", "DOCTYPE"),
        f"{base}/sitemaps/broken.xml": ("sitemap_invalid", "line 4"),
    }
    await submit_urls(settings, "hostile-sitemaps", list(hostile), spec(max_depth=2))
    counts = await services.wait_done("hostile-sitemaps", timeout=120)
    assert counts.dead == len(hostile) and counts.total == len(hostile)
    store = Store(settings.store_location)
    try:
        dead = {entry["url"]: entry for entry in store.dead_entries(job="hostile-sitemaps")}
    finally:
        store.close()
    for url, (reason, detail) in hostile.items():
        assert (dead[url]["stage"], dead[url]["reason"]) == ("parse", reason), dead[url]
        assert detail in dead[url]["detail"], dead[url]
    assert all(services.supervisor.child(label).restarts == 0 for label in ("parser", "fetcher.1", "storer"))

    # The parser goes on: a gzipped sitemap after them is read as usual.
    await submit_urls(settings, "after-hostile", [f"{base}/sitemaps/items.xml.gz"], spec(max_depth=1))
    counts = await services.wait_done("after-hostile", timeout=120)
    assert (counts.stored, counts.dead) == (4, 0)  # the sitemap and its three items
