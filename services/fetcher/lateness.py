"""When to fetch a permit: at its moment at the site, read against the quickest permit of its governor.

The governor paces releases; the site sees fetches. Between the two lies the pipeline: a
publish, the broker, a delivery, and whatever kept the fetcher busy. When those delays
vary (a loaded machine, a fetcher that stalled for a moment), two permits released 125 ms
apart can be fetched 10 ms apart, and a domain gets more than its `rate + burst` in one
second at the site. So each permit carries `late_after`, the lateness its rate can absorb
(`hutch.services.governor.core.late_after`), and a fetcher that gets to a permit later
than that gives it back unspent.

Late against what: the governor's `issued` is its own clock's time, and the two hosts'
clocks may differ by tens of milliseconds. So lateness is measured against the quickest
transit seen lately from the same governor: `(now - issued) - min(now_i - issued_i)`. A
constant offset between the clocks cancels out; what remains is the delay beyond the best
the pipeline has done, which is what compresses fetches.

A permit issued ahead (`not_before`, see `hutch.services.governor.core`) is due that much
after its issue: the fetcher holds it until `not_before + min(now_i - issued_i)` on its own
clock, which is `not_before` plus the quickest transit on the governor's. So fetches follow
the bucket's spacing however late each permit was released or delivered, and a clock offset
between the hosts cancels out here too.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

WINDOW = 30.0  # seconds over which the quickest transit is taken
MAX_GOVERNORS = 64  # governors remembered; the oldest heard of is forgotten beyond that


class Lateness:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        # governor id -> (time seen, transit) with increasing transits: a monotonic deque
        # whose head is the quickest transit of the window.
        self._seen: dict[str, collections.deque[tuple[float, float]]] = {}

    def of(self, permit_id: str, issued: float, not_before: float | None = None) -> float:
        """Seconds this permit is late for its moment (0 for the quickest seen lately; below 0
        when it came early and is to be held that long); records it."""
        now = self.clock()
        governor = permit_id.rpartition(".")[0]
        seen = self._seen.pop(governor, None)
        if seen is None:
            seen = collections.deque()
            if len(self._seen) >= MAX_GOVERNORS:
                del self._seen[next(iter(self._seen))]
        self._seen[governor] = seen  # the newest heard of last
        transit = now - issued
        while seen and seen[-1][1] >= transit:
            seen.pop()
        seen.append((now, transit))
        while seen[0][0] < now - WINDOW:
            seen.popleft()
        ahead = not_before - issued if not_before is not None else 0.0
        return transit - seen[0][1] - ahead
