"""What httpcore's bookkeeping pass costs the fetcher a request, against the fetcher's own.

    .venv/bin/python bench/pool_pass.py [--sizes 16,64] [--passes 2000] [--rounds 5]
    .venv/bin/python bench/pool_pass.py --stream [--workers 16,64] [--requests 4000]

httpcore runs the pass each time a request joins the pool and each time a response is
closed (about two a page). For each pool size, the pool is filled with that many idle
keep-alive connections to servers in this process, on 127.0.0.1, and the pass is run
`--passes` times on httpcore's pool and on `hutch.services.fetcher.keepalive.ConnectionPool`,
alternating for `--rounds` rounds; the median microseconds a pass are printed. A pass
closes nothing here: the keep-alive limit is set to the pool's size.

With `--stream`, each of `--workers` tasks sends requests one after the other to one
server, `--requests` in all, through a client built as the fetcher builds its own
(`make_client`: every connection of the pool may stay idle), once on each pool: printed are the connections the
server accepted, the CPU seconds of this process (the server's included) and the requests a
second. On httpcore's pool, requests that are given the same idle connection go round again.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from typing import Any

import httpcore

from hutch.services.fetcher import fetch
from hutch.services.fetcher.guard import GuardedBackend, TargetGuard
from hutch.services.fetcher.keepalive import ConnectionPool

BODY = b"<html><title>t</title></html>"


class Server:
    """An HTTP/1.1 keep-alive server that answers every request at once, counting connections."""

    def __init__(self) -> None:
        self.accepted = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(head + BODY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:  # still open when the run ends: no traceback for it
            return
        finally:
            writer.close()


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def filled(kind: type, size: int, port: int) -> Any:
    pool = kind(
        max_connections=size, max_keepalive_connections=size, keepalive_expiry=3600,
        network_backend=GuardedBackend(TargetGuard(allow_private=True)),
    )
    url = f"http://127.0.0.1:{port}/"

    async def one() -> None:
        response = await pool.request("GET", url)
        assert response.status == 200

    await asyncio.gather(*(one() for _ in range(size)))
    assert len(pool.connections) == size, len(pool.connections)
    return pool


async def passes(sizes: list[int], count: int, rounds: int) -> None:
    server = Server()
    port = await server.start()
    for size in sizes:
        pools = {"httpcore's pool": await filled(httpcore.AsyncConnectionPool, size, port),
                 "Hutch's pool": await filled(ConnectionPool, size, port)}
        times: dict[str, list[float]] = {name: [] for name in pools}
        for _ in range(rounds):
            for name, pool in pools.items():
                start = time.perf_counter()
                for _ in range(count):
                    pool._assign_requests_to_connections()
                times[name].append((time.perf_counter() - start) / count * 1e6)
        assert all(len(pool.connections) == size for pool in pools.values())
        print(f"{size} idle connections: " + ", ".join(
            f"{name} {statistics.median(t):.1f} µs a pass" for name, t in times.items()))
        for pool in pools.values():
            await pool.aclose()


async def send_all(client: Any, url: str, workers: int, requests: int) -> tuple[float, float]:
    """`requests` GETs of `url` by `workers` tasks, each one after the other; (seconds, CPU seconds)."""
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            response = await client.get(url)
            assert response.status_code == 200

    start_cpu, start = cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.perf_counter() - start, cpu() - start_cpu


async def stream(workers_list: list[int], requests: int) -> None:
    for workers in workers_list:
        figures = []
        for name, linear in (("httpcore's pool", False), ("Hutch's pool", True)):
            server = Server()
            port = await server.start()
            client = fetch.make_client(
                proxy=None, guard=TargetGuard(allow_private=True), user_agent="bench",
                connect_timeout=5, read_timeout=5, concurrency=max(workers, 10),
            )
            if not linear:  # the same pool's settings, on httpcore's class
                client._transport._pool.__class__ = httpcore.AsyncConnectionPool
            seconds, used = await send_all(client, f"http://127.0.0.1:{port}/", workers, requests)
            figures.append(
                f"{name}: {server.accepted} connections, {used:.2f} s of CPU, {requests / seconds:.0f} requests/s"
            )
            await client.aclose()
            assert server.server is not None
            server.server.close()
        print(f"{workers} workers, {requests} requests: " + "; ".join(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--workers", default="16,64")
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args()
    if args.stream:
        asyncio.run(stream([int(n) for n in args.workers.split(",")], args.requests))
    else:
        asyncio.run(passes([int(n) for n in args.sizes.split(",")], args.passes, args.rounds))


if __name__ == "__main__":
    main()
