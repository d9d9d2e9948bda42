"""Whether the broker lost its transient messages, and which tasks went with them.

Pages on their way to a parser and items on their way to the storer are transient messages
(unless `HUTCH_PERSIST_PAGES`): on a classic queue the broker keeps them in memory only,
which spares it a tenth to a third of its CPU a page (docs/benchmarks.md, nineteenth
round), and drops them when it stops or dies. Their tasks are then in flight in the store
with their page sent to the parsers (`due_at` empty), and nothing would move them again.
Everything else (the frontier, releases, outcome events, retries, dead letters) is
persistent and comes back with the broker.

The storer keeps one transient message in the durable queue `alive`, which holds one at
most (a second is refused). Every `LOOK_EVERY` seconds it looks: while the marker is there,
the broker has lost nothing since it was placed. When it is missing (the broker restarted
or died, or lost its definitions; or this is the first start on this broker), the storer
fetches again every task whose page went to the parsers before that moment, once the
outcome events that came back with the broker are in the store, and only then places the
marker again. A storer stopped or failing before that leaves it missing, so the next look
(its own or another storer's) sweeps again: a sweep rescues only tasks that have not moved
since it read them, so several storers sweeping, or one sweeping twice, fetch nothing twice.

The tasks are rescued as the reconciler rescues a lost one (a new incarnation, republished
to the frontier), so a copy still on its way is stale, and a page stored meanwhile is stored
once. A page on its way when the marker was found missing, sent after the broker came back,
may be fetched a second time; so is every page in flight each time the marker expires, if a
policy gives the `alive` queue a message TTL (leave it out of such a policy). On quorum
queues every message is persistent: the marker survives a restart, and a sweep happens only
when the definitions are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from hutch.amqp import Broker, PublishFailed, queue_depth

log = logging.getLogger(__name__)

LOOK_EVERY = 2.0  # seconds between two looks at the marker
DRAINED_WAIT = 60.0  # longest a sweep waits for the outcome events that came back with the broker
REFUSED_PAUSE = 60.0  # seconds without a look after the broker did not keep the marker

Look = Literal["unknown", "kept", "missing"]


async def _ready(broker: Broker, queue: str) -> int | None:
    """The messages ready in `queue`, on a channel of its own (None: it could not be read)."""
    channel = await broker.channel()
    try:
        depth = await queue_depth(channel, queue)
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return None if depth is None else depth[0]


async def look(broker: Broker) -> Look:
    """Whether the marker is in `alive` (`unknown`: the queue could not be read)."""
    ready = await _ready(broker, broker.topology.alive)
    if ready is None:
        return "unknown"
    return "kept" if ready > 0 else "missing"


async def events_applied(broker: Broker) -> bool:
    """No outcome event waits for the storer (a depth unknown counts as some)."""
    return await _ready(broker, broker.topology.events_storer) == 0


async def mark(broker: Broker) -> None:
    """Place the marker; refused, harmlessly, when another storer placed it first."""
    with contextlib.suppress(PublishFailed):
        await broker.publish("", broker.topology.alive, b"alive", persistent=False)


async def watch(
    broker: Broker,
    store_current: Callable[[], Awaitable[bool]],
    sweep: Callable[[float], Awaitable[int]],
    stopping: asyncio.Event,
    every: float = LOOK_EVERY,
) -> None:
    """Look at the marker every `every` seconds until `stopping`. Found missing at a moment:
    once `store_current()` says the outcome events are in (or after `DRAINED_WAIT`),
    `sweep(moment)`, again one look later (for an event applied in between), then the marker
    is placed again and looked for: a broker that does not keep it (a policy with a length
    limit of 0 on every queue) gets no look for `REFUSED_PAUSE` seconds, so it cannot have
    every page in flight fetched again every few seconds."""
    while not stopping.is_set():
        pause = every
        try:
            if await look(broker) == "missing":
                moment = time.time()
                waited = 0.0
                while waited < DRAINED_WAIT and not stopping.is_set() and not await store_current():
                    await asyncio.sleep(0.5)
                    waited += 0.5
                if stopping.is_set():  # the next start of a storer sweeps: the marker is still missing
                    return
                rescued = await sweep(moment)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), every)
                rescued += await sweep(moment)
                await mark(broker)
                if rescued:
                    log.warning("the broker lost its transient messages: %d tasks whose page it had are fetched again",
                                rescued)
                if await look(broker) == "missing":
                    log.error("the broker does not keep the marker in %s (a policy's length limit or TTL?): "
                              "looking again in %.0f s", broker.topology.alive, REFUSED_PAUSE)
                    pause = REFUSED_PAUSE
        except Exception as exc:  # the broker or the store is away: look again next time
            log.warning("looking for lost transient messages failed: %s: %s", type(exc).__name__, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), pause)
