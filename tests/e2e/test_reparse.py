"""The page archive and `hutch reparse`, through all five services, RabbitMQ and the sandbox.

A job whose spec says `archive: true` is run; its pages' bodies are kept by the storer. Then
`hutch reparse` (the command, as a process) extracts them again with a new spec: every item
changes to the new spec's fields exactly as the pages hold them, and the sandbox's access log
shows no request at all after the first run. A crawl reparsed with `--follow` and a deeper
`max_depth` fetches only the pages new to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox, load_config
from hutch_sandbox.pages import expected_page

from hutch.services.parser.spec import parse_spec
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import service_env
from .conftest import HERE, Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox-clean.yaml")) as box:
        yield box


def items(settings: Settings, job: str) -> dict[str, dict[str, object]]:
    store = Store(settings.store_location)
    try:
        return {item["url"]: item for item in store.items(job)}
    finally:
        store.close()


async def hutch(settings: Settings, *args: str) -> tuple[int, str]:
    """Run the `hutch` command line on these settings; (exit code, standard error)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from hutch.services.control.cli import main; main()", *args,
        env=service_env(settings), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_reparse_replaces_every_item_from_the_archive_and_sends_no_request(
    settings: Settings, sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    site = sandbox.sites["north"]
    urls = site.urls()[:20]
    first = parse_spec({"fields": {"title": "css:title::text"}, "archive": True})
    await submit_urls(settings, "kept", urls, first)
    await services.wait_done("kept", timeout=120)
    before = items(settings, "kept")
    assert {url: item["title"] for url, item in before.items()} == {
        url: expected_page("north", i)["title"] for i, url in enumerate(urls)
    }
    requests = len(sandbox.log)

    spec_file = tmp_path / "new.yaml"
    spec_file.write_text('fields:\n  heading: "css:h1::text"\n  price: "css:.price::text"\n')
    code, err = await hutch(settings, "reparse", "kept", "--spec", str(spec_file))
    assert code == 0, err
    assert "20 pages sent to the parsers" in err

    expected = {url: {"heading": expected_page("north", i)["h1"]} for i, url in enumerate(urls)}
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        found = {url: {"heading": item.get("heading")} for url, item in items(settings, "kept").items()}
        if found == expected or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.25)
    assert found == expected
    assert len(sandbox.log) == requests  # nothing fetched: not a page, not a robots.txt
    store = Store(settings.store_location)
    try:
        recorded = store.job_spec("kept")
    finally:
        store.close()
    assert recorded is not None and set(recorded["fields"]) == {"heading", "price"}


async def test_reparse_refuses_a_job_that_kept_no_pages(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    await submit_urls(settings, "plain", sandbox.sites["south"].urls()[:3], parse_spec({"fields": {"t": "css:title"}}))
    await services.wait_done("plain", timeout=60)
    code, err = await hutch(settings, "reparse", "plain")
    assert code == 2 and "no archived page" in err and "archive: true" in err, err
    code, err = await hutch(settings, "reparse", "nosuchjob")
    assert code == 2 and "no job named 'nosuchjob'" in err, err
    assert os.environ.get("HUTCH_API_URL") is None


async def test_reparse_with_follow_and_a_deeper_max_depth_fetches_only_the_pages_new_to_the_crawl(
    settings: Settings, sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    seed = f"{sandbox.sites['north'].base_url}/crawl/"
    rules = '  - links: "css:a::attr(href)"\n    deny: ["/print/", "/private/"]\n'
    spec = parse_spec(
        {"fields": {"title": "css:title::text"}, "archive": True, "max_depth": 1,
         "follow": [{"links": "css:a::attr(href)", "deny": ["/print/", "/private/"]}]}
    )  # fmt: skip
    await submit_urls(settings, "crawled", [seed], spec)
    first = await services.wait_done("crawled", timeout=120)
    fetched = {record.path for record in sandbox.log if record.path.startswith("/crawl")}
    assert first.crawl is not None and first.crawl["depth"] == 1 and first.crawl["over_depth"] > 0
    mark = len(sandbox.log)

    spec_file = tmp_path / "deeper.yaml"
    spec_file.write_text(f'fields:\n  title: "css:title::text"\nmax_depth: 2\nfollow:\n{rules}')
    code, err = await hutch(settings, "reparse", "crawled", "--spec", str(spec_file), "--follow")
    assert code == 0, err
    deeper = await services.wait_for(
        "crawled", lambda c: c.crawl is not None and c.crawl["depth"] == 2 and c.pending == 0, timeout=120
    )
    assert deeper.total > first.total and deeper.stored == deeper.total
    again = [r.path for r in sandbox.log[mark:] if r.path in fetched]
    assert again == [], again  # the pages of the first run come from the archive
    assert len([r for r in sandbox.log[mark:] if r.path.startswith("/crawl")]) == deeper.total - first.total


async def test_reparse_with_follow_reads_an_archived_gzipped_sitemap_with_the_new_rules(
    settings: Settings, sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    """A crawl from `items.xml.gz` (a gzip file, kept as its bytes) follows only the items of
    category 2; reparsed with `--follow` and a rule for every item, the archived sitemap is
    inflated and read again, and only the two items the old rule left out are fetched."""
    seed = f"{sandbox.sites['north'].base_url}/sitemaps/items.xml.gz"
    spec = parse_spec(
        {"fields": {"title": "css:title::text"}, "archive": True, "max_depth": 1,
         "follow": [{"links": "css:a::attr(href)", "allow": ["/crawl/item/2-"]}]}
    )  # fmt: skip
    await submit_urls(settings, "from-gzip", [seed], spec)
    first = await services.wait_done("from-gzip", timeout=120)
    assert first.stored == 2 and first.total == 2  # the sitemap and /crawl/item/2-5
    mark = len(sandbox.log)

    spec_file = tmp_path / "every-item.yaml"
    spec_file.write_text(
        'fields:\n  title: "css:title::text"\nmax_depth: 1\nfollow:\n'
        '  - links: "css:a::attr(href)"\n    allow: ["/crawl/item/"]\n'
    )
    code, err = await hutch(settings, "reparse", "from-gzip", "--spec", str(spec_file), "--follow")
    assert code == 0, err
    after = await services.wait_for("from-gzip", lambda c: c.total == 4 and c.pending == 0, timeout=120)
    assert after.stored == 4
    fetched = sorted(r.path for r in sandbox.log[mark:] if r.path != "/robots.txt")
    assert fetched == ["/crawl/item/1-7", "/crawl/item/3-12"], fetched
    store = Store(settings.store_location)
    try:
        (links,) = store.db.execute(
            "SELECT l.links FROM page_links l JOIN tasks t ON t.id = l.task_id WHERE t.url = ?", (seed,)
        ).fetchone()
    finally:
        store.close()
    assert len(json.loads(links)) == 3  # the sitemap's page now records what the new rule keeps
