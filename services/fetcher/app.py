"""The fetcher's wiring: permit check, proxy lease, fetch, and routing of the outcome.

A fetcher never decides when to hit a site: it only fetches tasks that hold a fresh permit.
A task whose permit expired, or reached this fetcher later than its rate can absorb
(`lateness`; asked again at the request's first step on the network, see `fetch.NotSent`), goes
back to the frontier without spending an attempt (the governor's
business, bounded by time). Every error that belongs to the task spends one, so
the task's attempt budget bounds it and it ends dead: a task that a fetcher died holding
(the AMQP layer counts the crash in its headers) is recorded as an attempt `crashed` and is
not fetched again by this delivery, and an exception nothing foresaw in fetching or routing
becomes the outcome `error`. After each attempt the task
goes on to `parse`, to a delay tier (which dead-letters it back into its frontier shard when
the delay is over), straight back to the frontier (a redirect, a failed proxy), or to the
dead exchange; then an outcome event is published; only then is the `fetch.ready` message
acked. The fetcher keeps no state, so it scales freely; every second it reports its free
capacity (`fetcher.heartbeat`) so the governor issues no more permits than can be used.

A little over the house's 400 lines: one attempt's whole path (permit, lease, fetch,
route, outcome, ack) reads in order here; the policy, the fetch itself, the timeouts,
lateness and decoding are modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable

import httpx
from aio_pika.exceptions import AMQPError

from hutch.amqp import Delivery, PublishFailed, RpcClient
from hutch.models import (
    Attempt,
    Event,
    FetcherHeartbeat,
    Lease,
    LeaseRequest,
    Page,
    RobotsFetched,
    StoredAnswer,
    StoredQuery,
    Task,
)
from hutch.request_options import request_headers
from hutch.service import Service
from hutch.services.fetcher.charsets import decode_body, page_text
from hutch.services.fetcher.fetch import NotSent, fetch, make_client, warm_up
from hutch.services.fetcher.guard import TargetGuard, parse_overrides
from hutch.services.fetcher.lateness import Lateness
from hutch.services.fetcher.policy import Decision, FetchResult, decide, load_policy
from hutch.services.fetcher.spans import fetch_span, finish
from hutch.services.fetcher.timeouts import TimeoutEstimator, Timeouts
from hutch.topology import ARCHIVE_KEY, HEARTBEAT, PARSE_KEY, outcome_key, robots_key

log = logging.getLogger(__name__)
HEARTBEAT_EVERY = 1.0  # seconds
MIN_STORED_WAIT = 0.005  # seconds: with less to spare, a crashed task is fetched without asking whether it is stored
LEASE_RESERVE = 0.01  # seconds of a permit's slack kept for the lease after that question


class LeaseUnavailable(Exception):
    """No proxy lease could be had before the task's permit ran out."""


class Fetcher(Service):
    name = "fetcher"
    rpc: RpcClient | None  # the proxy-manager's leases; None: no pool, go direct
    ask: RpcClient | None  # every other question (`_stored_already`)

    async def start(self) -> None:
        self.configure()
        s = self.settings
        self.ask = await RpcClient(self.broker).start()
        self.rpc = self.ask if s.use_proxy_manager else None
        # Ready before the first permit arrives, since met on the way to a fetch their tens
        # of milliseconds would make it late: the direct client with its TLS context (the
        # configured CA file's, which the warm-up's client does not load) and one request's
        # modules and code paths (the warm-up).
        self._client(None)
        try:
            warmed = await warm_up(self.policy, s.user_agent)
            if warmed.outcome != "ok":
                log.warning("fetch warm-up got %s: %s", warmed.outcome, warmed.detail)
        except Exception as exc:  # only the first fetch's time is at stake
            log.warning("fetch warm-up failed: %s", exc)
        await self.broker.consume(
            self.broker.topology.fetch_ready, Task, self._on_task, stage="fetch", prefetch=s.concurrency
        )
        self._heartbeat = asyncio.create_task(self._beat())

    def configure(self) -> None:
        """Everything but the broker: the policy, the guard, the clients' table, the counters
        (tests drive the handlers from here, with a broker that records what is published)."""
        s = self.settings
        self.instance = f"{socket.gethostname()}-{os.getpid()}"
        self.policy = load_policy(
            s.policy_file,
            max_attempts=s.max_attempts,
            max_pause=s.max_pause,
            default_pause=s.default_pause,
            max_throttles=s.max_throttles,
            max_proxy_failures=s.max_proxy_failures,
            max_redirects=s.max_redirects,
            max_url_bytes=s.max_url_bytes,
        )
        self.guard = TargetGuard(s.allowed_targets, s.allow_private_networks, parse_overrides(s.resolve))
        self.estimator = (
            TimeoutEstimator(
                floor=s.adaptive_timeout_floor, k=s.adaptive_timeout_k, min_samples=s.adaptive_timeout_samples
            )
            if s.adaptive_timeouts
            else None
        )
        self.clients: dict[str | None, httpx.AsyncClient] = {}
        self._fetches: set[asyncio.Task[FetchResult]] = set()
        self.busy = 0
        self._direct_until = 0.0  # monotonic time until which no pool is configured, as told
        self.lateness = Lateness()
        self.rpc = None
        self.ask = None

    async def abandon(self) -> int:
        """Past the shutdown grace: cancel the fetches still running. Their handlers give the
        tasks back to the frontier unspent (`_fetch` returns None); the HTTP clients stay
        open until no fetch uses them."""
        running = list(self._fetches)
        for job in running:
            job.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        return len(running)

    async def stop(self) -> None:
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        await self.abandon()  # nothing runs by now, unless a handler outlived the second drain
        await asyncio.gather(*(client.aclose() for client in self.clients.values()))

    async def _beat(self) -> None:
        while not self.stopping.is_set():
            beat = FetcherHeartbeat(fetcher=self.instance, concurrency=self.settings.concurrency, busy=self.busy)
            try:
                await self.broker.publish(
                    self.broker.topology.events, HEARTBEAT, beat, mandatory=False, persistent=False
                )
            except Exception as exc:  # reconnecting; the next beat will do
                log.debug("heartbeat not sent: %s", exc)
            await asyncio.sleep(HEARTBEAT_EVERY)

    def _client(self, proxy_url: str | None) -> httpx.AsyncClient:
        client = self.clients.get(proxy_url)
        if client is None:
            s = self.settings
            client = self.clients[proxy_url] = make_client(
                proxy=proxy_url,
                guard=self.guard,
                user_agent=s.user_agent,
                connect_timeout=s.connect_timeout,
                read_timeout=s.read_timeout,
                concurrency=max(s.concurrency, 10),
                ca_file=str(s.ca_file) if s.ca_file else None,
            )
        return client

    async def _fetch(self, task: Task, lease: Lease, on_time: Callable[[], bool]) -> FetchResult | None:
        """One fetch as its own asyncio task, so a shutdown can cancel it without cancelling the
        handler; None when it was cancelled that way. `NotSent` when the permit's moment passed
        before the request's first byte went out."""
        timeouts = self._timeouts(task)
        job = asyncio.create_task(
            fetch(
                self._client(lease.url),
                task.fetch_url or task.url,
                domain=task.domain,
                guard=self.guard,
                proxy=lease.url,
                policy=self.policy,
                total_timeout=timeouts.total,
                read_timeout=timeouts.read,
                max_body_bytes=self.settings.max_body_bytes,
                max_encodings=self.settings.max_content_encodings,
                on_time=on_time,
                headers=_job_headers(task),
            )
        )
        self._fetches.add(job)
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            self._fetches.discard(job)
        if job.cancelled():
            return None
        result = job.result()
        if self.estimator is not None and result.status is not None and result.outcome != "proxy_failure":
            self.estimator.observe(task.domain, result.elapsed)  # a complete answer from the site
        return result

    def _timeouts(self, task: Task) -> Timeouts:
        s = self.settings
        if self.estimator is None:
            return Timeouts(s.read_timeout, s.total_timeout)
        earlier = sum(1 for attempt in task.history if attempt.outcome == "timeout")
        return self.estimator.timeouts(task.domain, earlier, s.read_timeout, s.total_timeout)

    async def _lease(self, task: Task) -> Lease:
        if self.rpc is None or time.monotonic() < self._direct_until:
            return Lease(direct=True)
        assert task.permit is not None
        request = LeaseRequest(
            task_id=task.id,
            domain=task.domain,
            job=task.job,
            attempt=task.attempts,
            exclude=task.failed_proxies,
            tier_floor=task.tier_floor,
        )
        while True:
            try:
                lease = await self.rpc.call(self.broker.topology.rpc_proxy, request, Lease, self.settings.rpc_timeout)
                if lease.direct and lease.valid_for:
                    # No pool: every lease would say the same; ask again only when this runs out.
                    self._direct_until = time.monotonic() + lease.valid_for
                return lease
            except TimeoutError:
                # Never go direct behind the pool's back: wait for the manager, then give
                # the task back unspent.
                if time.time() + self.settings.rpc_timeout >= task.permit.expires:
                    raise LeaseUnavailable("proxy-manager did not answer") from None
                log.warning("proxy-manager did not answer a lease request; asking again")

    async def _crashed(self, task: Task, message: Delivery) -> bool:
        """A task a fetcher died holding: an attempt spent, not fetched on this delivery (the
        page may be what kills fetchers). Before the permit check: a redelivery may come
        after its permit expired."""
        if not message.crashes:
            return False
        detail = f"a fetcher died holding this task ({message.crashes} time(s))"
        await self._outcome(task, Lease(direct=True), FetchResult("crashed", 0.0, detail=detail))
        return True

    async def _stored_already(self, task: Task, spare: float) -> bool:
        """Whether a task a fetcher once died holding, or one out of a `Parked` a governor
        died holding (`maybe_done`), is stored by now. Its fetch may have been done, its page
        published, parsed and stored, and only its ack lost with the fetcher; or another copy
        of it released before the governor died may have been: a storer says so, and the
        page is not fetched again. Only asked after a crash, so the fetches that make up a
        job cost no question; and only for as long as
        the permit can spare (`spare` seconds, at most `HUTCH_RPC_TIMEOUT`), so asking never
        makes it late. No answer by then (no storer running, or an old one) is a no: fetched
        again, the page is still stored once."""
        if self.ask is None or not (task.maybe_done or any(a.outcome == "crashed" for a in task.history)):
            return False
        wait = min(spare, self.settings.rpc_timeout)
        if wait < MIN_STORED_WAIT:
            return False
        try:
            answer = await self.ask.call(
                self.broker.topology.rpc_stored, StoredQuery(task_id=task.id), StoredAnswer, wait
            )
        except TimeoutError:
            log.warning("no storer said in %.2f s whether task %s is stored; fetching it again", wait, task.id)
            return False
        return answer.stored

    async def _leased(self, task: Task) -> Lease | None:
        """A lease for this attempt; None when there is none, the task sent where that leads."""
        try:
            lease = await self._lease(task)
        except LeaseUnavailable:
            await self._back_to_frontier(task, "no_lease")
            return None
        if not lease.direct and lease.proxy_id is None:
            await self._no_proxy_now(task, lease)
            return None
        return lease

    async def _on_task(self, task: Task, message: Delivery) -> None:
        if await self._crashed(task, message):
            return
        if task.permit is None or task.permit.expires <= time.time():
            await self._back_to_frontier(task, "permit_expired")
            return
        late = self.lateness.of(task.permit.id, task.permit.issued, task.permit.not_before)
        due = time.monotonic() - late  # the permit's moment at the site, on this host's clock
        late_after = task.permit.late_after

        def too_late() -> bool:  # fetched now, it could come too close after the domain's previous fetch
            return late_after is not None and time.monotonic() - due > late_after

        if too_late():
            await self._back_to_frontier(task, "permit_late")
            return
        # What the permit can spare: until it would be late, less what the lease may take.
        spare = task.permit.expires - time.time() if late_after is None else due + late_after - time.monotonic()
        if await self._stored_already(task, spare - LEASE_RESERVE):
            await self._event(task, "stored_already", None)
            return
        self.busy += 1
        try:
            lease = await self._leased(task)
            if lease is None:
                return
            # Bounded by the permit's life and by the longest a permit may live at all.
            hold = min(due - time.monotonic(), task.permit.expires - time.time(), self.settings.permit_ttl)
            if hold > 0:  # issued ahead: its moment is still to come
                await asyncio.sleep(hold)
            if too_late():  # the lease or a busy moment here made it late after all
                await self._back_to_frontier(task, "permit_late")
                return
            started = time.monotonic()
            with fetch_span(task, lease, task.fetch_url or task.url) as span:
                try:
                    result = await self._fetch(task, lease, on_time=lambda: not too_late())
                except NotSent:  # late at the last moment: the site saw nothing
                    span.set_attribute("hutch.outcome", "not_sent")
                    await self._back_to_frontier(task, "permit_late")
                    return
                except Exception as exc:  # a bug or an input nothing foresaw: an outcome like any other
                    log.exception("fetching task %s failed unexpectedly", task.id)
                    result = _error(exc, time.monotonic() - started)
                if result is None:  # cut off by a shutdown: back to the frontier, unspent
                    await self._back_to_frontier(task, "shutdown")
                    return
                span_id = finish(span, result)
            tier = lease.tier or "direct"
            self.metrics.task_age.observe(max(0.0, time.time() - task.submitted_at))
            self.metrics.fetch_seconds.labels(tier).observe(result.elapsed)
            self.metrics.proxy_requests.labels(tier).inc()
        finally:
            self.busy -= 1
        await self._outcome(task, lease, result, span_id)

    async def _outcome(self, task: Task, lease: Lease, result: FetchResult, span_id: str | None = None) -> None:
        """Route what one attempt produced; an unexpected error in routing is the outcome `error`."""
        self.metrics.count(self.metrics.fetches, task.domain, result.outcome)
        if task.purpose == "robots":
            await self._robots_result(task, lease, result)
            return
        tiers = self.broker.topology.retry_delays
        url = task.fetch_url or task.url

        def decision(result: FetchResult) -> Decision:
            return decide(result, task.attempts, task.history, self.policy, tiers, redirects=task.redirects, url=url)

        try:
            await self._route(task, lease, result, decision(result), span_id)
        except (PublishFailed, AMQPError, ConnectionError):
            raise  # the infrastructure's: the AMQP layer requeues it unspent
        except Exception as exc:
            if result.outcome == "error":
                raise  # routing an error failed too: the AMQP layer counts it and gives up
            log.exception("routing task %s (%s) failed unexpectedly", task.id, result.outcome)
            error = _error(exc, result.elapsed, result.status)
            await self._route(task, lease, error, decision(error), span_id)

    async def _back_to_frontier(self, task: Task, why: str) -> None:
        """Back to the frontier with no permit and no attempt spent.

        Every return but a shutdown's is counted in the task: past `HUTCH_MAX_RETURNS` it goes
        dead (`never_sent`), so a task whose permits always come late, or that never gets a
        lease, ends rather than circle for ever.
        """
        if why != "shutdown":
            task = task.model_copy(update={"returns": task.returns + 1})
            if task.returns >= self.settings.max_returns:
                detail = f"given back unsent {task.returns} times (the last: {why})"
                await self.broker.publish_dead(task.dead_letter("fetch", "never_sent", detail))
                await self._event(task, "never_sent", "dead")
                return
        task = task.model_copy(update={"permit": None})
        await self.broker.publish(self.broker.topology.frontier, self.broker.topology.shard_key(task.domain), task)
        await self._event(task, why, "frontier")

    async def _no_proxy_now(self, task: Task, lease: Lease) -> None:
        """Every proxy is banned, dead or at its cap for this domain: wait in a tier, unspent.

        The waits are counted in the task's history; past `HUTCH_MAX_PROXY_WAITS` the task
        goes dead (`no_proxy`) rather than wait for ever on a pool that cannot serve it.
        """
        topology = self.broker.topology
        waits = sum(1 for a in task.history if a.outcome == "no_proxy")
        delay = topology.tier_for(lease.retry_in or topology.retry_delays[0])
        record = Attempt(n=task.attempts, at=time.time(), outcome="no_proxy", delay=delay, spent=False)
        task = task.model_copy(update={"permit": None, "history": [*task.history, record]})
        if waits + 1 >= self.settings.max_proxy_waits:
            detail = f"no usable proxy after {waits + 1} waits"
            await self.broker.publish_dead(task.dead_letter("fetch", "no_proxy", detail))
            await self._event(task, "no_proxy", "dead")
            return
        await self.broker.publish(topology.tier_exchange(delay), topology.shard_key(task.domain), task)
        await self._event(task, "no_proxy", "retry", delay=delay)

    async def _robots_result(self, task: Task, lease: Lease, result: FetchResult) -> None:
        """A robots.txt fetch reports to the governors, whatever happened; no retries here."""
        text = ""
        if result.outcome == "ok" and result.body is not None:
            text, _ = decode_body(result.body, result.content_type)
        robots = RobotsFetched(
            domain=task.domain,
            url=task.url,
            status=result.status,
            text=text[: 512 * 1024],
            outcome=result.outcome,
        )
        await self.broker.publish(self.broker.topology.events, robots_key(task.domain), robots)
        await self._event(task, result.outcome, "dead", status=result.status, lease=lease, elapsed=result.elapsed)

    async def _route(
        self, task: Task, lease: Lease, result: FetchResult, decision: Decision, span_id: str | None = None
    ) -> None:
        topology = self.broker.topology
        attempts = task.attempts + (1 if decision.spend else 0)
        record = Attempt(
            n=attempts,
            at=time.time(),
            outcome=decision.reason,
            status=result.status,
            proxy_id=lease.proxy_id,
            tier=lease.tier,
            elapsed=round(result.elapsed, 4),
            delay=decision.delay,
            spent=decision.spend,
            detail=result.detail or None,
            span_id=span_id,
        )
        failed = list(task.failed_proxies)
        if decision.avoid_proxy and lease.proxy_id and lease.proxy_id not in failed:
            failed.append(lease.proxy_id)
        update: dict[str, object] = {
            "attempts": attempts,
            "history": [*task.history, record],
            "failed_proxies": failed,
            "permit": None,
        }
        action = decision.action
        reason, detail = decision.reason, decision.detail or result.detail
        if decision.next_url is not None:  # a redirect's next hop (`policy.decide`)
            update.update(fetch_url=decision.next_url, domain=decision.next_domain, redirects=task.redirects + 1)
        task = task.model_copy(update=update)
        if action == "parse":
            crawl = task.spec is not None and bool(task.spec.follow)
            text, gzip_body = page_text(result.body or b"", result.content_type, crawl)
            page = Page(
                task=task,
                status=result.status or 0,
                final_url=result.final_url or task.url,
                content_type=result.content_type,
                text=text,
                fetched_at=record.at,
                gzip_body=gzip_body,
            )
            # A job that keeps its pages: the archive (the storer's) gets a copy too, persistent.
            # Any other page is transient unless HUTCH_PERSIST_PAGES: if the broker loses it,
            # the storer has the task fetched again (hutch.services.storer.lost).
            kept = task.spec is not None and task.spec.archive
            persistent = kept or self.settings.persist_pages
            await self.broker.publish(topology.work, ARCHIVE_KEY if kept else PARSE_KEY, page, persistent=persistent)
        elif action == "retry":
            assert decision.delay is not None
            self.metrics.count(self.metrics.retries, task.domain, reason)
            await self.broker.publish(topology.tier_exchange(decision.delay), topology.shard_key(task.domain), task)
        elif action == "frontier":
            await self.broker.publish(topology.frontier, topology.shard_key(task.domain), task)
        else:
            await self.broker.publish_dead(task.dead_letter("fetch", reason, detail))
        await self._event(
            task,
            reason,
            action,
            status=result.status,
            lease=lease,
            elapsed=result.elapsed,
            delay=decision.delay if action == "retry" else None,
            retry_after=result.retry_after,
            span_id=span_id,
        )

    async def _event(
        self,
        task: Task,
        outcome: str,
        next_step: str | None,
        *,
        status: int | None = None,
        lease: Lease | None = None,
        elapsed: float | None = None,
        delay: float | None = None,
        retry_after: float | None = None,
        span_id: str | None = None,
    ) -> None:
        event = Event(
            kind="outcome",
            task_id=task.id,
            job=task.job,
            domain=task.domain,
            attempt=task.attempts,
            permit_id=task.permit.id if task.permit else None,
            fetcher=self.instance,
            outcome=outcome,
            status=status,
            retry_after=retry_after,
            proxy_id=lease.proxy_id if lease else None,
            tier=lease.tier if lease else None,
            cost=lease.cost if lease else None,
            elapsed=None if elapsed is None else round(elapsed, 4),
            next=next_step,
            delay=delay,
            incarnation=task.incarnation,
            trace_id=task.trace_id,
            span_id=span_id,
            task=task.model_copy(update={"permit": None}),  # the store keeps it (reconciler)
        )
        key = outcome_key(task.domain, proxied=event.proxy_id is not None)
        await self.broker.publish(self.broker.topology.events, key, event)


def _job_headers(task: Task) -> dict[str, str]:
    """The headers and cookies of the task's spec, for the URL it fetches now (a redirect's
    hop to another host goes without the credentials: `hutch.request_options`)."""
    spec = task.spec
    if spec is None or task.purpose != "page" or not (spec.headers or spec.cookies):
        return {}
    return request_headers(spec.headers or {}, spec.cookies or {}, task.fetch_url or task.url, task.url)


def _error(exc: Exception, elapsed: float, status: int | None = None) -> FetchResult:
    return FetchResult("error", elapsed, status=status, detail=f"{type(exc).__name__}: {exc}"[:500])


SERVICE = Fetcher
