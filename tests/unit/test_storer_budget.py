"""The storer watches each job's proxy budget: the outcome events that bring its spend to the
budget pause it through the jobs stream (reason `budget`), once, and a storer that stopped
before pausing pauses it when the event comes again."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.amqp import PublishFailed
from hutch.models import AnyEvent, Event, EventBatch, JobControl
from hutch.services.storer.app import Storer
from hutch.services.storer.writer import GroupWriter
from hutch.settings import Settings
from hutch.store import AsyncStore

from .wiring import RecordingBroker, delivery


@pytest.fixture
async def storer(tmp_path: Path) -> AsyncIterator[tuple[Storer, RecordingBroker]]:
    service = Storer(Settings(data_dir=tmp_path))
    broker = RecordingBroker(service.settings)
    service.broker = broker  # type: ignore[assignment]
    service.store = await AsyncStore(service.settings.store_location).open()
    service.writer = GroupWriter(service.store.run, batch=16, wait=0.0, retry_seconds=0.3, clock=time.monotonic).start()
    await service.store.run(lambda s: s.add_job("j", {"fields": {}, "budget": 0.005}))
    await service.store.run(lambda s: s.add_tasks([(f"t{n}", "j", f"http://a.test/{n}", "a.test") for n in range(9)]))
    yield service, broker
    await service.writer.close()
    await service.store.close()


def outcome(n: int, cost: float = 0.002) -> Event:
    return Event(
        kind="outcome", task_id=f"t{n}", job="j", domain="a.test", attempt=1, at=1000.0 + n, outcome="ok",
        proxy_id="px-1", tier="residential", cost=cost, next="retry", delay=1.0,
    )  # fmt: skip


def pauses(broker: RecordingBroker) -> list[JobControl]:
    return [p.as_(JobControl) for p in broker.published if p.routing_key == broker.topology.jobs]


async def handle(service: Storer, *events: Event) -> None:
    message = AnyEvent(EventBatch(events=list(events)) if len(events) > 1 else events[0])
    await service._on_event(message, delivery(message))


async def test_the_event_that_reaches_the_budget_pauses_the_job_through_the_jobs_stream(
    storer: tuple[Storer, RecordingBroker],
) -> None:
    service, broker = storer
    await handle(service, outcome(1), outcome(2))  # 0.004 of 0.005
    assert pauses(broker) == []
    await handle(service, outcome(3))  # 0.006
    (record,) = pauses(broker)
    assert (record.job, record.action, record.reason) == ("j", "pause", "budget")
    (counts,) = await service.store.run(lambda s: s.counts("j"))
    assert (counts.state, counts.reason, counts.spent) == ("paused", "budget", 0.006)
    await handle(service, outcome(4), outcome(5))  # attempts in flight when it paused: counted, no second record
    assert len(pauses(broker)) == 1
    assert (await service.store.run(lambda s: s.counts("j")))[0].spent == 0.01


async def test_a_storer_that_could_not_pause_pauses_when_the_event_comes_again(
    storer: tuple[Storer, RecordingBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, broker = storer

    async def refused(*args: object, **kwargs: object) -> None:
        raise PublishFailed("not confirmed")

    monkeypatch.setattr(broker, "publish", refused)
    with pytest.raises(PublishFailed):  # the AMQP layer puts the event back on its queue
        await handle(service, outcome(1, cost=0.01))
    monkeypatch.undo()
    await handle(service, outcome(1, cost=0.01))  # the same event again: no new spend, but a pause
    assert [(r.action, r.reason) for r in pauses(broker)] == [("pause", "budget")]
    assert (await service.store.run(lambda s: s.job_budget("j"))) == (0.005, 0.01)


async def test_a_resumed_job_with_a_raised_budget_goes_on_until_it_reaches_that(
    storer: tuple[Storer, RecordingBroker],
) -> None:
    service, broker = storer
    await handle(service, outcome(1, cost=0.005))
    await service._on_job_control(JobControl(job="j", action="resume", budget=0.008), delivery())
    await handle(service, outcome(2))
    assert len(pauses(broker)) == 1
    await handle(service, outcome(3))
    assert len(pauses(broker)) == 2
