"""Specs beyond CSS and XPath through all five services, a real RabbitMQ and the sandbox's HTTP.

A JSON API read with JMESPath (`/api/products/<i>.json`), prices and numbers cut out of HTML
text with regular expressions, and an `item:` schema that converts what fits and sends what
does not dead at stage `parse` with the field named (`item_invalid`); a JMESPath field on a
page that is not JSON ends `not_json`, and a regular expression that backtracks without end
ends `parse_timeout` while the parser goes on. Each spec is written as a spec file is, in
YAML, and every stored item is compared with what the sandbox served.

The sandbox and the five services are started once for the module; each test a job of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from hutch_sandbox import Sandbox, expected_page
from hutch_sandbox.config import SandboxConfig
from hutch_sandbox.jsonapi import expected_product

from hutch.models import Spec
from hutch.services.parser.spec import spec_from_bytes
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import module_settings
from .conftest import Services, running_services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

PARSE_TIMEOUT = 2.0
SITE = "shop"


@pytest.fixture(scope="module")
def settings(
    amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    yield from module_settings(amqp_url, "json-re", tmp_path_factory, request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {"host": "127.0.0.1", "seed": 5, "sites": [{"name": SITE, "port": 0, "pages": 20}]}
    )
    async with Sandbox(config) as box:
        yield box


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(settings: Settings, sandbox: Sandbox) -> AsyncIterator[Services]:
    extra_env = {"HUTCH_PARSE_TIMEOUT": str(PARSE_TIMEOUT), "HUTCH_PARSE_WORKERS": "2"}
    async with running_services(settings, sandbox, extra_env) as running:
        yield running


def spec(text: str) -> Spec:
    return spec_from_bytes(text.encode(), "test spec")


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


PRODUCTS = spec("""
fields:
  id: "jmespath:product.id"
  name: "jmespath:product.name"
  maker: "jmespath:product.maker.name"
  amount: "jmespath:product.price.amount"
  price: "jmespath:product.price"
  tag: "jmespath:product.tags"
  tags: {jmespath: "product.tags", many: true}
  skus: {jmespath: "product.variants[*].sku", many: true}
  in_stock: {jmespath: "product.variants[?stock > `0`].sku", many: true}
  related: {jmespath: "product.related", many: true}
item:
  id: {type: integer, required: true}
  name: {type: string, required: true}
  amount: {type: number, required: true}
  price: {type: object}
  tags: {type: list}
""")


async def test_a_json_api_read_with_jmespath_stores_each_value_as_json_gave_it(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites[SITE].base_url
    indexes = list(range(14))
    withdrawn = [i for i in indexes if expected_product(SITE, i)["product"]["price"] is None]
    assert withdrawn == [6, 13]
    html = f"{base}/page/1"
    urls = [f"{base}/api/products/{i}.json" for i in indexes]
    await submit_urls(settings, "products", [*urls, html], PRODUCTS)
    counts = await services.wait_done("products", timeout=120)
    assert (counts.stored, counts.dead, counts.pending) == (len(indexes) - 2, 3, 0)
    states, dead, items = ended(settings, "products")
    for i, url in zip(indexes, urls, strict=True):
        if i in withdrawn:
            continue
        assert states[url] == "stored", url
        product = expected_product(SITE, i)["product"]
        assert items[url] == {
            "url": url,
            "id": i,
            "name": product["name"],
            "maker": product["maker"]["name"],
            "amount": product["price"]["amount"],
            "price": product["price"],
            "tag": product["tags"][0],
            "tags": product["tags"],
            "skus": [variant["sku"] for variant in product["variants"]],
            "in_stock": [variant["sku"] for variant in product["variants"] if variant["stock"] > 0],
            "related": product["related"],
        }, url
    # A product whose price was withdrawn fails the schema's required number, by name.
    for i in withdrawn:
        letter = dead[urls[i]]
        assert (letter["stage"], letter["reason"]) == ("parse", "item_invalid")
        assert letter["detail"] == "field 'amount' is required, and is null (nothing matched)"
    # An HTML page in a JMESPath job is not JSON: dead, naming the first field that reads JSON.
    assert (dead[html]["stage"], dead[html]["reason"]) == ("parse", "not_json")
    assert dead[html]["detail"].startswith("field 'id' reads JSON, and the page is not JSON: Expecting value")


PRICES = spec(r"""
fields:
  title: "css:title::text"
  price: {css: "span.price::text", re: '[0-9]+\.[0-9]{2}'}
  euros: {xpath: "//span[@class='price']/text()", re: '([0-9]+)\.'}
  number: {css: "title::text", re: '(?P<extract>[0-9]+)$'}
  cents: {css: "span.price::text", re: '\.([0-9])([0-9])', many: true}
  linked: {css: "a::attr(href)", re: '/page/([0-9]+)', many: true}
item:
  price: {type: number, required: true}
  euros: {type: integer, required: true}
  number: {type: integer, required: true}
""")


async def test_prices_cut_out_with_re_are_stored_as_numbers_and_a_page_without_one_is_dead_naming_it(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites[SITE].base_url
    pages = {f"{base}/page/{i}": i for i in range(10)}
    json_page = f"{base}/api/products/2.json"  # no span.price in it: the required price is null
    await submit_urls(settings, "prices", [*pages, json_page], PRICES)
    counts = await services.wait_done("prices", timeout=120)
    assert (counts.stored, counts.dead, counts.pending) == (len(pages), 1, 0)
    states, dead, items = ended(settings, "prices")
    for url, i in pages.items():
        assert states[url] == "stored", url
        page = expected_page(SITE, i)
        euros, cents = page["price"].split(".")
        assert items[url] == {
            "url": url,
            "title": page["title"],
            "price": float(page["price"]),
            "euros": int(euros),
            "number": i,
            "cents": list(cents),
            "linked": [link.rsplit("/", 1)[1] for link in page["links"]],
        }, url
        assert isinstance(items[url]["price"], float) and isinstance(items[url]["euros"], int)
    assert states[json_page] == "dead"
    assert (dead[json_page]["stage"], dead[json_page]["reason"]) == ("parse", "item_invalid")
    assert dead[json_page]["detail"] == "field 'price' is required, and is null (nothing matched)"


BACKTRACKING = spec(r"""
fields:
  title: "css:title::text"
  words: {css: "p.desc::text", re: '^(\w+\s?)*$'}
""")


async def test_a_regex_that_backtracks_without_end_goes_dead_as_parse_timeout_and_the_parser_goes_on(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites[SITE].base_url
    slow = f"{base}/page/5"  # every description ends in a full stop: `$` never matches after it
    await submit_urls(settings, "backtracking", [slow], BACKTRACKING)
    counts = await services.wait_done("backtracking", timeout=120)
    assert (counts.dead, counts.pending) == (1, 0)
    _, dead, _ = ended(settings, "backtracking")
    assert (dead[slow]["stage"], dead[slow]["reason"]) == ("parse", "parse_timeout")
    assert dead[slow]["detail"] == f"extraction passed {PARSE_TIMEOUT:g}s"
    # The parser whose worker was killed serves the next job.
    after = f"{base}/page/6"
    await submit_urls(settings, "after-backtracking", [after], PRICES)
    done = await services.wait_done("after-backtracking", timeout=60)
    assert (done.stored, done.pending) == (1, 0)
    assert ended(settings, "after-backtracking")[2][after]["number"] == 6
