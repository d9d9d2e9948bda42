"""The fetcher's wiring: permit check, proxy lease, fetch, and routing of the outcome.

A fetcher never decides when to hit a site: it only fetches tasks that hold a fresh permit.
A task whose permit expired, or a redelivered one whose permit may already have been used,
goes back to its domain queue without spending an attempt. After each attempt the task
goes on to `parse`, to a delay tier (which dead-letters it back into its domain queue when
the delay is over), or to the dead exchange; then an outcome event is published; only then
is the `fetch.ready` message acked. The fetcher keeps no state, so it scales freely.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from aio_pika.abc import AbstractIncomingMessage
from hutch.amqp import RpcClient
from hutch.domains import routing_key
from hutch.models import Attempt, Event, Lease, LeaseRequest, Page, Task
from hutch.service import Service
from hutch.services.fetcher.charsets import decode_body
from hutch.services.fetcher.fetch import fetch, make_client
from hutch.services.fetcher.policy import Decision, FetchResult, decide

log = logging.getLogger(__name__)


class LeaseUnavailable(Exception):
    """No proxy lease could be had before the task's permit ran out."""


class Fetcher(Service):
    name = "fetcher"

    async def start(self) -> None:
        self.clients: dict[str | None, httpx.AsyncClient] = {}
        self.rpc = await RpcClient(self.broker).start() if self.settings.use_proxy_manager else None
        await self.broker.consume(
            self.broker.topology.fetch_ready,
            Task,
            self._on_task,
            stage="fetch",
            prefetch=self.settings.concurrency,
        )

    async def stop(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients.values()))

    def _client(self, proxy_url: str | None) -> httpx.AsyncClient:
        client = self.clients.get(proxy_url)
        if client is None:
            s = self.settings
            client = self.clients[proxy_url] = make_client(
                proxy=proxy_url,
                user_agent=s.user_agent,
                connect_timeout=s.connect_timeout,
                read_timeout=s.read_timeout,
                max_redirects=s.max_redirects,
                max_connections=max(s.concurrency, 10),
            )
        return client

    async def _lease(self, task: Task) -> Lease:
        if self.rpc is None:
            return Lease(direct=True)
        assert task.permit is not None
        request = LeaseRequest(task_id=task.id, domain=task.domain, exclude=task.failed_proxies)
        while True:
            try:
                return await self.rpc.call(
                    self.broker.topology.rpc_proxy, request, Lease, self.settings.rpc_timeout
                )
            except TimeoutError:
                if time.time() + self.settings.rpc_timeout >= task.permit.expires:
                    raise LeaseUnavailable("proxy-manager did not answer") from None
                log.warning("proxy-manager did not answer a lease request; asking again")

    async def _on_task(self, task: Task, message: AbstractIncomingMessage) -> None:
        if task.permit is None or task.permit.expires <= time.time():
            await self._return(task, "permit_expired")
            return
        if message.redelivered:
            # A fetcher may have died after using this permit: get a fresh one.
            await self._return(task, "redelivered")
            return
        try:
            lease = await self._lease(task)
        except LeaseUnavailable:
            await self._return(task, "no_lease")
            return
        result = await fetch(
            self._client(lease.url),
            task.url,
            total_timeout=self.settings.total_timeout,
            max_body_bytes=self.settings.max_body_bytes,
        )
        decision = decide(
            result, task.attempts, self.settings.max_attempts, self.broker.topology.retry_delays
        )
        await self._route(task, lease, result, decision)

    async def _return(self, task: Task, why: str) -> None:
        """Back to the domain queue with no permit and no attempt spent."""
        task = task.model_copy(update={"permit": None})
        topology = self.broker.topology
        await self.broker.publish(topology.frontier, routing_key(task.domain), task)
        await self._event(task, why, "frontier")

    async def _route(self, task: Task, lease: Lease, result: FetchResult, decision: Decision) -> None:
        topology = self.broker.topology
        attempts = task.attempts + (1 if decision.spend else 0)
        record = Attempt(
            n=attempts,
            at=time.time(),
            outcome=decision.reason,
            status=result.status,
            proxy_id=lease.proxy_id,
            elapsed=round(result.elapsed, 4),
            delay=decision.delay,
            spent=decision.spend,
            detail=result.detail or None,
        )
        failed = list(task.failed_proxies)
        if decision.avoid_proxy and lease.proxy_id and lease.proxy_id not in failed:
            failed.append(lease.proxy_id)
        task = task.model_copy(
            update={
                "attempts": attempts,
                "history": [*task.history, record],
                "failed_proxies": failed,
                "permit": None,
            }
        )
        if decision.action == "parse":
            text, _ = decode_body(result.body or b"", result.content_type)
            page = Page(
                task=task,
                status=result.status or 0,
                final_url=result.final_url or task.url,
                content_type=result.content_type,
                text=text,
                fetched_at=record.at,
            )
            await self.broker.publish(topology.work, "parse", page)
        elif decision.action == "retry":
            assert decision.delay is not None
            await self.broker.publish(
                topology.tier_exchange(decision.delay), routing_key(task.domain), task
            )
        else:
            await self.broker.publish_dead(
                "fetch", decision.reason, decision.detail or result.detail, task=task
            )
        await self._event(
            task,
            decision.reason,
            decision.action,
            status=result.status,
            proxy_id=lease.proxy_id,
            elapsed=result.elapsed,
            delay=decision.delay,
        )

    async def _event(
        self,
        task: Task,
        outcome: str,
        next_step: str,
        *,
        status: int | None = None,
        proxy_id: str | None = None,
        elapsed: float | None = None,
        delay: float | None = None,
    ) -> None:
        event = Event(
            kind="outcome",
            task_id=task.id,
            job=task.job,
            domain=task.domain,
            attempt=task.attempts,
            outcome=outcome,
            status=status,
            proxy_id=proxy_id,
            elapsed=None if elapsed is None else round(elapsed, 4),
            next=next_step,  # type: ignore[arg-type]
            delay=delay,
        )
        await self.broker.publish(self.broker.topology.events, f"outcome.{task.domain}", event)


SERVICE = Fetcher
