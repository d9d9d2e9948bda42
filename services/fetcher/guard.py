"""The guard against server-side request forgery: Hutch fetches the public web, not your network.

A URL list is input from outside; without a guard, `http://169.254.169.254/latest/meta-data/`
or `http://10.0.0.5:6379/` would be fetched from inside your network like any page. Targets
that resolve to loopback, private, link-local, cloud-metadata, unspecified, multicast or
reserved addresses are refused (and IPv6 addresses that embed such an IPv4 address: 6to4,
Teredo, IPv4-mapped; and site-local `fec0::/10`), unless `host:port` (as written in the URL, or as resolved)
is in the allowlist (`HUTCH_ALLOWED_TARGETS`) or private networks are allowed outright
(`HUTCH_ALLOW_PRIVATE_NETWORKS`).

The check runs after DNS resolution and the connection goes to the address that was
checked (`GuardedBackend`), so a name that resolves differently on a second lookup (DNS
rebinding) cannot slip through. Every redirect is a new attempt and is checked again.
Through a proxy the proxy resolves the name; the target is checked here beforehand.

`HUTCH_RESOLVE=host:port:address[,...]` answers lookups for those names first, like curl's
`--resolve`, so tests can use real host names on loopback. Both lists take wildcard entries
(`*.shop.test:8443:127.0.0.1`, `*.shop.test:8443`) and are looked up by host and port in
`hutch.targets` tables, whose rules say which entry wins; a lookup costs the same with
100,000 names as with ten.
"""

from __future__ import annotations

import asyncio
import ipaddress
import select
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import httpcore

from hutch.targets import HostTable, Pattern, allowed_table, resolve_table, split_entries

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata endpoints that are not caught by "link-local" alone.
METADATA = {
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("169.254.170.2"),
    ipaddress.ip_address("100.100.100.200"),
    ipaddress.ip_address("fd00:ec2::254"),
}


class ForbiddenTarget(Exception):
    """A target Hutch refuses to fetch; the message says which address and why."""


class ResolveError(Exception):
    """A host name that does not resolve."""


# Deprecated site-local IPv6 (RFC 3879); Python's ipaddress still calls it global.
SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")


def _embedded(address: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """IPv4 addresses an IPv6 address carries, which a tunnel or a NAT64 gateway may reach."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if address.sixtofour is not None:  # 2002::/16
        found.append(("6to4", address.sixtofour))
    if address.teredo is not None:  # 2001::/32: (server, client)
        found.extend(("Teredo", embedded) for embedded in address.teredo)
    return found


def why_forbidden(address: IPAddress) -> str | None:
    """The reason an address is not a public internet address, or None when it is."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address in SITE_LOCAL:
            return "site-local"
        else:
            for kind, embedded in _embedded(address):
                reason = why_forbidden(embedded)
                if reason is not None:
                    return f"{kind} address embedding {embedded} ({reason})"
    if address in METADATA:
        return "cloud metadata"
    for flag, reason in _FLAGGED:
        if getattr(address, flag):
            return reason
    if not address.is_global:
        return "not global"
    return None


# The ipaddress flags that forbid an address, in the order their reason is given.
_FLAGGED = (
    ("is_loopback", "loopback"),
    ("is_link_local", "link-local"),
    ("is_private", "private"),
    ("is_unspecified", "unspecified"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
)


def parse_overrides(spec: str | Iterable[str]) -> HostTable[str]:
    """`host:port:address` entries (comma separated, or an iterable), wildcards included, as a table.

    A malformed entry raises `hutch.targets.BadEntry` (a ValueError) that quotes it.
    """
    return resolve_table(split_entries(spec) if isinstance(spec, str) else spec)


def _table(overrides: Mapping[tuple[str, int], str] | HostTable[str] | None) -> HostTable[str]:
    if isinstance(overrides, HostTable):
        return overrides
    table: HostTable[str] = HostTable()
    for (host, port), address in (overrides or {}).items():
        table.add(Pattern(host.lower().strip("[]"), port), address, f"{host}:{port}:{address}", "resolve")
    return table


def _lookup_host(host: str) -> str:
    """A host as the tables hold it: lower case, IPv6 without brackets, no trailing dot."""
    return host.lower().strip("[]").removesuffix(".")


class TargetGuard:
    def __init__(
        self,
        allowed: Iterable[str] | HostTable[str] = (),
        allow_private: bool = False,
        overrides: Mapping[tuple[str, int], str] | HostTable[str] | None = None,
    ) -> None:
        self.allowed = allowed if isinstance(allowed, HostTable) else allowed_table(allowed)
        self.allow_private = allow_private
        self.overrides = _table(overrides)

    async def resolve(self, host: str, port: int) -> list[str]:
        host = _lookup_host(host)
        override = self.overrides.get(host, port)
        if override is not None:
            return [override]
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ResolveError(f"cannot resolve {host}: {exc.strerror}") from None
        seen: list[str] = []
        for info in infos:
            address = str(info[4][0])
            if address not in seen:
                seen.append(address)
        return seen

    def _allowed(self, host: str, port: int, address: str) -> bool:
        if self.allowed.get(_lookup_host(host), port) is not None:
            return True
        return self.allowed.get(ipaddress.ip_address(address).compressed, port) is not None

    async def check(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for host:port; ForbiddenTarget if any is off limits."""
        addresses = await self.resolve(host, port)
        if self.allow_private:
            return addresses
        for address in addresses:
            reason = why_forbidden(ipaddress.ip_address(address))
            if reason is not None and not self._allowed(host, port, address):
                raise ForbiddenTarget(
                    f"{host}:{port} resolves to {address} ({reason}); add it to HUTCH_ALLOWED_TARGETS to fetch it"
                )
        return addresses


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses the guard has checked."""

    def __init__(self, guard: TargetGuard, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self.guard = guard
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self.guard.check(host, port)
        except ResolveError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        error: Exception | None = None
        for address in addresses:
            try:
                return KeptSocketStream(
                    await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not fetch targets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class KeptSocketStream(httpcore.AsyncNetworkStream):
    """A connection's stream that looks its socket up once.

    Before each request httpcore asks every idle connection of its pool whether its socket is
    readable (a server that closed it). anyio answers any question about a socket by building
    every one of its attributes, a `getpeername` call among them: 9 % of the fetcher's
    samples on small pages (py-spy, docs/benchmarks.md, eighth round). Here the socket is
    kept from the start, and the question is a poll of it; everything else goes through.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self.inner = inner
        self.socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return KeptSocketStream(await self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self.socket is not None:
            return readable(self.socket)
        if info == "socket" and self.socket is not None:
            return self.socket
        return self.inner.get_extra_info(info)


def readable(sock: socket.socket) -> bool:
    """Whether reading `sock` would not block: data, or the peer's close (or it is closed
    here already). For an idle keep-alive connection, any of them means it is done."""
    if sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
