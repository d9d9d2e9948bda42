"""Putting new tasks into the frontier: a domain's together, a few to a message, not one per task.

A job's URLs arrive together (`hutch submit`, an intake message, a crawled page's links),
and each task once went into its shard as a message of its own: a publish and a confirm
for the storer, an enqueue, a delivery and an ack for the broker, and a delivery for the
governor, before the governor held or parked it. The shard's queue was the broker's busiest
process on small pages (about 1,750 reductions a released task against about 310 for
`fetch.ready`, docs/benchmarks.md, fifteenth round). Here the tasks of one domain among
those published together go as one `Parked`, up to `PER_MESSAGE` of them, the message the
governor already takes from its shards (its parks come back that way): each task in it is
held or parked as if it came alone, and the message is acked once every one is passed on.
A domain with a single task among them gets a plain `Task`, as before.

Nothing new on the wire: every governor that reads its shards reads `Parked`, so a storer
or a `hutch submit` of this version may publish before the governors are upgraded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator

from hutch import telemetry
from hutch.amqp import Broker
from hutch.models import Parked, Task

# Tasks a new-task message holds at most. A governor's window of a shard is counted in
# messages (AMQP prefetch), its memory in tasks: four a message is what its bound on the
# tasks of `Parked` messages held or still to place allows every slot of every window
# (`PINNED_PER_SLOT`, 16,384 tasks by default), so a job's first messages fill the windows
# without going past the bound. At 256 a message (`MAX_PARKED`) the 100,000-URL run put the
# whole job in the governor at once: 448 MiB resident against 95, its first 40 s at 5-20
# permits a second while it parked them all (docs/benchmarks.md, eighteenth round).
PER_MESSAGE = 4


def frontier_messages(tasks: Iterable[Task], together: bool = True) -> Iterator[Task | Parked]:
    """`tasks` as frontier messages: each domain's in the order given, in messages of up
    to `PER_MESSAGE`, a domain's first message before the next domain's; one alone as a `Task`.
    Not `together`: each task as itself."""
    if not together:
        yield from tasks
        return
    by_domain: dict[str, list[Task]] = {}
    for task in tasks:
        by_domain.setdefault(task.domain, []).append(task)
    for group in by_domain.values():
        for start in range(0, len(group), PER_MESSAGE):
            chunk = group[start : start + PER_MESSAGE]
            yield chunk[0] if len(chunk) == 1 else Parked(tasks=chunk)


async def publish_new(broker: Broker, tasks: Iterable[Task]) -> None:
    """Publish `tasks` to their shards (`frontier_messages`), the confirms awaited together;
    PublishFailed (or the broker's error) if any is not confirmed: then some may be in the
    frontier already, which the caller's records allow (a task is marked `queued` only after,
    and published again while it is `new`).

    With tracing on, each task goes alone: its trace begins with the span of its own publish
    here, and the governor's spans about it are that span's children (a `Parked` carries no
    task's context: the governor's spans about its tasks begin traces of their own)."""
    topology = broker.topology
    await asyncio.gather(
        *(broker.publish(topology.frontier, topology.shard_key(message.domain), message)
          for message in frontier_messages(tasks, together=not telemetry.enabled()))
    )
