"""The fetcher's connection pools: httpcore's pass made linear, through real loopback connections.

Each test runs HTTP/1.1 servers of its own on 127.0.0.1 and a pool built as the fetcher
builds it (`make_client`, or `ConnectionPool` on the guard's backend where a test needs a
pool's limits of its own).
"""

from __future__ import annotations

import asyncio

import httpcore
import pytest

from hutch.services.fetcher import guard, keepalive
from hutch.services.fetcher.fetch import make_client
from hutch.services.fetcher.guard import GuardedBackend, TargetGuard
from hutch.services.fetcher.keepalive import ConnectionPool, HTTPProxyPool, linear_pass

BODY = b"ok"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + BODY


class Site:
    """A keep-alive server; `hold` makes each request wait until that many are in flight at
    once (a wave), or 3 s. `close_after` closes each connection that long after answering."""

    def __init__(self, hold: int = 0, close_after: float | None = None) -> None:
        self.hold = hold
        self.close_after = close_after
        self.accepted = 0
        self.closed_by_client = 0
        self.full_waves = 0
        self.waiting: list[asyncio.Future[None]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Site:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                if self.hold:
                    await self.wave()
                writer.write(ANSWER)
                await writer.drain()
                if self.close_after is not None:
                    await asyncio.sleep(self.close_after)
                    return
        except ConnectionError:
            self.closed_by_client += 1
        except asyncio.CancelledError:  # the test's loop is closing: nothing waits for this handler
            return
        finally:
            writer.close()

    async def wave(self) -> None:
        arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(arrived)
        if len(self.waiting) == self.hold:
            self.full_waves += 1
            for future in self.waiting:
                future.set_result(None)
            self.waiting = []
            return
        try:
            await asyncio.wait_for(asyncio.shield(arrived), 3.0)
        except TimeoutError:  # the wave never filled: let the stragglers go
            for future in self.waiting:
                if not future.done():
                    future.set_result(None)
            self.waiting = []


def pool(max_connections: int, max_keepalive: int | None = None) -> ConnectionPool:
    return ConnectionPool(
        max_connections=max_connections,
        max_keepalive_connections=max_keepalive,
        network_backend=GuardedBackend(TargetGuard(allow_private=True)),
    )


async def get(target: httpcore.AsyncConnectionPool, url: str) -> None:
    response = await target.request("GET", url)
    assert response.status == 200 and response.content == BODY


def test_forty_workers_keep_forty_connections_past_the_keepalive_limit_of_twenty() -> None:
    """httpcore 1.0 compares the pool's size with the keep-alive limit: past 20 connections
    every one that goes idle is closed, the pool shrinks to 20 and the other requests take
    turns on them. Each wave here needs all 40 in flight at once. (The fetcher's own clients
    let every connection stay idle; the pool keeps this rule for any limit.)"""

    async def scenario() -> Site:
        async with Site(hold=40) as site:
            target = pool(40, max_keepalive=20)

            async def worker() -> None:
                for _ in range(3):
                    await get(target, site.url)

            await asyncio.gather(*(worker() for _ in range(40)))
            await target.aclose()
        return site

    site = asyncio.run(scenario())
    assert site.full_waves == 3
    assert site.accepted == 40


def test_sites_that_take_turns_at_every_slot_keep_their_connections() -> None:
    """Sixteen fetches in flight go to one site, then all sixteen to another, and back, twice.
    A pool sized to the fetches alone closes one site's idle connections to open the other's
    at every turn (32 connections each here); the fetcher's pool keeps both sites' sixteen."""

    async def scenario() -> tuple[Site, Site]:
        async with Site(hold=16) as a, Site(hold=16) as b:
            client = make_client(
                proxy=None,
                guard=TargetGuard(allow_private=True),
                user_agent="test",
                connect_timeout=5,
                read_timeout=10,
                concurrency=16,
            )
            for site in (a, b, a, b):
                answers = await asyncio.gather(*(client.get(site.url) for _ in range(16)))
                assert [r.status_code for r in answers] == [200] * 16
            await client.aclose()
        return a, b

    a, b = asyncio.run(scenario())
    assert (a.full_waves, b.full_waves) == (2, 2)  # every turn had its 16 in flight at once
    assert (a.accepted, b.accepted) == (16, 16)


def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    async def scenario() -> Site:
        async with Site(close_after=0.01) as site:
            target = pool(4)
            await get(target, site.url)
            await asyncio.sleep(0.2)  # the server closes 10 ms after its answer; the close arrives
            await get(target, site.url)
            assert len(target.connections) == 1
            await target.aclose()
        return site

    assert asyncio.run(scenario()).accepted == 2


def test_a_full_pool_closes_the_oldest_idle_connection_of_another_site_to_make_room() -> None:
    async def scenario() -> tuple[Site, Site, list[str], int]:
        async with Site() as a, Site() as b:
            target = pool(2)
            await asyncio.gather(get(target, a.url), get(target, a.url))
            assert len(target.connections) == 2
            await get(target, b.url)
            ports = [c._origin.port for c in target.connections]
            for _ in range(100):
                if a.closed_by_client:
                    break
                await asyncio.sleep(0.01)
            closed_to_make_room = a.closed_by_client
            await target.aclose()
        return a, b, [str(p) for p in ports], closed_to_make_room

    a, b, ports, closed_to_make_room = asyncio.run(scenario())
    assert a.accepted == 2 and b.accepted == 1
    assert closed_to_make_room == 1
    assert len(ports) == 2 and len(set(ports)) == 2  # one connection to each site


def test_an_idle_connection_given_to_a_request_is_not_given_to_another_before_it_starts() -> None:
    """httpcore gives an idle connection to every queued request of a pass (and of later
    passes, until the first one starts on it): the others fail to start and go round again."""

    async def scenario() -> None:
        async with Site() as site:
            target = pool(1)
            await get(target, site.url)
            (idle,) = target.connections
            assert idle.is_idle()
            request = httpcore.Request("GET", site.url)
            first, second = (
                httpcore._async.connection_pool.AsyncPoolRequest(request),
                httpcore._async.connection_pool.AsyncPoolRequest(request),
            )
            target._requests.extend([first, second])
            assert linear_pass(target) == []
            assert first.connection is idle
            assert second.connection is None  # the pool is full: it waits
            assert linear_pass(target) == []  # a later pass, before `first` starts
            assert second.connection is None
            target._requests.remove(first)  # `first` gave up without starting
            assert linear_pass(target) == []
            assert second.connection is idle
            target._requests.clear()
            await target.aclose()

    asyncio.run(scenario())


def test_idle_connections_past_the_keepalive_limit_are_closed_oldest_first_and_a_spoken_for_one_is_kept() -> None:
    async def scenario() -> None:
        async with Site() as site:
            target = pool(8, max_keepalive=8)
            await asyncio.gather(*(get(target, site.url) for _ in range(6)))
            connections = list(target.connections)
            assert len(connections) == 6 and all(c.is_idle() for c in connections)
            spoken_for = httpcore._async.connection_pool.AsyncPoolRequest(httpcore.Request("GET", site.url))
            spoken_for.assign_to_connection(connections[0])
            target._requests.append(spoken_for)
            target._max_keepalive_connections = 2
            closing = linear_pass(target)
            # 5 spare, 2 may stay: the 3 oldest spare ones go; the spoken-for one stays.
            assert closing == connections[1:4]
            assert target.connections == [connections[0], connections[4], connections[5]]
            target._requests.clear()
            for connection in closing:
                await connection.aclose()
            await target.aclose()

    asyncio.run(scenario())


def test_a_client_through_a_proxy_gets_the_linear_pass_too() -> None:
    client = make_client(
        proxy="http://127.0.0.1:9/",
        guard=TargetGuard(allow_private=True),
        user_agent="test",
        connect_timeout=1,
        read_timeout=1,
    )
    target = client._transport._pool  # type: ignore[attr-defined]
    assert isinstance(target, HTTPProxyPool) and isinstance(target, httpcore.AsyncHTTPProxy)
    assert type(target)._assign_requests_to_connections is linear_pass
    asyncio.run(client.aclose())


def test_between_sweeps_only_the_connection_about_to_be_used_is_asked_whether_it_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight idle connections, then 20 requests one after the other within a second: each
    request asks its own connection, not the seven others (httpcore asks all of them twice a
    request, 320 polls here)."""
    polls: list[object] = []
    asked = guard.readable

    def counted(sock: object) -> bool:
        polls.append(sock)
        return asked(sock)  # type: ignore[arg-type]

    async def scenario() -> None:
        async with Site(hold=8) as site:
            target = pool(8)
            await asyncio.gather(*(get(target, site.url) for _ in range(8)))
            site.hold = 0
            assert len(target.connections) == 8
            linear_pass(target)  # a sweep now, so the requests below fall between two
            monkeypatch.setattr(guard, "readable", counted)
            for _ in range(20):
                await get(target, site.url)
            assert len(target.connections) == 8
            await target.aclose()

    monkeypatch.setattr(keepalive, "SWEEP_EVERY", 60.0)
    asyncio.run(scenario())
    assert len(polls) == 20


def test_a_sweep_closes_an_idle_connection_the_server_closed_though_no_request_wants_it() -> None:
    async def scenario() -> tuple[Site, Site]:
        async with Site() as a, Site(close_after=0.01) as b:
            target = pool(4)
            await get(target, a.url)
            await get(target, b.url)
            await asyncio.sleep(0.2)  # b's server has closed its connection by now
            target._hutch_swept = 0.0  # type: ignore[attr-defined]  # the last sweep long ago
            await get(target, a.url)  # the request's pass is a sweep: b's connection goes
            assert [c._origin.port for c in target.connections] == [a.server.sockets[0].getsockname()[1]]
            await target.aclose()
        return a, b

    a, b = asyncio.run(scenario())
    assert a.accepted == 1 and b.accepted == 1
