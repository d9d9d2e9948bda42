"""In-flight fetches, counted per domain key from permits and outcome events, with expiry.

Every permit released (by this governor or, seen on the events exchange, by another) is a
lease: the fetch it allows is in flight until an outcome event names its permit (or, from a
fetcher that sends no permit id, its task). A fetcher that dies never sends that event, so a
lease also ends at its deadline: the permit's expiry plus the longest a fetch may take. The
per-key counts cap concurrent fetches on a domain; the total, held against the fetchers'
capacity, keeps the permits outstanding few enough that they are fresh when used.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Lease:
    permit_id: str
    task_id: str
    key: str
    until: float
    own: bool


class Leases:
    def __init__(self) -> None:
        self._by_permit: dict[str, Lease] = {}
        self._by_task: dict[str, str] = {}
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._expiry: list[tuple[float, str]] = []

    def add(self, permit_id: str, task_id: str, key: str, until: float, own: bool = True) -> bool:
        """Record a lease; False if that permit is already known (an echo of our own release)."""
        if permit_id in self._by_permit:
            return False
        previous = self._by_task.get(task_id)
        if previous is not None:
            # The same task holds a newer permit: the old one was returned or expired.
            self._drop(previous)
        lease = Lease(permit_id, task_id, key, until, own)
        self._by_permit[permit_id] = lease
        self._by_task[task_id] = permit_id
        self._counts[key] += 1
        heapq.heappush(self._expiry, (until, permit_id))
        return True

    def end(self, permit_id: str | None = None, task_id: str | None = None) -> Lease | None:
        """The fetch of this permit (or, without one, of this task) is over."""
        if permit_id is None and task_id is not None:
            permit_id = self._by_task.get(task_id)
        if permit_id is None:
            return None
        return self._drop(permit_id)

    def _drop(self, permit_id: str) -> Lease | None:
        lease = self._by_permit.pop(permit_id, None)
        if lease is None:
            return None
        if self._by_task.get(lease.task_id) == permit_id:
            del self._by_task[lease.task_id]
        self._counts[lease.key] -= 1
        if self._counts[lease.key] <= 0:
            del self._counts[lease.key]
        return lease

    def expire(self, now: float) -> list[Lease]:
        """End every lease past its deadline; the ones that ended."""
        ended = []
        while self._expiry and self._expiry[0][0] <= now:
            _, permit_id = heapq.heappop(self._expiry)
            lease = self._by_permit.get(permit_id)
            if lease is not None and lease.until <= now:
                dropped = self._drop(permit_id)
                if dropped is not None:
                    ended.append(dropped)
        if len(self._expiry) > 4 * len(self._by_permit) + 64:  # ended leases leave stale entries
            self._expiry = [(until, p) for until, p in self._expiry if p in self._by_permit]
            heapq.heapify(self._expiry)
        return ended

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    @property
    def total(self) -> int:
        return len(self._by_permit)

    def next_expiry(self, key: str | None = None) -> float | None:
        """When the earliest lease (of `key`, or of any) runs out."""
        leases = self._by_permit.values()
        deadlines = [lease.until for lease in leases if key is None or lease.key == key]
        return min(deadlines) if deadlines else None

    def __contains__(self, permit_id: str) -> bool:
        return permit_id in self._by_permit
