"""The fetcher's wiring with a recording broker: where each outcome sends the task, and what
the events say. The HTTP side is `fetch`'s (tests/unit/test_fetch.py); the decisions are the
policy's (tests/unit/test_policy.py); here, that the two meet the queues as they should."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hutch.models import Event, Lease, Page, Permit, Task
from hutch.services.fetcher.app import Fetcher
from hutch.services.fetcher.fetch import NotSent
from hutch.services.fetcher.policy import FetchResult, decide
from hutch.settings import Settings
from hutch.topology import outcome_key

from .wiring import RecordingBroker, delivery, worker

DOMAIN = "shop.example"


@pytest.fixture
def fetcher() -> tuple[Fetcher, RecordingBroker]:
    return worker(Fetcher, Settings(namespace="wiring", use_proxy_manager=False))


def task(**fields: object) -> Task:
    permit = Permit(id="gov.1", issued=time.time(), expires=time.time() + 30)
    values: dict[str, object] = {"id": "t1", "job": "j", "url": f"http://{DOMAIN}/a", "domain": DOMAIN}
    values["permit"] = permit
    values.update(fields)
    return Task(**values)  # type: ignore[arg-type]


async def route(f: Fetcher, t: Task, result: FetchResult) -> None:
    decision = decide(result, t.attempts, t.history, f.policy, f.broker.topology.retry_delays, lambda: 0.5,
                      redirects=t.redirects, url=t.fetch_url or t.url)
    await f._route(t, Lease(direct=True), result, decision)


def the_event(broker: RecordingBroker) -> Event:
    (published,) = broker.to(broker.topology.events)
    assert published.routing_key == outcome_key(DOMAIN, proxied=False)
    return published.as_(Event)


async def test_a_page_goes_to_the_parsers_and_the_event_says_so(fetcher: tuple[Fetcher, RecordingBroker]) -> None:
    f, broker = fetcher
    body = b"<html><title>A</title></html>"
    await route(f, task(), FetchResult("ok", 0.1, status=200, body=body, content_type="text/html; charset=utf-8"))
    (sent,) = broker.to(broker.topology.work)
    page = sent.as_(Page)
    assert (sent.routing_key, page.status, page.text, page.task.attempts) == ("parse", 200, body.decode(), 1)
    assert [a.outcome for a in page.task.history] == ["ok"] and page.task.permit is None
    event = the_event(broker)
    assert (event.outcome, event.next, event.permit_id, event.task_id) == ("ok", "parse", None, "t1")


async def test_a_timeout_waits_in_a_delay_tier_under_its_shard_key(fetcher: tuple[Fetcher, RecordingBroker]) -> None:
    f, broker = fetcher
    await route(f, task(), FetchResult("timeout", 5.0, detail="ReadTimeout"))
    topology = broker.topology
    retried = [p for p in broker.published if p.exchange.startswith(f"{topology.prefix}retry.")]
    assert len(retried) == 1 and retried[0].routing_key == topology.shard_key(DOMAIN)
    back = retried[0].as_(Task)
    assert (back.attempts, back.history[-1].outcome, back.permit) == (1, "timeout", None)
    assert retried[0].exchange == topology.tier_exchange(back.history[-1].delay or 0)
    event = the_event(broker)
    assert (event.next, event.delay) == ("retry", back.history[-1].delay)


async def test_a_redirect_goes_back_to_the_frontier_for_the_new_domain_unspent(
    fetcher: tuple[Fetcher, RecordingBroker],
) -> None:
    f, broker = fetcher
    await route(f, task(), FetchResult("redirect", 0.1, status=302, location="http://Other.example/b"))
    (sent,) = broker.to(broker.topology.frontier)
    moved = sent.as_(Task)
    assert sent.routing_key == broker.topology.shard_key("other.example")
    assert (moved.fetch_url, moved.domain, moved.redirects, moved.attempts) == (
        "http://other.example/b", "other.example", 1, 0,
    )
    (published,) = broker.to(broker.topology.events)
    assert published.as_(Event).next == "frontier"


async def test_a_permanent_failure_is_a_dead_letter_of_the_fetch_stage(
    fetcher: tuple[Fetcher, RecordingBroker],
) -> None:
    f, broker = fetcher
    await route(f, task(), FetchResult("not_found", 0.1, status=404, detail="HTTP 404"))
    (dead,) = broker.dead
    assert (dead.stage, dead.reason, dead.detail) == ("fetch", "not_found", "HTTP 404")
    assert dead.task is not None and dead.task.attempts == 1
    assert broker.to(broker.topology.work) == [] and the_event(broker).next == "dead"


async def test_an_expired_permit_sends_the_task_back_unspent_without_fetching(
    fetcher: tuple[Fetcher, RecordingBroker],
) -> None:
    f, broker = fetcher
    stale = task(permit=Permit(id="gov.1", issued=time.time() - 60, expires=time.time() - 1))
    await f._on_task(stale, delivery(stale))
    (sent,) = broker.to(broker.topology.frontier)
    back = sent.as_(Task)
    assert (back.permit, back.attempts, back.history) == (None, 0, [])
    event = the_event(broker)
    assert (event.outcome, event.next) == ("permit_expired", "frontier")
    assert f.busy == 0


async def test_a_permit_late_at_the_first_byte_sends_the_task_back_unspent_and_frees_the_slot(
    fetcher: tuple[Fetcher, RecordingBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    f, broker = fetcher
    asked: list[bool] = []

    async def withdrawn(t: Task, lease: Lease, on_time: Callable[[], bool]) -> FetchResult:
        asked.append(on_time())  # on time when the fetch starts...
        raise NotSent("http11.send_request_headers.started")  # ...and late at the wire

    monkeypatch.setattr(f, "_fetch", withdrawn)
    fresh = task()
    await f._on_task(fresh, delivery(fresh))
    assert asked == [True]
    (sent,) = broker.to(broker.topology.frontier)
    back = sent.as_(Task)
    assert (back.permit, back.attempts, back.history) == (None, 0, [])
    event = the_event(broker)
    assert (event.outcome, event.next) == ("permit_late", "frontier")
    assert f.busy == 0


async def test_a_task_that_crashed_a_fetcher_spends_an_attempt_before_any_permit_check(
    fetcher: tuple[Fetcher, RecordingBroker],
) -> None:
    f, broker = fetcher
    stale = task(permit=None)
    await f._on_task(stale, delivery(stale, crashes=2))
    event = the_event(broker)
    assert (event.outcome, event.next) == ("crashed", "retry")
    (retried,) = [p for p in broker.published if p.exchange.startswith(f"{broker.topology.prefix}retry.")]
    assert retried.as_(Task).attempts == 1
