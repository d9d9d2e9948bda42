"""Requests per tier and estimated proxy cost per job and domain, from the store's attempts."""

from __future__ import annotations

import pytest

from hutch.models import Event
from hutch.services.proxy_manager.costs import cost_summary
from hutch.store import Store


@pytest.fixture
def store(store_location: str) -> Store:
    s = Store(store_location)
    s.add_tasks(
        [
            ("a1", "shop-job", "http://shop/1", "shop"),
            ("a2", "shop-job", "http://shop/2", "shop"),
            ("b1", "shop-job", "http://news/1", "news"),
            ("c1", "other", "http://news/9", "news"),
        ]
    )
    return s


def attempt(store: Store, task: str, n: int, at: float, outcome: str, **lease: object) -> None:
    domain = "shop" if task.startswith("a") else "news"
    store.apply_event(
        Event(kind="outcome", task_id=task, job="?", domain=domain, attempt=n, at=at, outcome=outcome, **lease)
    )


DC = {"proxy_id": "px-dc1", "tier": "datacenter", "cost": 0.0001}
RES = {"proxy_id": "px-res1", "tier": "residential", "cost": 0.001}


def test_requests_and_cost_are_summed_per_job_domain_and_tier(store: Store) -> None:
    attempt(store, "a1", 1, 1.0, "blocked", **DC)
    attempt(store, "a1", 2, 2.0, "ok", **RES)
    attempt(store, "a2", 1, 3.0, "ok", **RES)
    attempt(store, "b1", 1, 4.0, "ok", **DC)
    attempt(store, "c1", 1, 5.0, "server_error", **DC)
    attempt(store, "c1", 2, 6.0, "ok", **DC)
    assert cost_summary(store) == [
        {"job": "other", "domain": "news", "tier": "datacenter", "requests": 2, "ok": 1, "cost": 0.0002},
        {"job": "shop-job", "domain": "news", "tier": "datacenter", "requests": 1, "ok": 1, "cost": 0.0001},
        {"job": "shop-job", "domain": "shop", "tier": "datacenter", "requests": 1, "ok": 0, "cost": 0.0001},
        {"job": "shop-job", "domain": "shop", "tier": "residential", "requests": 2, "ok": 2, "cost": 0.002},
    ]


def test_one_job_only_when_named(store: Store) -> None:
    attempt(store, "a1", 1, 1.0, "ok", **RES)
    attempt(store, "c1", 1, 2.0, "ok", **DC)
    assert [(r["job"], r["tier"]) for r in cost_summary(store, "other")] == [("other", "datacenter")]
    assert cost_summary(store, "nobody") == []


def test_events_of_tasks_returned_without_a_request_are_not_requests(store: Store) -> None:
    attempt(store, "a1", 0, 1.0, "permit_expired")
    attempt(store, "a1", 0, 2.0, "no_lease")
    attempt(store, "a1", 0, 3.0, "no_proxy")
    attempt(store, "a1", 0, 4.0, "redelivered")
    attempt(store, "a1", 1, 5.0, "forbidden_target", **DC)
    assert cost_summary(store) == []


def test_direct_attempts_count_as_requests_of_tier_direct_at_no_cost(store: Store) -> None:
    attempt(store, "b1", 1, 1.0, "timeout")
    attempt(store, "b1", 2, 2.0, "ok")
    assert cost_summary(store) == [
        {"job": "shop-job", "domain": "news", "tier": "direct", "requests": 2, "ok": 1, "cost": 0.0}
    ]


def test_tiers_are_listed_cheapest_first(store: Store) -> None:
    attempt(store, "a1", 1, 1.0, "ok", proxy_id="px-m", tier="mobile", cost=0.003)
    attempt(store, "a1", 2, 2.0, "ok", **RES)
    attempt(store, "a1", 3, 3.0, "ok", **DC)
    assert [r["tier"] for r in cost_summary(store)] == ["datacenter", "residential", "mobile"]
