"""The storer's wiring: items, outcome events and dead letters into the store; the reconciler.

Each message is acked only after the transaction holding its write has committed (group
commit, `writer.GroupWriter`), and every write is an upsert keyed so that a redelivered
message changes nothing (see `hutch.store`). A store that fails (full disk, lock, read-only
file) costs no message anything: the write is retried in place while consumption waits, then
the message is requeued (`Requeue`: nothing spent), never dead-lettered.

The dead-letter ledger records every letter, however odd: one it cannot record as it is
gets recorded without its task. Its own failures are never dead-lettered (that would feed
the ledger its own letters in a loop).

The storer owns the store, so it also runs the reconciler (`reconcile`): every
`reconcile_interval` seconds it rescues the tasks nothing will move again.

It also reads the `jobs` stream whole, from its first record at every start as the
governors do, and records each job's state (running, paused, cancelled) and weight for
`hutch status`. No offset is kept: applying a record is idempotent (the newest per job
wins, by its `at`). A record is never given back: the consumer's requeue republishes to the
queue, which on a stream would append the record again; while the store refuses writes it is
retried in place.

It watches each job's proxy budget too: recording an attempt's cost adds it to the job's
spend (once per attempt, in the same transaction), and a running job whose spend reached its
budget is paused through the jobs stream, with the reason `budget` (`_pause_spent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from hutch.amqp import Dead, Delivery, PublishFailed, Requeue, queue_depth, serve_rpc
from hutch.crawl import crawl_links
from hutch.frontier import publish_new
from hutch.models import (
    AnyEvent,
    DeadLetter,
    Item,
    JobControl,
    Page,
    Rescued,
    StoredAnswer,
    StoredQuery,
    Submission,
    Task,
)
from hutch.service import Service
from hutch.services.control.jobs import append_control
from hutch.services.control.submit import JobNameError, check_job_name, submit
from hutch.services.proxy_manager.pool import TIERS
from hutch.services.storer import lost, reconcile
from hutch.services.storer.writer import GroupWriter, Write
from hutch.store import AsyncStore, CrawlLimits, Silent, Store, StoreUnavailable, is_outage
from hutch.topology import rescued_key
from hutch.urls import InvalidURL, check_url

log = logging.getLogger(__name__)

# A letter the storer itself publishes names its ledger key here, so that recording it
# locally and again from the ledger queue makes one row.
LETTER_ID = "x-hutch-letter-id"
PREFETCH = 256  # messages each of the item and event consumers may hold unacked
WATCH_STOP = 5.0  # seconds the look for lost pages has to end its turn when the storer stops
SWEEP_LIMIT = 1000  # silent tasks looked at per sweep; the rest wait for the next one
DOMAINS_PER_SWEEP = 200  # domains one sweep considers for a retry rescue
JOBS_PREFETCH = 100  # control records of the jobs stream held unacked (a stream needs a prefetch)
JOBS_RETRY = 1.0  # seconds between tries of a control record the store refused
ARCHIVE_PREFETCH = 16  # archived pages held unacked (each up to HUTCH_MAX_BODY_BYTES)


class Storer(Service):
    name = "storer"

    async def start(self) -> None:
        s = self.settings
        self.store = await AsyncStore(s.store_location).open()
        self.writer = GroupWriter(
            self.store.run,
            batch=s.store_batch,
            wait=s.store_batch_wait,
            retry_seconds=s.store_retry_seconds,
            clock=time.monotonic,
        ).start()
        self.reconcile_config = reconcile.Config(
            permit_ttl=s.permit_ttl,
            # The fetcher waits for a proxy lease until the permit runs out, then fetches.
            fetch_deadline=s.total_timeout + s.rpc_timeout + s.publish_timeout,
            margin=s.reconcile_margin,
            max_rescues=s.max_rescues,
        )
        self._empty_since: dict[str, float] = {}  # domain -> first of the frontier's empty looks for it
        topology = self.broker.topology
        # Prefetch bounds what waits on a failing store: no more than this is taken from the
        # broker until the store takes writes again. It also bounds a group's size.
        prefetch = max(PREFETCH, s.store_batch)
        await self.broker.consume(topology.store, Item, self._on_item, stage="store", prefetch=prefetch)
        await self.broker.consume(topology.events_storer, AnyEvent, self._on_event, stage="store", prefetch=prefetch)
        await self.broker.consume(
            topology.ledger, DeadLetter, self._on_dead, stage="store", prefetch=32, dead_letter=False
        )
        await self.broker.consume(
            topology.jobs,
            JobControl,
            self._on_job_control,
            stage="store",
            prefetch=JOBS_PREFETCH,
            arguments={"x-stream-offset": "first"},
        )
        await self.broker.consume(topology.intake, Submission, self._on_submission, stage="intake", prefetch=4)
        # Pages of up to max_body_bytes each: a small prefetch bounds what waits in memory.
        await self.broker.consume(topology.archive, Page, self._on_archived, stage="store", prefetch=ARCHIVE_PREFETCH)
        await serve_rpc(self.broker, topology.rpc_stored, StoredQuery, self._stored)
        self._reconciler = asyncio.create_task(self._reconcile_every(s.reconcile_interval))
        self._watch_stop = asyncio.Event()
        self._lost_watch = asyncio.create_task(
            lost.watch(self.broker, lambda: lost.events_applied(self.broker), self.sweep_lost_pages, self._watch_stop)
        )

    async def stop(self) -> None:
        # The look ends its turn on its own (a cancel in the middle of a channel's opening or
        # a passive declare could leave the connection's close waiting); cancelled past WATCH_STOP.
        self._watch_stop.set()
        await asyncio.wait({self._lost_watch}, timeout=WATCH_STOP)
        for task in (self._reconciler, self._lost_watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.writer.close()
        await self.store.close()

    async def _write(self, write: Write) -> None:
        try:
            await self.writer.write(write)
        except StoreUnavailable as exc:
            log.warning("store unavailable; message requeued: %s", exc)
            raise Requeue() from None

    async def _on_item(self, item: Item, _: Delivery) -> None:
        if item.links is None:
            await self._write(lambda store: store.store_item(item))
        else:
            await self._store_crawled(item, item.links)
        self.metrics.stored.inc()

    async def _store_crawled(self, item: Item, links: list[str]) -> None:
        """Store a crawled page's item and admit its links in one transaction, then publish the
        admitted tasks and mark them queued; the item is acked only after all of it, so a
        storer that stops midway has the item again and publishes what is still `new`."""
        spec = item.task.spec
        limits = CrawlLimits(spec.max_depth, spec.max_pages) if spec is not None else CrawlLimits(0, 0)
        offered = crawl_links(item.task.job, links, self.settings.max_url_bytes, self.settings.max_links_per_page)
        admitted: list[Task] = []

        def write(store: Store) -> None:
            store.store_item(item)
            admitted[:] = store.admit_links(item.task, offered, limits)  # a group retried sets it anew

        await self._write(write)
        if not admitted:
            return
        await publish_new(self.broker, admitted)
        await self._write(lambda store: store.mark_queued([task.id for task in admitted]))

    async def _stored(self, query: StoredQuery) -> StoredAnswer:
        """Whether a task is stored, for a fetcher about to fetch it again after a crash. A
        store that cannot say answers no: fetched again, the page is stored once all the same."""
        try:
            state = await self.store.run(lambda store: store.task_state(query.task_id))
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("store unavailable; task %s taken as not stored: %s", query.task_id, exc)
            return StoredAnswer(stored=False)
        return StoredAnswer(stored=state == "stored")

    async def _on_archived(self, page: Page, _: Delivery) -> None:
        await self._write(lambda store: store.archive_page(page))

    async def _on_event(self, message: AnyEvent, _: Delivery) -> None:
        events = message.events()
        spent: list[str] = []

        def write(store: Store) -> None:
            store.apply_events(events)
            # Read in the same transaction: a group retried reads it anew.
            spent[:] = store.over_budget(event.job for event in events if event.cost)

        await self._write(write)
        for job in spent:
            await self._pause_spent(job)

    async def _pause_spent(self, job: str) -> None:
        """The job's proxy spend reached its budget: pause it as `hutch pause` does (a record on
        the jobs stream, which every governor follows), then record that here, before the event
        that showed it is acked. Found by the job's state, not by the crossing, so a storer that
        stops in between pauses it when the event comes again; a second record changes nothing."""
        control = JobControl(job=job, action="pause", reason="budget")
        await append_control(self.broker, control)
        await self._write(lambda store: store.apply_job_control(control))
        log.info("job %s paused: its proxy budget is spent", job)

    async def _on_submission(self, submission: Submission, _: Delivery) -> None:
        """Record a submission's tasks, then publish those not published before (the same
        path as `hutch submit`'s). Refused whole when a URL or the job name is invalid;
        acked only once every task is recorded and the broker confirmed each publish, so a
        storer that dies midway has the submission again, and publishes what is still new."""
        max_bytes = self.settings.max_url_bytes
        try:
            check_job_name(submission.job)
        except JobNameError as exc:
            raise Dead("invalid_submission", f"job name: {exc}") from None
        if submission.tier_floor is not None and submission.tier_floor not in TIERS:
            # Unchecked, an unknown tier would be ignored where leases are chosen, silently.
            raise Dead("invalid_submission", f"tier_floor {submission.tier_floor[:50]!r} is none of {', '.join(TIERS)}")
        for n, url in enumerate(submission.urls, 1):
            try:
                check_url(url, max_bytes)
            except InvalidURL as exc:
                raise Dead("invalid_submission", f"URL {n} of {len(submission.urls)}: {exc}") from None
        try:
            await submit(self.broker, self.store, submission.job, iter(submission.urls), submission.spec,
                         tier_floor=submission.tier_floor, max_url_bytes=max_bytes)
        except Exception as exc:
            if is_outage(exc):
                log.warning("store unavailable; submission requeued: %s", exc)
                raise Requeue() from None
            raise

    async def _on_job_control(self, control: JobControl, _: Delivery) -> None:
        # Never raise: the consumer's Requeue or failure path republishes to the queue, which
        # for a stream appends the record again. The stream keeps every record; a record not
        # written now is read again at the next start.
        while not self.stopping.is_set():
            try:
                await self.writer.write(lambda store: store.apply_job_control(control))
                return
            except StoreUnavailable as exc:
                log.warning("store unavailable; job control for %s tried again: %s", control.job, exc)
                await asyncio.sleep(JOBS_RETRY)
            except Exception as exc:
                log.warning("job control for %s not recorded: %s: %s", control.job, type(exc).__name__, exc)
                return

    async def _on_dead(self, letter: DeadLetter, message: Delivery) -> None:
        key = str(message.headers.get(LETTER_ID) or message.message_id or f"{letter.stage}:{letter.at}")[:200]
        try:
            await self._write(lambda store: store.record_dead(letter, key))
        except Requeue:
            raise
        except Exception as exc:  # a letter the store will not take as it is: keep its gist
            log.warning("dead letter %s recorded without its task: %s", key, exc)
            odd = DeadLetter(
                stage=letter.stage,
                reason=letter.reason,
                detail=f"{letter.detail[:1000]} (recorded without its task: {type(exc).__name__})",
                at=letter.at,
                queue=letter.queue,
            )
            try:
                await self._write(lambda store: store.record_dead(odd, key))
            except Requeue:
                raise
            except Exception:  # never dead-letter it: the ledger would feed itself in a loop
                log.exception("dead letter %s could not be recorded at all; the dlq queue keeps a copy", key)
        task = letter.task or (letter.page.task if letter.page is not None else None)
        self.metrics.count(self.metrics.dead_letters, task.domain if task else "none", letter.stage, letter.reason)

    # -- the reconciler ----------------------------------------------------------------

    async def _reconcile_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reconcile_once()
                if self.settings.retention:
                    await self.expire_jobs()
                if self.settings.archive_retention:
                    await self.expire_archive(time.time() - self.settings.archive_retention)
            except Exception as exc:  # the broker or the store is away: try next time
                log.warning("reconciler sweep failed: %s: %s", type(exc).__name__, exc)

    async def expire_archive(self, before: float) -> int:
        """Drop the archived pages fetched before `before` (`HUTCH_ARCHIVE_RETENTION`)."""
        gone = await self.store.run(lambda store: store.expire_archive(before))
        if gone:
            log.info("archive: %d pages past their retention dropped", gone)
        return gone

    async def expire_jobs(self) -> list[str]:
        """Remove the jobs done for longer than `HUTCH_RETENTION`; their names."""
        before = time.time() - self.settings.retention
        expired = await self.store.run(lambda store: store.finished_jobs(before))
        for job in expired:
            gone = await self.store.run(lambda store, job=job: store.delete_job(job))  # type: ignore[misc]
            log.info("job %s removed after its retention: %s", job, gone)
        return expired

    async def reconcile_once(self) -> dict[str, int]:
        """One sweep: rescue or stall every lost task; returns how many of each."""
        config = self.reconcile_config
        now = time.time()
        silent = await self.store.run(
            lambda store: store.silent_tasks(config.in_flight_before(now), config.retrying_before(now), SWEEP_LIMIT)
        )
        done = {"rescue": 0, "stall": 0}
        if not silent:
            return done
        observed = await self._observe(silent, now)
        for task in silent:
            verdict = reconcile.decide(task, now, config, observed)
            if verdict.action == "rescue":
                done["rescue"] += await self._rescue(task, verdict.why, now)
            elif verdict.action == "stall":
                await self._stall(task, verdict.why)
                done["stall"] += 1
        if done["rescue"] or done["stall"]:
            log.info("reconciler: %d tasks rescued, %d stalled", done["rescue"], done["stall"])
        return done

    async def sweep_lost_pages(self, before: float) -> int:
        """Rescue every task whose page went to the parsers before `before`, the broker having
        lost its transient messages since (`lost`); how many were rescued."""
        rescued = 0
        while True:
            found = await self.store.run(lambda store: store.pages_sent_before(before, SWEEP_LIMIT))
            now = time.time()
            done = 0
            for silent in found:
                done += await self._rescue(silent, "page_lost", now)
            rescued += done
            if len(found) < SWEEP_LIMIT or not done:
                return rescued

    async def _observe(self, silent: list[Silent], now: float) -> reconcile.Observed:
        topology = self.broker.topology
        channel = await self.broker.channel()
        try:
            ready = await queue_depth(channel, topology.fetch_ready)
            events = await queue_depth(channel, topology.events_storer)
            # A retry waits in its domain's shard, in a delay tier, parked (a domain's backlog
            # beyond a few seconds of its rate), or in the paused queue: it counts as lost only
            # while all of them are empty (one shared look; unknown counts as not empty).
            waiting = 0
            for name in [q.name for q in topology.shard_queues] + [topology.paused, *topology.delay_queues]:
                if channel.is_closed:  # a passive declare of a missing queue closes it
                    channel = await self.broker.channel()
                depth = await queue_depth(channel, name)
                waiting += 1 if depth is None else depth[0]
            domains = sorted(reconcile.domains_to_look_at(silent, now, self.reconcile_config))
            depths: dict[str, int | None] = {domain: waiting for domain in domains[:DOMAINS_PER_SWEEP]}
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        self._empty_since = reconcile.empty_since(self._empty_since, depths, now)
        return reconcile.Observed(
            fetchers_up=ready is not None and ready[1] > 0,
            fetch_ready_waiting=ready is None or ready[0] > 0,
            store_behind=events is None or events[0] > 0,
            empty_for={domain: now - since for domain, since in self._empty_since.items()},
        )

    async def _rescue(self, silent: Silent, why: str, now: float) -> int:
        task = reconcile.rebuild(silent, silent.incarnation + 1)
        claimed = await self.store.run(lambda store: store.begin_rescue(silent, task, now))
        if not claimed:
            return 0  # it moved since the store was read
        topology = self.broker.topology
        try:
            # The governors hear of the new incarnation first, so a stale copy they take
            # from the frontier after this is dropped; none bound yet is no failure.
            await self.broker.publish(
                topology.events,
                rescued_key(task.domain),
                Rescued(task_id=task.id, domain=task.domain, incarnation=task.incarnation),
                mandatory=False,
            )
            await self.broker.publish(topology.frontier, topology.shard_key(task.domain), task)
        except PublishFailed as exc:
            # Claimed but not sent: the task is looked at again one deadline from now.
            log.warning("rescue of task %s not published: %s", task.id, exc)
            return 0
        await self.store.run(lambda store: store.finish_rescue(task, now))
        log.info("rescued task %s (%s) as incarnation %d", task.id, why, task.incarnation)
        return 1

    async def _stall(self, silent: Silent, why: str) -> None:
        task = reconcile.rebuild(silent, silent.incarnation)
        letter = DeadLetter(
            stage="reconcile",
            reason="stalled",
            detail=f"lost again ({why}) after {silent.rescues} rescues",
            task=task,
        )
        key = f"stalled:{task.id}:{task.incarnation}"
        await self.broker.publish(self.broker.topology.dead, "", letter, headers={LETTER_ID: key})
        await self.store.run(lambda store: _record(store, letter, key))


def _record(store: Store, letter: DeadLetter, key: str) -> None:
    try:
        store.record_dead(letter, key)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The ledger queue has the letter too and records it when the store is back.
        log.warning("stalled task %s not recorded yet: %s", key, exc)


SERVICE = Storer
