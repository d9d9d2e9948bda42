"""Which silent tasks are lost, and what to do with them: the reconciler's decisions.

Every task ends stored or dead because something always moves it: a queue some service
drains, a delay tier the broker expires, a fetcher bound by its deadlines. A message can
still be lost on the way (a classic delay tier dead-letters at most once; a queue purged
by hand; a broker that lost its definitions), and then nothing will ever move its task.
The reconciler finds those tasks in the store and republishes them, and only those:

- in flight (it holds a permit) with no outcome for longer than the permit's lifetime plus
  the fetch deadline plus a margin, while some fetcher consumes `fetch.ready` and nothing
  waits in it (a task waiting there is not lost, however long: a fetcher will hand back its
  expired permit; and a fetcher that took it with a valid permit answers within the fetch
  deadline);
- retrying, past the moment its delay tier should have returned it plus a margin, while
  the frontier has been seen empty for at least the margin too: its shards, the delay tiers
  and the paused queue (a task back in a backlog, however long, is not lost: a governor
  parks a domain's backlog in the delay tiers, a paused job keeps its tasks in the paused
  queue, and a governor holds the few it has in hand for a bounded time).

And only while the store is current: with outcome events still waiting for the storer, a
task may look silent only because its news has not been read yet.

It never looks at a task waiting in a backlog (`queued`, or returned to the frontier:
`due_at` is empty then), on the parse queue, in a delay tier before it is due, or finished.

Each rescue raises the task's incarnation, so a stale copy that surfaces later is dropped;
after `max_rescues` rescues the task goes dead as `stalled` instead. This module is pure:
the storer's wiring reads the store and the broker and passes what it saw, with the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hutch.models import Spec, Task
from hutch.store import Silent

Action = Literal["rescue", "stall", "leave"]
Why = Literal[
    "in_flight_expired",  # no outcome long past the permit's lifetime and the fetch deadline
    "retry_overdue",  # its delay tier should have returned it long ago
    "not_yet",  # its deadline has not passed
    "no_fetcher",  # in flight while no fetcher consumes fetch.ready: it waits there
    "in_fetch_ready",  # in flight while fetch.ready holds tasks: it may be one of them
    "in_backlog",  # its domain's queue holds tasks (or did, lately): it may be one of them
    "store_behind",  # outcome events wait to be applied: the store is not current
    "unknown_state",
]


@dataclass(frozen=True)
class Config:
    permit_ttl: float
    fetch_deadline: float  # the longest a fetcher works on one task once it has it
    margin: float
    max_rescues: int

    @property
    def in_flight_grace(self) -> float:
        return self.permit_ttl + self.fetch_deadline + self.margin

    def in_flight_before(self, now: float) -> float:
        """Tasks in flight since before this moment may be lost."""
        return now - self.in_flight_grace

    def retrying_before(self, now: float) -> float:
        """Tasks due back from their delay tier before this moment may be lost."""
        return now - self.margin


@dataclass(frozen=True)
class Observed:
    """What the wiring saw on the broker just before deciding."""

    fetchers_up: bool  # fetch.ready has at least one consumer
    fetch_ready_waiting: bool = False  # fetch.ready holds messages (or its depth is unknown)
    store_behind: bool = False  # the storer's events queue holds messages
    # Per domain: seconds the frontier has been seen empty for it, sweep after sweep
    # (absent: it was not empty last time, or its depth is unknown).
    empty_for: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    action: Action
    why: Why


def decide(task: Silent, now: float, config: Config, observed: Observed) -> Verdict:
    """Rescue, declare stalled, or leave alone one task the store found silent."""
    if observed.store_behind:
        return Verdict("leave", "store_behind")
    if task.due_at is None:  # its page went to the parsers: a lost one is `lost`'s to find
        return Verdict("leave", "unknown_state")
    if task.state == "in_flight":
        if task.due_at >= config.in_flight_before(now):
            return Verdict("leave", "not_yet")
        if not observed.fetchers_up:
            return Verdict("leave", "no_fetcher")
        if observed.fetch_ready_waiting:
            return Verdict("leave", "in_fetch_ready")
        why: Why = "in_flight_expired"
    elif task.state == "retrying":
        if task.due_at >= config.retrying_before(now):
            return Verdict("leave", "not_yet")
        # A governor may hold a few tasks of the domain out of the frontier for a while
        # (waiting for a token or the fleet), so one empty look proves nothing; an unknown
        # depth neither.
        if observed.empty_for.get(task.domain, -1.0) < config.margin:
            return Verdict("leave", "in_backlog")
        why = "retry_overdue"
    else:
        return Verdict("leave", "unknown_state")
    if task.rescues >= config.max_rescues:
        return Verdict("stall", why)
    return Verdict("rescue", why)


def empty_since(previous: dict[str, float], depths: dict[str, int | None], now: float) -> dict[str, float]:
    """When the frontier was first seen empty for each domain in the current run of empty looks.

    `depths` holds this sweep's looks (None: unknown); domains not looked at are forgotten.
    """
    return {domain: previous.get(domain, now) for domain, depth in depths.items() if depth is not None and depth == 0}


def domains_to_look_at(tasks: list[Silent], now: float, config: Config) -> set[str]:
    """The domains whose queue depth `decide` needs: those of overdue retrying tasks."""
    before = config.retrying_before(now)
    return {t.domain for t in tasks if t.state == "retrying" and t.due_at is not None and t.due_at < before}


def rebuild(task: Silent, incarnation: int) -> Task:
    """The task's message as it should be republished: its latest one, without a permit.

    A task recorded without its message (by a Hutch before version 3 of the store) is
    rebuilt from its row and its job's spec.
    """
    if task.message is not None:
        found = Task.model_validate_json(task.message)
    else:
        found = Task(
            id=task.id,
            job=task.job,
            url=task.url,
            domain=task.domain,
            spec=Spec.model_validate_json(task.spec) if task.spec else None,
            attempts=task.attempts,
        )
    return found.model_copy(update={"permit": None, "incarnation": incarnation})
