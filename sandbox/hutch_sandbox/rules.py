"""Which misbehaviour a request gets, decided by pure functions so runs can be replayed.

There is no shared random generator: every draw hashes (seed, site, request target, how many
times that target was requested before, what is being decided). A rerun with the same seed and
the same request order behaves identically, and a retried URL gets a fresh draw each time, so
it eventually gets through. The politeness window takes an injected clock for the same reason.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Literal

from hutch_sandbox.config import FaultConfig

__all__ = [
    "FAULT_ORDER",
    "FaultKind",
    "Politeness",
    "decide_block",
    "decide_fault",
    "draw",
    "is_datacenter",
    "latency_seconds",
]

FaultKind = Literal["reset", "hang", "trickle", "error_500", "error_503", "rate_429"]

# When several independent draws fire on one request, the first of these wins.
FAULT_ORDER: tuple[FaultKind, ...] = (
    "reset",
    "hang",
    "trickle",
    "error_500",
    "error_503",
    "rate_429",
)


def draw(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) fixed by ``seed`` and ``parts``."""
    key = "\x1f".join(str(part) for part in (seed, *parts)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def decide_fault(faults: FaultConfig, seed: int, site: str, target: str, count: int) -> FaultKind | None:
    """The fault injected into the ``count``-th (from 0) request for ``target``, if any."""
    for kind in FAULT_ORDER:
        probability: float = getattr(faults, kind)
        if probability > 0 and draw(seed, site, target, count, kind) < probability:
            return kind
    return None


def decide_block(seed: int, site: str, target: str, count: int, probability: float) -> bool:
    """Whether a datacenter client's ``count``-th request for ``target`` is blocked."""
    return probability > 0 and draw(seed, site, target, count, "block") < probability


def latency_seconds(seed: int, site: str, target: str, count: int, latency_ms: tuple[int, int]) -> float:
    """The delay before answering, uniform in the configured millisecond range."""
    low, high = latency_ms
    if high <= low:
        return low / 1000
    return (low + (high - low) * draw(seed, site, target, count, "latency")) / 1000


def is_datacenter(address: str, networks: Iterable[ipaddress.IPv4Network]) -> bool:
    """Whether a client address falls in one of the datacenter networks."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


class Politeness:
    """Per-client-IP rate ban: more than ``max_per_second`` requests in any 1 s window from one
    address bans it for ``ban_seconds``; requests during a ban are refused but do not extend it."""

    def __init__(
        self,
        max_per_second: int,
        ban_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_per_second = max_per_second
        self.ban_seconds = ban_seconds
        self._clock = clock
        self._recent: dict[str, deque[float]] = {}
        self._banned_until: dict[str, float] = {}

    def check(self, client: str) -> float | None:
        """Record a request; ``None`` if allowed, else the seconds left on the client's ban."""
        now = self._clock()
        until = self._banned_until.get(client)
        if until is not None:
            if now < until:
                return until - now
            del self._banned_until[client]
        recent = self._recent.setdefault(client, deque())
        recent.append(now)
        while recent and recent[0] <= now - 1.0:
            recent.popleft()
        if len(recent) > self.max_per_second:
            recent.clear()
            self._banned_until[client] = now + self.ban_seconds
            return self.ban_seconds
        return None
