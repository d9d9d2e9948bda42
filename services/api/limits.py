"""Bounds on a request body: how many bytes it may hold and how long it may take to arrive.

Starlette reads a body when the route asks for it (the JSON of `POST /jobs` whole, a multipart
URL file spooled to disk) with no limit of its own, and uvicorn waits for a body as long as its
client takes. Without bounds a client could fill the API's disk, or hold a request open for
ever by sending a byte now and then. This middleware counts the bytes as they arrive and keeps
one deadline for the whole body, from the moment its head was read; past either, the reader
gets an error instead of the rest (FastAPI turns it into its own 400 before any route code
runs, so nothing of the body is acted on) and the client gets 413 or 408 in the API's error
shape. A body declared over the cap (`Content-Length`) is refused before any of it is read.

The answer goes out first; the connection closes once the rest of the body arrived (read and
dropped) or the deadline passed: closed with unread bytes, the socket is reset, and a client
still sending (httpx sends the whole body before it reads) reads the reset, not the answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Breach = Literal["too_large", "too_slow"]
STATUS: dict[Breach, int] = {"too_large": 413, "too_slow": 408}


class BodyRefused(Exception):
    """Raised to the body's reader: the body broke a bound, and the client gets the answer."""

    def __init__(self, breach: Breach) -> None:
        super().__init__(breach)
        self.breach = breach


class LimitBodies:
    """ASGI middleware: each request body at most `max_bytes`, whole within `timeout` seconds."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    def message(self, breach: Breach) -> str:
        if breach == "too_large":
            return (
                f"the request body is over the API's limit of {self.max_bytes} bytes (HUTCH_API_MAX_BODY_BYTES); "
                "send a longer URL file as several uploads to the same job"
            )
        return f"the request body did not arrive within {self.timeout:g} s (HUTCH_API_BODY_TIMEOUT)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()


def _declared_length(headers: Headers) -> int | None:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


class _Exchange:
    """One request under the limits: the body counted as the app reads it, its answer held
    back once the body broke a bound (the app's own answer to the broken body gives way)."""

    def __init__(self, limits: LimitBodies, scope: Scope, receive: Receive, send: Send) -> None:
        self.limits = limits
        self.scope = scope
        self._receive = receive
        self._send = send
        self.headers = Headers(scope=scope)
        self.deadline = asyncio.get_running_loop().time() + limits.timeout
        self.received = 0
        self.asked = False  # the app called receive: uvicorn answered any `Expect: 100-continue`
        self.complete = False  # the body's last part came (or the client left)
        self.breach: Breach | None = None
        self.started = False  # the app's response began: it can no longer be replaced

    async def run(self) -> None:
        declared = _declared_length(self.headers)
        if declared is not None and declared > self.limits.max_bytes:
            self.breach = "too_large"
        else:
            try:
                await self.limits.app(self.scope, self.receive, self.send)
            except Exception:  # BodyRefused, or what the app made of it
                if self.breach is None or self.started:
                    raise
        if self.breach is not None and not self.started:
            await self.refuse(self.breach)

    async def receive(self) -> Message:
        if self.breach is not None:
            raise BodyRefused(self.breach)
        self.asked = True
        if self.complete:  # past the body only a disconnect comes: no deadline on waiting for it
            return await self._receive()
        timeout = asyncio.timeout_at(self.deadline)
        try:
            async with timeout:
                message = await self._receive()
        except TimeoutError:
            if not timeout.expired():
                raise
            self.breach = "too_slow"
            raise BodyRefused(self.breach) from None
        if message["type"] != "http.request":
            self.complete = True
            return message
        self.received += len(message.get("body", b""))
        self.complete = not message.get("more_body", False)
        if self.received > self.limits.max_bytes:
            self.breach = "too_large"
            raise BodyRefused(self.breach)
        return message

    async def send(self, message: Message) -> None:
        if self.breach is not None and not self.started:
            return  # the app's answer to a body cut short; the refusal goes out instead
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def refuse(self, breach: Breach) -> None:
        body = json.dumps({"error": self.limits.message(breach), "field": None}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await self._send({"type": "http.response.start", "status": STATUS[breach], "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": True})
        await self.drain()
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def drain(self) -> None:
        """Read and drop what is left of the body, until the deadline at most."""
        if self.complete:
            return
        if not self.asked and "100-continue" in self.headers.get("expect", "").lower():
            return  # the client waits for a go-ahead before it sends the body: there is none to drain
        try:
            async with asyncio.timeout_at(self.deadline):
                while True:
                    message = await self._receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return
        except TimeoutError:
            return
