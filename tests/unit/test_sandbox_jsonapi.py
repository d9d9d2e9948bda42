"""The sandbox's JSON API: /api/products/<i>.json is page <i> as a predictable JSON document."""

from __future__ import annotations

import json

from hutch_sandbox import expected_page
from hutch_sandbox.jsonapi import JSON, answer, expected_product
from hutch_sandbox.site import Reply


def served(rest: str, pages: int = 20) -> Reply:
    found = answer("shop", pages, rest)
    assert isinstance(found, Reply)
    return found


def test_a_product_is_its_page_as_nested_json() -> None:
    reply = served("products/3.json")
    assert (reply.status, reply.content_type) == (200, JSON)
    document = json.loads(reply.body)
    assert document == expected_product("shop", 3)
    page = expected_page("shop", 3)
    product = document["product"]
    assert product["id"] == 3 and product["name"] == page["title"]
    assert page["h1"] == f"{product['kind']} by {product['maker']['name']}"
    assert product["price"]["amount"] == float(page["price"])
    assert product["price"]["display"] == f"{page['price']} EUR"
    assert [v["sku"] for v in product["variants"]] == ["P3-S"]
    assert product["related"] == [f"/api/products/{link.rsplit('/', 1)[1]}.json" for link in page["links"]]


def test_every_seventh_product_has_its_price_withdrawn() -> None:
    assert [i for i in range(20) if expected_product("shop", i)["product"]["price"] is None] == [6, 13]


def test_the_body_is_utf8_with_non_ascii_text_as_it_is() -> None:
    names = [json.loads(served(f"products/{i}.json").body)["product"]["name"] for i in range(20)]
    assert any(not name.isascii() for name in names)
    assert all(not served(f"products/{i}.json").body.isascii() for i in range(20) if not names[i].isascii())


def test_a_product_past_the_page_count_is_a_json_404() -> None:
    reply = served("products/20.json")
    assert (reply.status, json.loads(reply.body)) == (404, {"error": "no product 20"})


def test_other_paths_under_api_are_not_answered_here() -> None:
    for rest in ("products/3", "products/03.json", "products/x.json", "items/1.json", "products/1.json/x"):
        assert answer("shop", 20, rest) is None, rest
