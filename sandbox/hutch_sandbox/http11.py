"""A deliberately small HTTP/1.1 reader and writer on asyncio streams.

The sandbox exists to misbehave on purpose (hang after the headers, reset mid-exchange, send one
byte a second), which a full framework hides behind its own buffering and error handling. Only
what the sandbox needs is here: request heads, Content-Length bodies (chunked request bodies are
refused with 501), keep-alive rules, and an abrupt close that the peer sees as a TCP reset.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

__all__ = ["BadRequest", "Request", "format_head", "read_request", "reason", "reset_connection"]

MAX_BODY = 10 * 1024 * 1024
SERVER = "hutch-sandbox"


class BadRequest(Exception):
    """The peer sent something the sandbox will not parse; answer ``status`` and close."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        """First value of each query parameter."""
        parsed = parse_qs(urlsplit(self.target).query, keep_blank_values=True)
        return {key: values[0] for key, values in parsed.items()}


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection, or ``None`` if the peer closed between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise BadRequest(400, "connection closed inside the request head") from exc
    except asyncio.LimitOverrunError as exc:
        raise BadRequest(431, "request head too large") from exc
    lines = head.decode("latin-1").lstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"bad request line {lines[0]!r}")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, f"bad header line {line!r}")
        headers.append((name, value.strip()))
    request = Request(method, target, version, tuple(headers))
    if request.header("transfer-encoding") is not None:
        raise BadRequest(501, "chunked request bodies are not supported")
    length_text = request.header("content-length")
    if length_text is None:
        return request
    if not length_text.isdigit() or int(length_text) > MAX_BODY:
        raise BadRequest(400, f"bad Content-Length {length_text!r}")
    try:
        body = await reader.readexactly(int(length_text))
    except asyncio.IncompleteReadError as exc:
        raise BadRequest(400, "connection closed inside the request body") from exc
    return Request(method, target, version, request.headers, body)


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def format_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """A response status line and headers, with Date and Server added."""
    lines = [f"HTTP/1.1 {status} {reason(status)}"]
    lines.append(f"Date: {formatdate(usegmt=True)}")
    lines.append(f"Server: {SERVER}")
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close at once with SO_LINGER 0, so the kernel sends RST instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
