"""The governor's wiring with a recording broker: a task taken from a shard is held, released
into `fetch.ready` with its permit when the fleet has a free slot, and waits at the capacity
gate while it has none, until an outcome frees one. The decisions themselves are the core's
(tests/unit/test_governor_core.py, under a fake clock); here, that the handlers, the
dispatcher and the publishes meet as they should."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest

from hutch.amqp import PublishFailed
from hutch.models import Event, FetcherHeartbeat, Parked, Task
from hutch.services.governor.app import Governor
from hutch.services.governor.lines import Held, JobLine, JobState
from hutch.settings import Settings
from hutch.topology import FETCH_KEY, HEARTBEAT, outcome_key

from .wiring import RecordingBroker, delivery, worker

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def governor() -> AsyncIterator[tuple[Governor, RecordingBroker]]:
    g, broker = worker(Governor, Settings(namespace="wiring", rate=1000.0, respect_robots=False))
    g._publisher = itertools.cycle([broker])  # type: ignore[assignment]  # releases go out here too
    dispatching = asyncio.create_task(g._dispatch())
    try:
        yield g, broker
    finally:
        dispatching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dispatching


def task(n: int, domain: str) -> Task:
    return Task(id=f"t{n}", job="j", url=f"http://{domain}/{n}", domain=domain)


def released(broker: RecordingBroker) -> list[Task]:
    return [p.as_(Task) for p in broker.to(broker.topology.work) if p.routing_key == FETCH_KEY]


async def soon(predicate: Callable[[], bool]) -> None:
    """Let the loop run until `predicate` holds, for at most 2.5 s (the caller asserts)."""
    for _ in range(250):
        if predicate():
            return
        await asyncio.sleep(0.01)


async def heartbeat(g: Governor, slots: int) -> None:
    beat = FetcherHeartbeat(fetcher="f1", concurrency=slots, busy=0)
    await g._on_event(delivery(beat, routing_key=HEARTBEAT))


async def test_a_task_from_a_shard_is_released_with_its_permit(governor: tuple[Governor, RecordingBroker]) -> None:
    g, broker = governor
    await heartbeat(g, 4)
    await asyncio.wait_for(g._on_task(task(1, "a.example"), delivery()), 5)
    (out,) = released(broker)
    assert out.id == "t1" and out.permit is not None and out.permit.id.startswith(g.id)
    assert out.permit.expires > out.permit.issued


async def test_with_every_slot_in_use_a_task_waits_at_the_gate_until_an_outcome_frees_one(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    g, broker = governor
    await heartbeat(g, 1)
    await asyncio.wait_for(g._on_task(task(1, "a.example"), delivery()), 5)
    (first,) = released(broker)
    second = asyncio.create_task(g._on_task(task(2, "b.example"), delivery()))
    await asyncio.sleep(0.3)  # several turns of the dispatcher: the fleet's one slot is taken
    assert not second.done() and len(released(broker)) == 1
    assert first.permit is not None
    outcome = Event(kind="outcome", task_id="t1", job="j", domain="a.example", attempt=1, outcome="ok",
                    permit_id=first.permit.id, next="parse")
    await g._on_event(delivery(outcome, routing_key=outcome_key("a.example", proxied=False)))
    await asyncio.wait_for(second, 5)
    assert [t.id for t in released(broker)] == ["t1", "t2"]


async def test_a_robots_task_given_back_takes_no_share_of_its_domain_from_the_job_behind_it(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    # A fetcher gives a robots.txt task back to the frontier when its permit came late: held
    # in the domain's line, it must not count as a second job, or the job's backlog arriving
    # meanwhile is parked for twice as long as its share of the rate says.
    g, _ = governor
    domain = "a.example"
    line = g._line(domain)
    job_line = line.jobs["j"] = JobLine()
    job_line.held.append(Held(task(1, domain), delivery(), 0.0, asyncio.get_running_loop().create_future()))
    robots = g.core.robots_task("http://a.example", domain)
    robots_line = line.jobs[robots.job] = JobLine()
    robots_line.held.append(Held(robots, delivery(), 0.0, asyncio.get_running_loop().create_future()))
    assert g._share(domain, line, "j") == pytest.approx(g.core.rate_of(domain))
    # A second job does share it.
    line.jobs["k"] = JobLine(held=collections.deque([Held(task(2, domain), delivery(), 0.0,
                                                          asyncio.get_running_loop().create_future())]))
    assert g._share(domain, line, "j") == pytest.approx(g.core.rate_of(domain) / 2)


async def test_a_domain_idle_for_want_of_its_parks_gets_them_back_even_while_the_fleet_is_full(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    """Taking parks back costs a publish per `Parked`: it no longer waits for the fleet to
    have room, which left a domain parked long in its first seconds with a tail of its own
    when the others finished."""
    g, _ = governor
    await heartbeat(g, 1)
    await asyncio.wait_for(g._on_task(task(1, "a.example"), delivery()), 5)  # the one slot in use
    now = time.time()
    assert not g.core.capacity_free(now)
    line = g._line("b.example")
    line.jobs["j"] = JobLine(returns={int(now) + 20: 30})
    line.parked_at(30.0, now + 20)
    assert g._starved(now) == (30, [30.0], {"b.example"})
    # A domain that holds a task is not idle, whatever it has parked.
    line.jobs["j"].held.append(Held(task(2, "b.example"), delivery(), now, asyncio.get_running_loop().create_future()))
    assert g._starved(now) == (0, [], set())


def test_a_task_past_its_hold_stays_held_only_with_nothing_waiting_in_its_shard_and_half_the_window_free(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    g, broker = governor
    domain = "alone.example"
    shard = broker.topology.shard_of(domain)
    window = g.settings.frontier_window
    assert not g._nothing_behind(domain)  # not looked at yet: parked as before
    g._shard_ready[shard] = 3
    assert not g._nothing_behind(domain)  # tasks wait behind: a park is how they are reached
    g._shard_ready[shard] = 0
    assert g._nothing_behind(domain)
    g._in_window[shard] = window // 2 - 1
    assert g._nothing_behind(domain)
    g._in_window[shard] = window // 2  # half the window kept free for what comes in next
    assert not g._nothing_behind(domain)
    g._in_window[shard] = 0
    g._pinned = g._pinned_max // 8  # a bound on the memory held past the holds
    assert not g._nothing_behind(domain)
    g._pinned = 0
    assert g._nothing_behind(domain)
    # Past the hold, at most the domain's pace over the hold's horizon (the hold again until
    # its pace is known).
    assert g.settings.hold_horizon == 5.0
    assert g._room_alone(80.0, 64) == 400 and g._room_alone(None, 64) == 64
    other = next(d for d in (f"d{n}.example" for n in range(100)) if broker.topology.shard_of(d) != shard)
    assert not g._nothing_behind(other)  # its own shard was not looked at


async def test_a_message_from_a_shard_counts_in_its_window_until_its_task_is_released(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    g, broker = governor
    await heartbeat(g, 0)  # no slot: the task stays held
    domain = "window.example"
    shard = broker.topology.shard_of(domain)
    handling = asyncio.create_task(g._on_task(task(1, domain), delivery()))
    await asyncio.sleep(0.2)
    assert g._in_window[shard] == 1 and not handling.done()
    await heartbeat(g, 1)
    await asyncio.wait_for(handling, 5)
    assert g._in_window[shard] == 0 and len(released(broker)) == 1


def unreleased(task_id: str) -> list[Task]:
    """The copies of a task, without a permit, still in memory (a released copy has one)."""
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, Task) and o.id == task_id and o.permit is None]


async def test_a_parked_message_lets_go_of_each_task_once_it_is_released(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    """A `Parked` is acked only when its last task is released; the tasks released before
    that are not kept in memory for it (one with a spec is about 5 KB), nor counted against
    the bound on those tasks; its body is, until the end."""
    g, broker = governor
    await heartbeat(g, 1)  # one slot: the first task goes, the second waits
    domain = "parked.example"
    parked = Parked(tasks=[task(1, domain), task(2, domain)])
    handling = asyncio.create_task(g._on_parked(parked, delivery(parked)))
    await soon(lambda: bool(released(broker)))
    assert [t.id for t in released(broker)] == ["t1"] and not handling.done()
    assert parked.tasks == [] and g._pinned == 1 and g._pinned_bytes > 0
    assert unreleased("t1") == [] and len(unreleased("t2")) == 1
    await heartbeat(g, 2)
    await asyncio.wait_for(handling, 5)
    assert [t.id for t in released(broker)] == ["t1", "t2"] and (g._pinned, g._pinned_bytes) == (0, 0)


async def test_a_parked_message_that_fails_gets_its_tasks_back_for_the_dead_letters_at_the_end(
    governor: tuple[Governor, RecordingBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layer makes one dead letter per task of a message that failed `max_failures`
    times: a failure gives the message its tasks back, decoded from its body."""
    g, broker = governor
    g.jobs["gone"] = JobState(state="cancelled")

    async def refused(*_: object) -> None:
        raise PublishFailed("nacked")

    monkeypatch.setattr(broker, "publish_dead", refused)
    domain = "failing.example"
    parked = Parked(tasks=[Task(id=f"g{n}", job="gone", url=f"http://{domain}/{n}", domain=domain) for n in range(3)])
    with pytest.raises(PublishFailed):
        await asyncio.wait_for(g._on_parked(parked, delivery(parked)), 5)
    assert [t.id for t in parked.tasks] == ["g0", "g1", "g2"]
    assert (g._pinned, g._pinned_bytes) == (0, 0)


async def test_one_copy_of_a_task_out_of_a_crashed_parked_goes_on_and_another_only_once_its_holder_is_gone(
    governor: tuple[Governor, RecordingBroker],
) -> None:
    """After a governor died holding a `Parked`, the first copy of each of its tasks taken is
    the one that goes on (marked `maybe_done`); a copy that comes while it is held, or after
    it went on, is let go. One whose holder's channel closed (the broker has that copy
    again) is taken in its place, and the old holder letting go later changes nothing."""
    g, broker = governor
    domain = "copies.example"
    await heartbeat(g, 1)
    await asyncio.wait_for(g._on_task(task(0, "other.example"), delivery()), 5)  # the one slot
    g._watch_copies([task(1, domain)])
    first = delivery()
    holding = asyncio.create_task(g._take(task(1, domain), first))  # held: no slot free
    await soon(lambda: g._copies["t1"].holder is first)
    assert await asyncio.wait_for(g._take(task(1, domain), delivery()), 5)  # let go at once
    assert g._copies_dropped == 1
    first._channel.is_closed = True  # type: ignore[union-attr]  # its connection was lost
    again = delivery()
    taking = asyncio.create_task(g._take(task(1, domain), again))
    await soon(lambda: g._copies["t1"].holder is again)
    assert g._copies["t1"].holder is again
    await heartbeat(g, 4)
    assert await asyncio.wait_for(taking, 5)
    assert not await asyncio.wait_for(holding, 5)  # dropped: its channel is closed
    assert [(t.id, t.maybe_done) for t in released(broker)] == [("t0", False), ("t1", True)]
    assert g._copies["t1"].passed and g._copies["t1"].holder is None
    assert await asyncio.wait_for(g._take(task(1, domain), delivery()), 5)  # a later copy: let go
    back = task(1, domain).model_copy(update={"maybe_done": True})  # the one that went on, retried
    await asyncio.wait_for(g._take(back, delivery()), 5)
    assert [t.id for t in released(broker)] == ["t0", "t1", "t1"]
