"""The API's bounds on a request body (`hutch.services.api.limits`), driven as ASGI with no
server: what the app is handed, what the client is sent, what is left unread."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError

from hutch.services.api.limits import BodyRefused, LimitBodies
from hutch.settings import Settings

Message = dict[str, Any]


class Client:
    """The server's side of one request: its body as parts (None: the client stalls there),
    and what was sent back."""

    def __init__(self, parts: list[bytes | None], headers: dict[str, str] | None = None) -> None:
        self.parts = list(parts)
        self.headers = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        self.sent: list[Message] = []

    @property
    def scope(self) -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/jobs", "headers": self.headers}

    async def receive(self) -> Message:
        if not self.parts:
            await asyncio.Event().wait()  # the body is over: only a disconnect would come
        part = self.parts.pop(0)
        if part is None:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": part, "more_body": bool(self.parts)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def answer(self) -> dict[str, Any]:
        return dict(json.loads(b"".join(m.get("body", b"") for m in self.sent[1:])))


class Route:
    """The app behind the middleware: reads the whole body as FastAPI does, and answers 400
    to a body that could not be read (as FastAPI does), else 202 with the length read."""

    def __init__(self) -> None:
        self.called = False
        self.read = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        try:
            while True:
                message = await receive()
                self.read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            status, body = 202, json.dumps({"read": self.read}).encode()
        except BodyRefused:
            status, body = 400, b'{"error": "There was an error parsing the body"}'
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})


async def run(client: Client, max_bytes: int = 100, timeout: float = 1.0) -> Route:
    route = Route()
    await asyncio.wait_for(LimitBodies(route, max_bytes, timeout)(client.scope, client.receive, client.send), 5)
    return route


async def test_a_body_of_exactly_the_limit_reaches_the_route_whole() -> None:
    client = Client([b"x" * 60, b"x" * 40], {"content-length": "100"})
    route = await run(client)
    assert route.called and client.status == 202 and client.answer == {"read": 100}


async def test_a_declared_length_over_the_limit_is_413_before_the_app_runs_and_the_rest_is_drained() -> None:
    client = Client([b"x" * 60, b"x" * 60], {"content-length": "120"})
    route = await run(client)
    assert not route.called
    assert client.status == 413
    assert client.answer["field"] is None and "100 bytes (HUTCH_API_MAX_BODY_BYTES)" in client.answer["error"]
    assert (b"connection", b"close") in client.sent[0]["headers"]
    assert client.parts == []  # read and dropped, so the socket closes clean
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_a_client_awaiting_100_continue_is_refused_without_being_asked_for_the_body() -> None:
    client = Client([b"x" * 120], {"content-length": "120", "expect": "100-continue"})
    await run(client)
    assert client.status == 413 and client.parts == [b"x" * 120]


async def test_a_chunked_body_is_cut_at_the_limit_and_the_routes_own_answer_gives_way_to_413() -> None:
    client = Client([b"x" * 60, b"x" * 41, b"x" * 1000])
    route = await run(client)
    assert route.read == 60  # the part that crossed the limit never reached the route
    assert client.status == 413 and "error" in client.answer
    assert [m["type"] for m in client.sent].count("http.response.start") == 1


async def test_a_stalled_body_is_408_at_the_deadline() -> None:
    client = Client([b"x" * 10, None], {"content-length": "50"})
    began = asyncio.get_running_loop().time()
    await run(client, timeout=0.2)
    assert 0.2 <= asyncio.get_running_loop().time() - began < 1.0
    assert client.status == 408 and "0.2 s (HUTCH_API_BODY_TIMEOUT)" in client.answer["error"]


async def test_the_deadline_is_on_the_whole_body_not_on_each_read() -> None:
    class Dribbling(Client):
        async def receive(self) -> Message:
            await asyncio.sleep(0.05)
            return {"type": "http.request", "body": b"x", "more_body": True}

    client = Dribbling([])
    await run(client, timeout=0.3)
    assert client.status == 408


async def test_once_the_body_is_whole_waiting_for_a_disconnect_has_no_deadline() -> None:
    """An item stream listens for the client leaving for as long as it streams."""

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receive(), 0.3)  # past the 0.1 s deadline: still waiting, no error
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    client = Client([b""])
    await LimitBodies(streaming, 100, 0.1)(client.scope, client.receive, client.send)
    assert client.status == 200


@pytest.mark.parametrize("name", ["api_max_body_bytes", "api_body_timeout"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_limits_must_be_positive(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"HUTCH_{name.upper()}", value)
    with pytest.raises(ValidationError, match=name):
        Settings()
