"""Hostile page structure through all five services, a real RabbitMQ and the sandbox's HTTP.

A spec is outside input and so is a page: together they can ask the parser for minutes of
libxml2 time (`//*[.=//*]` on /hostile/quadratic) or for thousands of times the page in one
item (`{css: div, many: true}` on /hostile/deep-nesting). Each such page must end dead at
stage `parse` with its reason, the job must end with 0 pending, and the parser must go on
serving the other pages.

The tests only submit jobs of their own and read them: the sandbox and the five services are
started once for the module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig

from hutch.models import FieldRule, Spec
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import module_settings
from .conftest import Services, running_services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

PARSE_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def settings(
    amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    yield from module_settings(amqp_url, "pages", tmp_path_factory, request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 3, "sites": [{"name": "plain", "port": 0, "pages": 20}]}
    )
    async with Sandbox(config) as box:
        yield box


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(settings: Settings, sandbox: Sandbox) -> AsyncIterator[Services]:
    extra_env = {"HUTCH_PARSE_TIMEOUT": str(PARSE_TIMEOUT), "HUTCH_PARSE_WORKERS": "2"}
    async with running_services(settings, sandbox, extra_env) as running:
        yield running


def ended(settings: Settings, job: str) -> tuple[dict[str, str], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(state by URL, dead letter by URL, item by URL) of a job."""
    store = Store(settings.store_location)
    try:
        states = {t["url"]: t["state"] for t in store.tasks(job)}
        dead = {d["url"]: d for d in store.dead_entries(job=job)}
        items = {i["url"]: i for i in store.items(job)}
    finally:
        store.close()
    return states, dead, items


async def test_a_quadratic_xpath_goes_dead_as_parse_timeout_and_the_parser_goes_on(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["plain"].base_url
    slow = f"{base}/hostile/quadratic"
    pages = [f"{base}/page/{i}" for i in range(4)]
    spec = Spec(
        fields={
            "title": FieldRule(kind="css", expr="title::text"),
            "same": FieldRule(kind="xpath", expr="count(//*[.=//*])"),
        }
    )
    await submit_urls(settings, "quadratic", [slow, *pages], spec)
    counts = await services.wait_done("quadratic", timeout=120)
    assert counts.pending == 0
    states, dead, items = ended(settings, "quadratic")
    assert states[slow] == "dead"
    assert (dead[slow]["stage"], dead[slow]["reason"]) == ("parse", "parse_timeout")
    for url in pages:
        assert states[url] == "stored", url
        assert items[url]["title"] and float(items[url]["same"]) > 0
    # The parser whose worker was killed serves a later job too.
    await submit_urls(settings, "after", [f"{base}/page/9"], spec)
    after = await services.wait_done("after", timeout=60)
    assert (after.stored, after.pending) == (1, 0)


async def test_many_divs_of_a_deeply_nested_page_go_dead_as_item_too_large(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["plain"].base_url
    deep = f"{base}/hostile/deep-nesting"
    deeper = f"{base}/hostile/deep-nesting?depth=100000"  # past lxml's own depth limit
    page = f"{base}/page/1"
    spec = Spec(fields={"divs": FieldRule(kind="css", expr="div", many=True)})
    await submit_urls(settings, "deep", [deep, deeper, page], spec)
    counts = await services.wait_done("deep", timeout=120)
    assert counts.pending == 0
    states, dead, items = ended(settings, "deep")
    for url in (deep, deeper):
        assert states[url] == "dead", url
        assert (dead[url]["stage"], dead[url]["reason"]) == ("parse", "item_too_large"), url
    assert states[page] == "stored"
    assert isinstance(items[page]["divs"], list)
