"""The fetcher's connection pools: httpcore's, with its bookkeeping pass made linear.

httpcore runs one pass over its pool each time a request joins it and each time a response
is closed (two a page, a few more when requests collide): it drops closed connections,
closes expired and surplus idle ones, and gives queued requests a connection. In httpcore
1.0 that pass has three faults, measured by `bench/pool_pass.py` and
`tests/unit/test_keepalive.py`:

- It is quadratic: for every idle connection it counts the whole pool again. With the
  fetcher's 16 connections a pass cost 67-72 µs against 26-27 here; with 64, 709-773 µs
  against 103-107.
- Its surplus rule compares the pool's size, not its idle connections, with the keep-alive
  limit. With a limit of 20 (the fetcher's until it let every connection of the pool stay
  idle) and more than 20 connections, a connection that goes idle is closed while the pool
  is past 20, and the next request to its site pays a new connection: 40 workers, 3
  requests each, made 82 connections instead of 40.
- It gives an idle connection to every queued request that asks, in one pass and in the
  passes after, until the first of them starts on it; the others fail to start and go round
  again, each time with another pass.

`linear_pass` does the same work in one walk. Its surplus rule counts idle connections, as
the limit's name says: at most `max_keepalive_connections` stay open, the oldest first
closed. A connection given to a request that has not started on it yet is that request's:
no other request gets it, and it is not closed as surplus or to make room. The rest is
httpcore's own: a request gets the first idle connection to its origin, else a new one while
there is room, else the oldest idle connection is closed to make room; a connection has
expired when its keep-alive time has passed or its server closed it. Asking that polls the
connection's socket, and httpcore asks every connection at every pass: with 16 connections,
about 24 polls a request and a seventh of the fetcher's CPU on the way from a task to its
outcome (docs/benchmarks.md, 21st round). Here a pass asks every connection at most once a
second (`SWEEP_EVERY`, the sweep), and otherwise only the idle connection it is about to give to a
request, which is closed instead when it has expired. So a connection its server closed is
never used, and one that no request wants is closed by the next sweep. The fetcher speaks
HTTP/1.1 only, so no connection is shared by two requests at once.

The pools are httpcore's classes with this one method replaced (and the time of the last
sweep kept on the pool), so they keep every other behaviour of the installed httpcore
(`pyproject.toml` bounds it to 1.x, whose pools share the method's contract: called under
the pool's lock, it returns the connections to close).
"""

from __future__ import annotations

import time
from typing import Any

import httpcore

SWEEP_EVERY = 1.0  # seconds: how often a pass asks every connection whether it has expired


def linear_pass(pool: Any) -> list[Any]:
    """httpcore's `_assign_requests_to_connections`, in one walk of the pool."""
    # A request's connection stays idle from the moment it is given until the request starts
    # on it (after an await): meanwhile it is the request's alone.
    reserved = {id(r.connection) for r in pool._requests if r.connection is not None}
    # Whether a connection has expired costs a poll of its socket: asked of every connection
    # once a second, and of an idle one each time it is about to be given to a request.
    now = time.monotonic()
    sweep = now - getattr(pool, "_hutch_swept", -SWEEP_EVERY) >= SWEEP_EVERY
    if sweep:
        pool._hutch_swept = now
    closing: list[Any] = []
    kept: list[Any] = []
    spare: list[Any] = []  # idle, and given to no request
    for connection in pool._connections:
        if connection.is_closed():
            continue
        if sweep and connection.has_expired():
            closing.append(connection)
            continue
        kept.append(connection)
        if connection.is_idle() and id(connection) not in reserved:
            spare.append(connection)
    surplus = len(spare) - pool._max_keepalive_connections
    if surplus > 0:
        dropped, spare = spare[:surplus], spare[surplus:]
        closing.extend(dropped)
        gone = set(map(id, dropped))
        kept = [c for c in kept if id(c) not in gone]
    pool._connections = kept

    for request in pool._requests:
        if not request.is_queued():
            continue
        origin = request.request.url.origin
        connection = _usable(spare, origin, kept, closing, asked=sweep)
        if connection is not None:
            spare.remove(connection)
        elif len(kept) < pool._max_connections:
            connection = pool.create_connection(origin)
            kept.append(connection)
        elif spare:  # full: the oldest spare connection (another site's) makes room
            oldest = spare.pop(0)
            kept.remove(oldest)
            closing.append(oldest)
            connection = pool.create_connection(origin)
            kept.append(connection)
        else:
            continue  # full, and every connection busy or spoken for: the request waits its turn
        request.assign_to_connection(connection)
    return closing


def _usable(spare: list[Any], origin: Any, kept: list[Any], closing: list[Any], *, asked: bool) -> Any:
    """The first spare connection to `origin` that has not expired (`asked`: this pass asked
    every connection already); one found expired on the way is dropped for closing."""
    for connection in [c for c in spare if c.can_handle_request(origin)]:
        if asked or not connection.has_expired():
            return connection
        spare.remove(connection)
        kept.remove(connection)
        closing.append(connection)
    return None


class ConnectionPool(httpcore.AsyncConnectionPool):
    """The direct connections' pool (the guard's network backend under it)."""

    _assign_requests_to_connections = linear_pass


class HTTPProxyPool(httpcore.AsyncHTTPProxy):
    _assign_requests_to_connections = linear_pass


class SOCKSProxyPool(httpcore.AsyncSOCKSProxy):
    _assign_requests_to_connections = linear_pass


LINEAR: dict[type, type] = {
    httpcore.AsyncConnectionPool: ConnectionPool,
    httpcore.AsyncHTTPProxy: HTTPProxyPool,
    httpcore.AsyncSOCKSProxy: SOCKSProxyPool,
}


def make_linear(pool: httpcore.AsyncConnectionPool) -> httpcore.AsyncConnectionPool:
    """The pool httpx built for a transport (a proxy's), now with the linear pass: its class is
    swapped for the subclass above, which adds no state but the time of its last sweep, so nothing
    else about it changes."""
    pool.__class__ = LINEAR.get(type(pool), type(pool))
    return pool
