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
  limit (20). With more than 20 connections (`HUTCH_CONCURRENCY` above 20) a connection that
  goes idle is closed while the pool is past 20, and the next request to its site pays a new
  connection: 40 workers, 3 requests each, made 82 connections instead of 40.
- It gives an idle connection to every queued request that asks, in one pass and in the
  passes after, until the first of them starts on it; the others fail to start and go round
  again, each time with another pass.

`linear_pass` does the same work in one walk. Its surplus rule counts idle connections, as
the limit's name says: at most `max_keepalive_connections` stay open, the oldest first
closed. A connection given to a request that has not started on it yet is that request's:
no other request gets it, and it is not closed as surplus or to make room. The rest is
httpcore's own: a request gets the first idle connection to its origin, else a new one while
there is room, else the oldest idle connection is closed to make room; a connection has
expired when its keep-alive time has passed or its server closed it (each idle connection's
socket is asked, as before). The fetcher speaks HTTP/1.1 only, so no connection is shared by
two requests at once.

The pools are httpcore's classes with this one method replaced, so they keep every other
behaviour of the installed httpcore (`pyproject.toml` bounds it to 1.x, whose pools share the
method's contract: called under the pool's lock, it returns the connections to close).
"""

from __future__ import annotations

from typing import Any

import httpcore


def linear_pass(pool: Any) -> list[Any]:
    """httpcore's `_assign_requests_to_connections`, in one walk of the pool."""
    # A request's connection stays idle from the moment it is given until the request starts
    # on it (after an await): meanwhile it is the request's alone.
    reserved = {id(r.connection) for r in pool._requests if r.connection is not None}
    closing: list[Any] = []
    kept: list[Any] = []
    spare: list[Any] = []  # idle, and given to no request
    for connection in pool._connections:
        if connection.is_closed():
            continue
        if connection.has_expired():
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
        connection = next((c for c in spare if c.can_handle_request(origin)), None)
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
    swapped for the subclass above, which adds no state, so nothing else about it changes."""
    pool.__class__ = LINEAR.get(type(pool), type(pool))
    return pool
