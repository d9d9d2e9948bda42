"""Each domain's current rate, pause, held tasks and fetches in flight, for `hutch status`.

Any number of governors run, each releasing the domains of the frontier shards it is the
active consumer of, and each with the fleet-wide view the events give it. `domain_status`
asks them all at once: it publishes one request on the events exchange (`governor.status`,
which every governor's own events queue is bound to) with a reply-to queue of its own,
collects the answers that come within a moment, and keeps for each domain the row of the
governor releasing it (or any row when none is).

A broad crawl has 100,000 domains, so the request carries the query (`top`, `sort`,
`match`, `paused_only`) and each governor answers with its selection only (`select_domains`,
a pure function) and the number of domains it knows; the merged answers go through the same
selection again. What waits in the frontier is read per shard, not per domain: a passive
declare of each shard queue and of the paused queue (`frontier_depths`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import heapq
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from hutch.amqp import Broker, Delivery, PublishFailed, queue_depth
from hutch.models import MAX_TOP, DecodeError, GovernorStatus, StatusRequest
from hutch.topology import STATUS


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _sort_keys(rows: list[dict[str, Any]], sort: str) -> list[tuple[Any, ...]]:
    """(key, domain, index) per row, smallest first in the order `sort` asks for."""
    if sort == "name":
        return [(str(row.get("domain", "")), i) for i, row in enumerate(rows)]
    try:  # the rows a governor makes hold numbers or None: the fast path
        return [(-(row.get(sort) or 0), row["domain"], i) for i, row in enumerate(rows)]
    except (TypeError, KeyError):
        return [(-_number(row.get(sort)), str(row.get("domain", "")), i) for i, row in enumerate(rows)]


def select_domains(rows: list[dict[str, Any]], request: StatusRequest) -> tuple[list[dict[str, Any]], int]:
    """(the rows `request` selects, in its order, at most `top`; how many rows there were).

    A row missing the sort key (or holding None there) sorts as 0; ties go by domain name,
    so the selection is the same on every governor for the same rows. The governor runs it
    on its event loop, so it stays linear: plain tuples into a bounded heap, no full sort
    (about 0.1 s for 100,000 rows).
    """
    total = len(rows)
    chosen = rows
    if request.match is not None:
        matches = re.compile(fnmatch.translate(request.match.lower())).match
        chosen = [row for row in chosen if matches(str(row.get("domain", "")).lower())]
    if request.paused_only:
        chosen = [row for row in chosen if _number(row.get("paused_for")) > 0]
    keys = _sort_keys(chosen, request.sort)
    return [chosen[key[-1]] for key in heapq.nsmallest(request.top, keys)], total


async def ask_governors(
    broker: Broker, timeout: float = 2.0, settle: float = 0.3, request: StatusRequest | None = None
) -> list[GovernorStatus]:
    """The answers of every running governor to `request` (none: an empty list)."""
    channel = await broker.channel()
    answers: list[GovernorStatus] = []
    first = asyncio.Event()
    correlation_id = uuid.uuid4().hex
    try:
        queue = await channel.declare_queue("", exclusive=True, auto_delete=True)  # named by the broker

        async def on_answer(message: Delivery) -> None:
            if message.correlation_id != correlation_id:
                return
            with contextlib.suppress(DecodeError):
                answers.append(broker.decode(message.body, message.content_encoding, GovernorStatus))
                first.set()

        await broker.listen(channel, queue.name, on_answer)
        try:
            await broker.publish(
                broker.topology.events,
                STATUS,
                request or StatusRequest(),
                reply_to=queue.name,
                correlation_id=correlation_id,
                persistent=False,
            )
        except PublishFailed:  # unroutable: no governor is listening
            return []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(first.wait(), timeout)
            await asyncio.sleep(settle)  # the other governors' answers
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return answers


@dataclass
class FrontierDepth:
    """Tasks waiting in the frontier's shard queues and in the paused queue (None: unreadable)."""

    shards: list[int | None] = field(default_factory=list)
    paused: int | None = None

    @property
    def waiting(self) -> int | None:
        known = [depth for depth in self.shards if depth is not None]
        return sum(known) if known else None


@dataclass
class DomainReport:
    rows: list[dict[str, Any]]  # the selection, merged over the governors
    total: int  # domains the governors know, before the selection
    governors: int  # how many answered
    frontier: FrontierDepth


async def frontier_depths(broker: Broker) -> FrontierDepth:
    """Ready messages in each frontier shard and in the paused queue: a few passive declares."""
    topology = broker.topology
    names = [topology.shard_queue(n).name for n in range(topology.shards)] + [topology.paused]
    depths: list[int | None] = []
    channel = await broker.channel()
    try:
        for name in names:
            if channel.is_closed:  # a failed passive declare closes the channel
                channel = await broker.channel()
            depth = await queue_depth(channel, name)
            depths.append(None if depth is None else depth[0])
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return FrontierDepth(shards=depths[:-1], paused=depths[-1])


def merge_answers(answers: list[GovernorStatus], request: StatusRequest) -> tuple[list[dict[str, Any]], int]:
    """One row per domain from every governor's answer, selected again; (rows, total domains).

    A domain's row is that of the governor releasing it (`active`), else the oldest
    governor's. The total is the largest any governor reported (each knows every domain it
    heard of) or the number of distinct domains seen, whichever is larger.
    """
    rows: dict[str, dict[str, Any]] = {}
    total = 0
    for answer in sorted(answers, key=lambda a: a.started):
        total = max(total, answer.total_domains, len(answer.domains))
        for row in answer.domains:
            mine = {**row, "governor": answer.governor if row.get("active") else None}
            held = rows.get(row["domain"])
            if held is None or (row.get("active") and not held.get("active")):
                rows[row["domain"]] = mine
    selected, seen = select_domains(list(rows.values()), request)
    for row in selected:
        row.pop("active", None)
    return selected, max(total, seen)


async def domain_report(broker: Broker, request: StatusRequest | None = None, timeout: float = 2.0) -> DomainReport:
    """The governors' rows selected by `request`, with the frontier's depths."""
    request = request or StatusRequest()
    answers = await ask_governors(broker, timeout, request=request)
    rows, total = merge_answers(answers, request)
    return DomainReport(rows, total, len(answers), await frontier_depths(broker))


async def domain_status(
    broker: Broker, timeout: float = 2.0, request: StatusRequest | None = None
) -> list[dict[str, Any]]:
    """The rows of `domain_report`: one per domain, the `top` of them by `sort` (default: by name).

    Keys of a row: `domain`, `key` (the domain key its limit hangs on), `rate`, `ceiling`,
    `burst`, `concurrency`, `in_flight`, `paused_for` (seconds), `pause_reason`,
    `takeover_wait` (seconds), `governor` (the one releasing it, None when none is),
    `released`, `throttled`, `robots_cap`, and from governors that report them `held`
    (tasks in its window), `parked` (in delay tiers, an estimate), `jobs` (jobs with tasks
    held or parked there) and `oldest_held` (seconds).
    """
    request = request or StatusRequest(top=MAX_TOP, sort="name")
    rows, _ = merge_answers(await ask_governors(broker, timeout, request=request), request)
    return rows
