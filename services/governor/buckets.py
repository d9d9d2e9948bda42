"""Per-domain token buckets: how the governor paces releases, with no broker in sight.

A bucket refills at `rate` tokens per second up to `burst`. It starts empty: a governor
that has just taken a domain over cannot know what its predecessor released a moment ago,
so it waits for a token rather than bursting. `debit` spends a token released by another
governor (seen on the events exchange), so governors that share a domain key share its
budget; the balance may go below zero, and then the next token is that much further off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class TokenBucket:
    rate: float
    burst: int = 1
    clock: Clock = time.monotonic
    tokens: float = 0.0
    updated: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be positive")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")
        if self.updated < 0:
            self.updated = self.clock()

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def wait_time(self) -> float:
        """Seconds until a token is available (0 when one is there now)."""
        self._refill(self.clock())
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def take(self) -> bool:
        """Take a token if one is available now."""
        self._refill(self.clock())
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def reserve(self) -> float:
        """Take the next token, due or not: the seconds until it is due (0 when it is there now).

        The balance may go below zero; each reservation is then `1 / rate` later than the one
        before, so permits issued ahead keep the bucket's spacing whenever they were issued.
        """
        wait = self.wait_time()
        self.tokens -= 1.0
        return wait

    def debit(self, tokens: float = 1.0) -> None:
        """Spend tokens someone else used (another governor's release); may go negative.

        The debt is bounded by one second's worth of tokens plus the burst, so a flood of
        stale events cannot stall the domain for long.
        """
        self._refill(self.clock())
        self.tokens = max(self.tokens - tokens, -(self.rate + self.burst))

    def empty(self) -> None:
        """Drop every token (a takeover, the end of a pause): the next one comes at the rate."""
        self._refill(self.clock())
        self.tokens = min(self.tokens, 0.0)

    def set_limits(self, rate: float, burst: int | None = None) -> None:
        """Change the rate (and burst) from now on; tokens earned so far are kept."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._refill(self.clock())
        self.rate = rate
        if burst is not None:
            if burst < 1:
                raise ValueError("burst must be at least 1")
            self.burst = burst
            self.tokens = min(self.tokens, float(burst))


class Buckets:
    """The bucket of every domain this governor has seen, all with the same limits."""

    def __init__(self, rate: float, burst: int, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def __getitem__(self, domain: str) -> TokenBucket:
        bucket = self._buckets.get(domain)
        if bucket is None:
            bucket = self._buckets[domain] = TokenBucket(self.rate, self.burst, self.clock)
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)
