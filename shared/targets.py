"""Host tables for `HUTCH_RESOLVE` and `HUTCH_ALLOWED_TARGETS`, wildcard entries included.

The sandbox stands for thousands of domains on one port, and one environment variable holds
at most 128 KiB (about 5,000 `host:port:address` entries), so one entry may name many hosts:

- `shop.test:8443` names one host; `*.shop.test:8443` names every host under `shop.test`
  (`a.shop.test`, `a.b.shop.test`) but neither `shop.test` itself nor `evilshop.test`. A
  wildcard stands for one or more whole labels, as in DNS and in TLS certificates; list both
  entries to cover the bare name too. `*` is only ever the whole leftmost label.
- `*` alone names every host. `HUTCH_RESOLVE` accepts it (curl's `--resolve` does too); the
  allowlist refuses it, since it would switch the guard off for a port, which
  `HUTCH_ALLOW_PRIVATE_NETWORKS` says plainly.
- The port may be `*`: any port.
- Wildcards match names, never IP addresses.

Which entry answers a (host, port): the exact host before any wildcard, a longer wildcard
suffix before a shorter one, `*` last; for the same host or suffix an exact port before `*`.
A lookup probes one dict per candidate (the host, then each suffix of it), never scans the
entries, so 100,000 entries cost a request what ten do.

Entries are normalised as the URL validator normalises a URL's host (UTS 46 mapping,
A-labels, lower case, no trailing dot), which is the form the fetcher looks up.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar
from urllib.parse import urlsplit

from hutch.urls import InvalidURL, check_url

__all__ = [
    "BadEntry",
    "HostTable",
    "Pattern",
    "allowed_table",
    "parse_resolve",
    "parse_target",
    "resolve_table",
    "split_entries",
]

V = TypeVar("V")
Kind = Literal["resolve", "allowed target"]

# Characters that would make `http://<host>/` mean another host than the text says.
_NOT_IN_HOST = frozenset("/?#@\\[]%")


class BadEntry(ValueError):
    """An entry of HUTCH_RESOLVE or HUTCH_ALLOWED_TARGETS that cannot be used; the message quotes it."""


@dataclass(frozen=True)
class Pattern:
    """The hosts and ports one entry names."""

    host: str  # the normalised host; for a wildcard the suffix after `*.`, "" for `*` alone
    port: int | None  # None: any port
    wildcard: bool = False

    def __str__(self) -> str:
        host = ("*." + self.host if self.host else "*") if self.wildcard else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{'*' if self.port is None else self.port}"


def split_entries(value: str) -> tuple[str, ...]:
    """Comma-separated entries, blanks dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _fail(kind: Kind, entry: str, why: str) -> BadEntry:
    return BadEntry(f"{kind} entry {entry[:200]!r}: {why}")


def _port(text: str, kind: Kind, entry: str) -> int | None:
    if text == "*":
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise _fail(kind, entry, f"port {text[:20]!r} is not a number from 1 to 65535, nor *")
    return int(text)


def _name(text: str, kind: Kind, entry: str) -> str:
    """A host name or IPv4 address as the URL validator normalises it."""
    if not text or _NOT_IN_HOST.intersection(text) or "*" in text:
        raise _fail(kind, entry, f"{text[:80]!r} is not a host name or address")
    try:
        checked = check_url(f"http://{text}/")
    except InvalidURL as exc:
        raise _fail(kind, entry, f"{text[:80]!r} is not a host name or address ({exc})") from None
    host = urlsplit(checked.url).hostname
    assert host is not None
    return host


def _is_address(host: str) -> bool:
    # A normalised name never ends in a digit (the URL validator refuses a numeric last label).
    if not (host[-1:].isdigit() or ":" in host):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host(text: str, kind: Kind, entry: str) -> tuple[str, bool]:
    """(normalised host or wildcard suffix, whether it is a wildcard) of an entry's host part."""
    if text.startswith("[") and text.endswith("]"):
        try:
            return ipaddress.IPv6Address(text[1:-1]).compressed, False
        except ValueError:
            raise _fail(kind, entry, f"{text[:80]!r} is not an IPv6 address") from None
    if "*" not in text:
        return _name(text, kind, entry), False
    if text == "*":
        if kind == "allowed target":
            raise _fail(
                kind, entry, "`*` alone would let every host through; set HUTCH_ALLOW_PRIVATE_NETWORKS instead"
            )
        return "", True
    if not text.startswith("*.") or "*" in text[2:]:
        raise _fail(kind, entry, "`*` may only be the whole leftmost label, as in *.shop.test")
    suffix = _name(text[2:], kind, entry)
    if _is_address(suffix):
        raise _fail(kind, entry, "a wildcard covers host names, not addresses")
    return suffix, True


def _split_host(entry: str, kind: Kind) -> tuple[str, str]:
    """(host part, the rest after its colon); an IPv6 host is bracketed."""
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0 or entry[close + 1 : close + 2] != ":":
            raise _fail(kind, entry, "an IPv6 host is written [address]:port")
        return entry[: close + 1], entry[close + 2 :]
    host, colon, rest = entry.partition(":")
    if not colon:
        raise _fail(kind, entry, "no port")
    return host, rest


def parse_target(entry: str) -> Pattern:
    """An allowlist entry: `host:port`, `*.suffix:port`, `[v6]:port`; the port may be `*`."""
    host_text, port_text = _split_host(entry, "allowed target")
    if ":" in port_text:
        raise _fail("allowed target", entry, "not host:port")
    host, wildcard = _host(host_text, "allowed target", entry)
    return Pattern(host, _port(port_text, "allowed target", entry), wildcard)


def parse_resolve(entry: str) -> tuple[Pattern, str]:
    """A resolve entry, `host:port:address` (the host may be a wildcard, the port `*`), and its address."""
    host_text, rest = _split_host(entry, "resolve")
    port_text, colon, address_text = rest.partition(":")
    if not colon:
        raise _fail("resolve", entry, "not host:port:address")
    host, wildcard = _host(host_text, "resolve", entry)
    port = _port(port_text, "resolve", entry)
    bare = address_text[1:-1] if address_text.startswith("[") and address_text.endswith("]") else address_text
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        raise _fail("resolve", entry, f"{address_text[:60]!r} is not an IP address") from None
    return Pattern(host, port, wildcard), address.compressed


class HostTable(Generic[V]):
    """Values by (host, port) pattern; `get` finds the most specific entry in O(labels of the host)."""

    def __init__(self) -> None:
        self._exact: dict[tuple[str, int | None], V] = {}
        self._wild: dict[tuple[str, int | None], V] = {}
        self._entries: dict[tuple[bool, str, int | None], str] = {}

    def add(self, pattern: Pattern, value: V, entry: str, kind: Kind) -> None:
        """Add one entry; an earlier entry for the same hosts and port with another value is an error."""
        table = self._wild if pattern.wildcard else self._exact
        key = (pattern.host, pattern.port)
        if key in table and table[key] != value:
            earlier = self._entries[(pattern.wildcard, *key)]
            raise _fail(kind, entry, f"names the same hosts and port as {earlier!r}, with another value")
        table[key] = value
        self._entries[(pattern.wildcard, *key)] = entry

    def __len__(self) -> int:
        return len(self._exact) + len(self._wild)

    def get(self, host: str, port: int) -> V | None:
        """The value of the most specific entry naming host:port (host normalised), or None."""
        found = self._exact.get((host, port))
        if found is None:
            found = self._exact.get((host, None))
        if found is not None or not self._wild or _is_address(host):
            return found
        # Each proper suffix, longest first, so `*.a.shop.test` wins over `*.shop.test`;
        # the suffix always starts after a dot, so `*.shop.test` never covers `evilshop.test`.
        dot = host.find(".")
        while True:
            suffix = host[dot + 1 :] if dot >= 0 else ""
            found = self._wild.get((suffix, port))
            if found is None:
                found = self._wild.get((suffix, None))
            if found is not None or not suffix:
                return found
            dot = host.find(".", dot + 1)


def allowed_table(entries: Iterable[str]) -> HostTable[str]:
    """The allowlist; each value is its entry in normalised form (`*.shop.test:8443`)."""
    table: HostTable[str] = HostTable()
    for entry in entries:
        if entry.strip():
            pattern = parse_target(entry.strip())
            table.add(pattern, str(pattern), entry.strip(), "allowed target")
    return table


def resolve_table(entries: Iterable[str]) -> HostTable[str]:
    """Addresses by host and port, for answering lookups before DNS."""
    table: HostTable[str] = HostTable()
    for entry in entries:
        if entry.strip():
            pattern, address = parse_resolve(entry.strip())
            table.add(pattern, address, entry.strip(), "resolve")
    return table
