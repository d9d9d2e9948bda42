"""Job controls through a real RabbitMQ: `hutch pause|resume|cancel|weight` and `submit --weight`
append confirmed records to the `jobs` stream, and the storer records each job's state from it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aio_pika.abc import AbstractIncomingMessage

from hutch.amqp import Broker
from hutch.models import DeadLetter, JobControl, Submission, Task, decode
from hutch.services.control.cli import main
from hutch.services.control.jobs import append_control, control_record
from hutch.services.storer.app import Storer
from hutch.settings import Settings
from hutch.store import Store

pytestmark = pytest.mark.timeout(90)


async def read_jobs_stream(settings: Settings, count: int, wait: float = 15.0) -> list[JobControl]:
    """The first `count` records of the namespace's jobs stream (fewer if no more come in `wait`)."""
    broker = await Broker(settings, "test-read-jobs").connect()
    records: list[JobControl] = []
    enough = asyncio.Event()
    try:
        channel = await broker.channel(prefetch=100)
        queue = await channel.get_queue(broker.topology.jobs, ensure=False)

        async def on_record(message: AbstractIncomingMessage) -> None:
            records.append(decode(message.body, JobControl))
            await message.ack()
            if len(records) >= count:
                enough.set()

        await queue.consume(on_record, arguments={"x-stream-offset": "first"})
        try:
            await asyncio.wait_for(enough.wait(), wait)
        except TimeoutError:
            pass
        await channel.close()
    finally:
        await broker.close()
    return records


def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    for name, value in settings.to_env(os.environ).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return int(done.value.code or 0)


def known_job(settings: Settings, job: str) -> None:
    store = Store(settings.store_location)
    try:
        store.add_job(job, None)
    finally:
        store.close()


async def declared(settings: Settings) -> None:
    await (await Broker(settings, "test-declare").connect()).close()


def test_pause_resume_cancel_and_weight_commands_append_their_records_in_order(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(declared(settings))
    known_job(settings, "crawl")
    started = time.time()
    for argv in (["pause", "crawl"], ["weight", "crawl", "2.5"], ["resume", "crawl"], ["cancel", "crawl"]):
        assert cli(settings, monkeypatch, *argv) == 0, capsys.readouterr().err
    records = asyncio.run(read_jobs_stream(settings, 4))
    assert [(r.job, r.action, r.weight) for r in records] == [
        ("crawl", "pause", None),
        ("crawl", "weight", 2.5),
        ("crawl", "resume", None),
        ("crawl", "cancel", None),
    ]
    assert all(r.at >= started for r in records)
    assert [r.at for r in records] == sorted(r.at for r in records)


def test_a_refused_control_appends_nothing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(declared(settings))
    known_job(settings, "crawl")
    assert cli(settings, monkeypatch, "pause", "nosuchjob") == 2
    assert "no job named 'nosuchjob'" in capsys.readouterr().err
    assert cli(settings, monkeypatch, "cancel", "crawl") == 0
    assert cli(settings, monkeypatch, "resume", "crawl") == 2  # cancelled: no way back
    records = asyncio.run(read_jobs_stream(settings, 2, wait=3.0))
    assert [(r.job, r.action) for r in records] == [("crawl", "cancel")]


async def intake_waiting(settings: Settings) -> list[tuple[Submission, float]]:
    """The submissions waiting on the intake queue (nothing consumes here), with when each was sent."""
    broker = await Broker(settings, "test-intake").connect()
    found = []
    try:
        channel = await broker.channel()
        queue = await channel.declare_queue(broker.topology.intake, passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            assert message.timestamp is not None
            sent = message.timestamp.timestamp()
            found.append((broker.decode(message.body, message.content_encoding, Submission), sent))
    finally:
        await broker.close()
    return found


def test_submit_with_a_weight_appends_the_weight_before_sending_its_urls(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.example/1\nhttp://b.example/2\n")
    assert cli(settings, monkeypatch, "submit", str(urls), "--job", "heavy", "--weight", "7") == 0
    (record,) = asyncio.run(read_jobs_stream(settings, 1))
    assert (record.job, record.action, record.weight) == ("heavy", "weight", 7.0)
    ((submission, sent),) = asyncio.run(intake_waiting(settings))
    assert (submission.job, submission.urls) == ("heavy", ["http://a.example/1", "http://b.example/2"])
    assert int(record.at) <= sent  # AMQP timestamps are whole seconds


@pytest.fixture
async def storer(settings: Settings) -> AsyncIterator[Storer]:
    service = Storer(settings)
    await service.connect(wait=False)
    await service.start()
    try:
        yield service
    finally:
        await service.shutdown()


async def wait_state(settings: Settings, job: str, expected: tuple[str, float], wait: float = 20.0) -> None:
    deadline = time.monotonic() + wait
    while True:
        store = Store(settings.store_location)
        try:
            found = store.job_state(job)
        finally:
            store.close()
        if found == expected:
            return
        assert time.monotonic() < deadline, f"job {job} is {found} in the store, not {expected}"
        await asyncio.sleep(0.1)


async def test_the_storer_records_each_jobs_newest_state_and_weight_from_the_stream(
    settings: Settings, storer: Storer
) -> None:
    broker = await Broker(settings, "test-controls").connect()
    try:
        for job, action, weight in (
            ("a", "pause", None),
            ("b", "weight", 3.0),
            ("a", "resume", None),
            ("c", "cancel", None),
            ("a", "pause", None),
        ):
            await append_control(broker, control_record(job, action, weight))  # type: ignore[arg-type]
    finally:
        await broker.close()
    await wait_state(settings, "a", ("paused", 1.0))
    await wait_state(settings, "b", ("running", 3.0))
    await wait_state(settings, "c", ("cancelled", 1.0))


async def test_a_storer_started_later_reads_the_stream_from_its_first_record(settings: Settings) -> None:
    broker = await Broker(settings, "test-controls").connect()
    try:
        await append_control(broker, control_record("early", "pause"))
        await append_control(broker, control_record("early", "weight", 0.5))
    finally:
        await broker.close()
    for _ in range(2):  # and again after a restart: the same state, nothing doubled
        service = Storer(settings)
        await service.connect(wait=False)
        await service.start()
        try:
            await wait_state(settings, "early", ("paused", 0.5))
        finally:
            await service.shutdown()
    assert len(await read_jobs_stream(settings, 3, wait=3.0)) == 2


async def test_the_storer_removes_jobs_done_for_longer_than_the_retention(settings: Settings, storer: Storer) -> None:
    storer.settings = settings.model_copy(update={"retention": 60.0})
    store = Store(settings.store_location)
    try:
        for job in ("stale", "recent"):
            store.add_job(job, None)
            task = Task(id=f"{job}1", job=job, url=f"http://{job}.example/", domain=f"{job}.example")
            store.add_tasks([(task.id, job, task.url, task.domain)])
            store.record_dead(DeadLetter(stage="fetch", reason="not_found", detail="", task=task), job)
        store.db.execute("UPDATE tasks SET updated_at = ? WHERE job = 'stale'", (time.time() - 120,))
        store.db.commit()
    finally:
        store.close()
    assert await storer.expire_jobs() == ["stale"]
    store = Store(settings.store_location)
    try:
        assert [c.job for c in store.counts()] == ["recent"]
        assert not store.job_exists("stale") and store.dead_entries(job="stale") == []
    finally:
        store.close()
