"""Per-domain fetch timeouts that follow how fast each site answers, as TCP's retransmission timeout does.

A fixed read timeout has to be long enough for the slowest site a fleet will ever meet, so a
request that a fast site will never answer holds its task for the whole of it (10 s by default)
before the retry can start, and a job's tail is its hangs waiting. Here each domain keeps a
smoothed mean of how long its answers take and their mean deviation (RFC 6298: gains 1/8 and
1/4), and a fetch waits `srtt + K * rttvar`, no less than a floor and no more than the
configured timeout. Until a domain has answered a few times the configured timeouts hold.

A task whose earlier attempts timed out waits twice as long per such attempt (the exponential
backoff of RFC 6298, per task), so a page that is genuinely slower than its site's others still
gets through on a later attempt, up to the configured maximum. A timeout is no sample: it says
only that the answer took longer than the wait.

Memory is bounded: a domain idle for `IDLE_SECONDS` is forgotten, and past `MAX_DOMAINS`
the least recently answered is. Pure: the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

ALPHA = 1 / 8  # gain of the smoothed mean (RFC 6298)
BETA = 1 / 4  # gain of the mean deviation (RFC 6298)
MAX_DOMAINS = 10_000
IDLE_SECONDS = 600.0


@dataclass(frozen=True)
class Timeouts:
    """The read timeout and the total deadline for one fetch, in seconds."""

    read: float
    total: float


@dataclass
class _Estimate:
    srtt: float
    rttvar: float
    samples: int
    seen: float


class TimeoutEstimator:
    def __init__(
        self,
        *,
        floor: float,
        k: float,
        min_samples: int,
        clock: Callable[[], float] = time.monotonic,
        max_domains: int = MAX_DOMAINS,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.floor = floor
        self.k = k
        self.min_samples = min_samples
        self.clock = clock
        self.max_domains = max_domains
        self.idle_seconds = idle_seconds
        self._domains: OrderedDict[str, _Estimate] = OrderedDict()

    def __len__(self) -> int:
        return len(self._domains)

    def observe(self, domain: str, seconds: float) -> None:
        """Record how long one complete answer from `domain` took."""
        now = self.clock()
        self._forget_idle(now)
        seconds = max(0.0, seconds)
        found = self._domains.pop(domain, None)
        if found is None:
            found = _Estimate(srtt=seconds, rttvar=seconds / 2, samples=1, seen=now)
        else:
            found.rttvar += BETA * (abs(found.srtt - seconds) - found.rttvar)
            found.srtt += ALPHA * (seconds - found.srtt)
            found.samples += 1
            found.seen = now
        self._domains[domain] = found  # to the end: the most recently answered
        while len(self._domains) > self.max_domains:
            self._domains.popitem(last=False)

    def timeouts(self, domain: str, earlier_timeouts: int, read_max: float, total_max: float) -> Timeouts:
        """The timeouts for a fetch from `domain` by a task that timed out `earlier_timeouts` times."""
        self._forget_idle(self.clock())
        found = self._domains.get(domain)
        if found is None or found.samples < self.min_samples:
            return Timeouts(read_max, total_max)
        wait = max(found.srtt + self.k * found.rttvar, self.floor) * 2 ** min(earlier_timeouts, 32)
        return Timeouts(min(wait, read_max), min(wait, total_max))

    def _forget_idle(self, now: float) -> None:
        while self._domains:
            oldest = next(iter(self._domains.values()))
            if now - oldest.seen < self.idle_seconds:
                return
            self._domains.popitem(last=False)
