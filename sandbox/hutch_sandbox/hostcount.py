"""Requests per Host header and the most any one of them got within one second.

With wildcard entries one site port stands for thousands of domains, told apart only by the
Host header, so a per-port count says nothing about a per-domain limit. This counts what each
domain (the Host header as sent, lower-cased, so `host:port`) received: in all, and the most
within any window of one second (a sliding window, not calendar seconds, so a burst that
straddles a second boundary is counted whole). A token bucket of rate r and burst b lets at
most b + r through in any such window.

Memory is bounded: at most `max_hosts` hosts are tracked (later ones count under
`OVERFLOW`), a host name is cut at 300 characters, and each host keeps only the arrivals of
its last second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OVERFLOW", "HostCounter", "HostStats"]

OVERFLOW = "(other hosts)"
MAX_HOST_CHARS = 300
DEFAULT_MAX_HOSTS = 200_000
WINDOW = 1.0


@dataclass(frozen=True)
class HostStats:
    """What one host received: requests in all, and the most within one second."""

    total: int
    worst_second: int


class _Host:
    __slots__ = ("arrivals", "total", "worst")

    def __init__(self) -> None:
        self.arrivals: list[float] = []  # the last second's, oldest first (a list: a deque costs 600 bytes)
        self.total = 0
        self.worst = 0


class HostCounter:
    def __init__(
        self, max_hosts: int = DEFAULT_MAX_HOSTS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_hosts = max_hosts
        self._clock = clock
        self._hosts: dict[str, _Host] = {}

    def add(self, host: str | None) -> None:
        """Count one request carrying this Host header (None or "": no header)."""
        key = (host or "").strip().lower()[:MAX_HOST_CHARS]
        entry = self._hosts.get(key)
        if entry is None:
            if len(self._hosts) >= self.max_hosts:
                key = OVERFLOW
                entry = self._hosts.get(key)
            if entry is None:
                entry = self._hosts[key] = _Host()
        now = self._clock()
        arrivals = entry.arrivals
        stale = 0
        while stale < len(arrivals) and arrivals[stale] <= now - WINDOW:
            stale += 1
        del arrivals[:stale]
        arrivals.append(now)
        entry.total += 1
        entry.worst = max(entry.worst, len(arrivals))

    def stats(self) -> dict[str, HostStats]:
        """Every host seen so far, by Host header."""
        return {host: HostStats(entry.total, entry.worst) for host, entry in self._hosts.items()}

    def worst(self) -> tuple[str, int] | None:
        """The host with the most requests within one second, and that count; None before any request."""
        if not self._hosts:
            return None
        host, entry = max(self._hosts.items(), key=lambda item: item[1].worst)
        return host, entry.worst
