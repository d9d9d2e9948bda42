"""How late a permit reaches the fetcher, measured against the quickest one of its governor.

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

    def of(self, permit_id: str, issued: float) -> float:
        """Seconds this permit is late (0 for the quickest seen lately); records it."""
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
        return transit - seen[0][1]
