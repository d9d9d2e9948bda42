"""Each domain's current rate, pause, backlog and fetches in flight, for `hutch status`.

Any number of governors run, each releasing the domains whose queue it is the active
consumer of, and each with the fleet-wide view the events give it. `domain_status` asks
them all at once: it publishes one request on the events exchange (`governor.status`, which
every governor's own events queue is bound to) with a reply-to queue of its own, collects
the answers that come within a moment, keeps for each domain the row of the governor
releasing it (or any row when none is), and adds the domain queue's backlog, read from the
broker with a passive declare.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any, Literal

from aio_pika.abc import AbstractIncomingMessage
from pydantic import Field

from hutch.amqp import Broker, PublishFailed, queue_depth
from hutch.models import DecodeError, Model, decode


def status_routing_key() -> str:
    return "governor.status"


class StatusRequest(Model):
    v: Literal[1] = 1
    at: float = Field(default_factory=time.time)


class GovernorStatus(Model):
    """One governor's answer: its view of every domain it knows."""

    v: Literal[1] = 1
    governor: str
    started: float
    capacity: int
    fetchers: int
    in_flight: int
    domains: list[dict[str, Any]]
    at: float = Field(default_factory=time.time)


async def ask_governors(broker: Broker, timeout: float = 2.0, settle: float = 0.3) -> list[GovernorStatus]:
    """The answers of every running governor (none: an empty list)."""
    channel = await broker.channel()
    answers: list[GovernorStatus] = []
    first = asyncio.Event()
    correlation_id = uuid.uuid4().hex
    try:
        queue = await channel.declare_queue("", exclusive=True, auto_delete=True)

        async def on_answer(message: AbstractIncomingMessage) -> None:
            if message.correlation_id != correlation_id:
                return
            with contextlib.suppress(DecodeError):
                answers.append(decode(message.body, GovernorStatus))
                first.set()

        await queue.consume(on_answer, no_ack=True)
        try:
            await broker.publish(
                broker.topology.events,
                status_routing_key(),
                StatusRequest(),
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


async def _backlogs(broker: Broker, domains: list[str], channels: int = 4) -> dict[str, int | None]:
    """Ready messages in each domain queue (None where the queue cannot be read)."""
    found: dict[str, int | None] = {}
    pending = list(domains)

    async def worker() -> None:
        channel = await broker.channel()
        try:
            while pending:
                domain = pending.pop()
                name = broker.topology.domain_queue(domain).name
                depth = await queue_depth(channel, name)
                found[domain] = None if depth is None else depth[0]
                if depth is None:
                    channel = await broker.channel()  # a failed passive declare closes the channel
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    await asyncio.gather(*(worker() for _ in range(min(channels, len(domains)) or 1)))
    return found


async def domain_status(broker: Broker, timeout: float = 2.0) -> list[dict[str, Any]]:
    """One row per domain: rate (current, ceiling), pause, backlog, in flight, governor.

    Keys of a row: `domain`, `key` (the domain key its limit hangs on), `rate`, `ceiling`,
    `burst`, `concurrency`, `in_flight`, `paused_for` (seconds), `pause_reason`,
    `takeover_wait` (seconds), `backlog` (tasks waiting in its queue, None if unknown),
    `governor` (the one releasing it, None when none is), `released`, `throttled`,
    `robots_cap`.
    """
    answers = await ask_governors(broker, timeout)
    rows: dict[str, dict[str, Any]] = {}
    for answer in sorted(answers, key=lambda a: a.started):
        for row in answer.domains:
            mine = {**row, "governor": answer.governor if row.get("active") else None}
            held = rows.get(row["domain"])
            if held is None or (row.get("active") and not held.get("active")):
                rows[row["domain"]] = mine
    backlog = await _backlogs(broker, list(rows))
    result = []
    for domain in sorted(rows):
        row = rows[domain]
        row.pop("active", None)
        row["backlog"] = backlog.get(domain)
        result.append(row)
    return result
