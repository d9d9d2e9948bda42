"""Group commit: many messages' writes in one durable transaction, each acked after it.

With `synchronous=FULL` every commit waits for the disk, so one commit per message would cap
the storer at the disk's flush rate. The storer's handlers instead hand their write to this
writer and wait: it gathers the writes that arrive within `wait` seconds (or `batch` of
them), runs them in one transaction (`Store.write_group`) and only then answers each
handler, which returns and so lets its message be acked. An ack therefore always follows
the commit that holds its write.

A store outage (full disk, locked or read-only database, I/O error) is retried in place,
with a growing pause, while the handlers wait: their messages stay unacked, so the consumers'
prefetch stops the flow from the broker; nothing is spent and nothing is dead-lettered. A
write still failing after `retry_seconds` gets `StoreUnavailable`, which the handler turns
into a requeue. A write that fails for a reason of its own gets its own error, alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hutch.store import Store, StoreUnavailable, is_outage

log = logging.getLogger(__name__)

Write = Callable[[Store], None]
RunOnStore = Callable[[Callable[[Store], list[Exception | None]]], Awaitable[list[Exception | None]]]
FIRST_PAUSE = 0.05  # seconds before retrying a group the store refused; doubles
LONGEST_PAUSE = 2.0


@dataclass
class _Pending:
    write: Write
    since: float
    done: asyncio.Future[None]


class GroupWriter:
    def __init__(
        self,
        run: RunOnStore,
        *,
        batch: int,
        wait: float,
        retry_seconds: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._run = run
        self._batch = batch
        self._wait = wait
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._sleep = sleep
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._loop_task: asyncio.Task[None] | None = None
        self.commits = 0  # transactions committed, for the benchmark and the tests
        self.outages = 0  # groups the store refused

    def start(self) -> GroupWriter:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def close(self) -> None:
        """Stop; writes still waiting get `StoreUnavailable` (their messages are requeued)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.done.done():
                pending.done.set_exception(StoreUnavailable("the storer is stopping"))

    async def write(self, write: Write) -> None:
        """Return once `write` is committed; raise its error, or StoreUnavailable."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(write, self._clock(), done))
        await done

    async def _loop(self) -> None:
        while True:
            group = [await self._queue.get()]
            await self._gather(group)
            try:
                await self._commit(group)
            except asyncio.CancelledError:
                for pending in group:
                    if not pending.done.done():
                        pending.done.set_exception(StoreUnavailable("the storer is stopping"))
                raise

    async def _gather(self, group: list[_Pending]) -> None:
        """Add what arrives within `wait` seconds, up to `batch` writes in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        while len(group) < self._batch:
            if not self._queue.empty():
                group.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                group.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                return

    async def _commit(self, group: list[_Pending]) -> None:
        pause = FIRST_PAUSE
        while group:
            writes = [pending.write for pending in group]
            try:
                results = await self._run(functools.partial(Store.write_group, writes=writes))
            except Exception as exc:
                if not is_outage(exc):
                    # Not the store and not one write (those come back in `results`): a bug.
                    # Fail this group's handlers rather than the writer, which serves the rest.
                    log.exception("a group of %d store writes failed", len(group))
                    for pending in group:
                        if not pending.done.done():
                            pending.done.set_exception(exc)
                    return
                self.outages += 1
                group = self._give_up_on_old(group, exc)
                if group:
                    log.warning(
                        "store refused %d writes (%s: %s); retrying in %.2fs",
                        len(group), type(exc).__name__, exc, pause,
                    )  # fmt: skip
                    await self._sleep(pause)
                    pause = min(pause * 2, LONGEST_PAUSE)
                continue
            self.commits += 1
            for pending, error in zip(group, results, strict=True):
                if pending.done.done():
                    continue
                if error is None:
                    pending.done.set_result(None)
                else:
                    pending.done.set_exception(error)
            return

    def _give_up_on_old(self, group: list[_Pending], exc: Exception) -> list[_Pending]:
        """Answer writes that have waited `retry_seconds` with StoreUnavailable; keep the rest."""
        now = self._clock()
        kept = []
        for pending in group:
            if pending.done.done():  # its handler went away (cancelled)
                continue
            if now - pending.since >= self._retry_seconds:
                pending.done.set_exception(
                    StoreUnavailable(f"store failing for {now - pending.since:.0f}s: {type(exc).__name__}: {exc}")
                )
            else:
                kept.append(pending)
        return kept
