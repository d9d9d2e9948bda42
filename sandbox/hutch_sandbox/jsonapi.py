"""A site's JSON API: `/api/products/<i>.json`, the same catalogue as its HTML pages.

Many sites serve their data as JSON beside (or instead of) HTML, and a spec reads it with
JMESPath. Product <i> is page <i> (`expected_page`) as a nested document, so a test can
predict every value with `expected_product`:

    {"product": {"id": 3, "name": "Quiet Teapot 3", "maker": {"name": "Müller"},
                 "price": {"amount": 12.5, "currency": "EUR", "display": "12.50 EUR"},
                 "tags": ["quiet", "river"], "variants": [{"sku": "P3-S", "stock": 4}, ...],
                 "related": ["/api/products/2.json", ...]}}

Every seventh product (i % 7 == 6) has its price withdrawn: `"price": null`, the gap a
schema with a required price must catch. An index at or past the site's page count is a 404
with a JSON error body. These answers skip the site's faults and latency, like every fixed path.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hutch_sandbox.pages import expected_page
from hutch_sandbox.site import Outcome, Reply

__all__ = ["JSON", "answer", "expected_product"]

JSON = "application/json"
_PRODUCT = re.compile(r"products/(0|[1-9][0-9]{0,8})\.json")


def expected_product(site_name: str, i: int) -> dict[str, Any]:
    """The document `/api/products/<i>.json` serves on site `site_name`, as Python values."""
    page = expected_page(site_name, i)
    noun, _, maker = page["h1"].partition(" by ")
    words = page["description"].rstrip(".").lower().split()
    price = None
    if i % 7 != 6:
        price = {"amount": float(page["price"]), "currency": "EUR", "display": f"{page['price']} EUR"}
    sizes = ("S", "M", "L")[: 1 + i % 3]
    return {
        "product": {
            "id": i,
            "name": page["title"],
            "kind": noun,
            "maker": {"name": maker},
            "price": price,
            "tags": sorted(set(words[:3])),
            "variants": [{"sku": f"P{i}-{size}", "stock": (i + k) % 5} for k, size in enumerate(sizes)],
            "related": [f"/api/products/{link.rsplit('/', 1)[1]}.json" for link in page["links"]],
        }
    }


def answer(site_name: str, pages: int, rest: str) -> Outcome | None:
    """The answer for `/api/<rest>`, or None when `rest` names nothing here."""
    match = _PRODUCT.fullmatch(rest)
    if match is None:
        return None
    i = int(match[1])
    if i >= pages:
        return Reply(404, json.dumps({"error": f"no product {i}"}).encode(), JSON)
    document = json.dumps(expected_product(site_name, i), ensure_ascii=False)
    return Reply(200, document.encode("utf-8"), JSON)
