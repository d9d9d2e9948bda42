"""The API service's process: the HTTP server (uvicorn) on the service's event loop, with a
broker connection (submissions, job controls, replays, the governors' status) and the store
(reads, and the deletes and job states the CLI would write).

It refuses to start on an address beyond loopback without `HUTCH_API_TOKEN`: a job API
open to a network would let anyone there submit work, read items and purge dead letters.
`/metrics`, `/healthz` and `/readyz` are on the API's own port, unauthenticated, as probes and
scrapes need them; `/readyz` is 200 while the broker connection is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket

import uvicorn

from hutch.service import Service
from hutch.services.api.routes import MAX_STREAMS, build
from hutch.settings import Settings
from hutch.store import AsyncStore

log = logging.getLogger(__name__)
# A request line and headers over this are refused (400) before any route runs: a bearer
# token and the usual headers take a few hundred bytes. h11's default, made explicit.
MAX_HEAD_BYTES = 16 * 1024
KEEP_ALIVE = 5  # seconds


class ApiRefused(SystemExit):
    """A setting that makes the API unsafe or impossible to serve; the message says which."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def check_bind(settings: Settings) -> None:
    if settings.api_token is None and not is_loopback(settings.api_host):
        raise ApiRefused(
            f"api: refusing to listen on {settings.api_host} without HUTCH_API_TOKEN: anyone who can reach "
            "it could submit, read and delete jobs. Set a token, or listen on 127.0.0.1"
        )
    if settings.api_token is not None and not settings.api_token.get_secret_value().strip():
        raise ApiRefused("api: HUTCH_API_TOKEN is empty")


class Api(Service):
    name = "api"

    def __init__(self, settings: Settings) -> None:
        check_bind(settings)
        super().__init__(settings)
        self.port = settings.api_port
        self._server: uvicorn.Server | None = None
        self._main: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        # One replay at a time: two at once would both send the letters neither has marked yet.
        self.replaying = asyncio.Lock()
        self.streams = asyncio.Semaphore(MAX_STREAMS)

    @property
    def ready(self) -> bool:
        connection = self.broker.connection
        return connection is not None and connection.connected.is_set() and self._server is not None

    async def serve_metrics(self) -> None:
        """Served on the API's port with the routes, not on a port of their own."""

    async def start(self) -> None:
        s = self.settings
        self.store = await AsyncStore(s.store_location).open()
        # Bound here rather than by uvicorn, so a port in use is this process's clear error.
        family = socket.AF_INET6 if ":" in s.api_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((s.api_host, s.api_port))
        except OSError as exc:
            sock.close()
            raise ApiRefused(f"api: cannot listen on {s.api_host}:{s.api_port}: {exc.strerror}") from None
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build(self),
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=False,
            # A client that stops reading an item stream must not hold the shutdown.
            timeout_graceful_shutdown=max(1, int(s.shutdown_grace)),
            # h11, whatever else is installed: its bound on a request's head is the one set here
            # (httptools, which uvicorn would prefer, has its own). A body is bounded in
            # `limits` (HUTCH_API_MAX_BODY_BYTES, HUTCH_API_BODY_TIMEOUT).
            http="h11",
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            # An idle connection between two requests closes after this (uvicorn's default).
            timeout_keep_alive=KEEP_ALIVE,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        # startup and main_loop, not serve(): serve() would take over SIGTERM and SIGINT,
        # which the service handles (stop in order).
        await server.startup(sockets=[sock])
        self._server = server
        self._main = asyncio.create_task(server.main_loop())
        log.info("api on http://%s:%d (auth %s)", s.api_host, self.port, "on" if s.api_token else "off")

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            if self._main is not None:
                with contextlib.suppress(Exception):
                    await self._main
            await server.shutdown(sockets=[self._socket] if self._socket else None)
        await self.store.close()


SERVICE = Api
