"""The fetchers' capacity, from their heartbeats: how many permits may be out at once.

Each fetcher publishes its concurrency and how many tasks it is busy with every second. The
fleet's capacity is the sum of the concurrency of every fetcher heard from within
`stale_after` seconds. Until a first heartbeat arrives (fetchers older than the heartbeat,
or none started yet) the capacity is `fallback`, one fetcher's worth, and the governor also
keeps `fetch.ready` below `max_ready`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Beat:
    concurrency: int
    busy: int
    at: float


@dataclass
class FleetCapacity:
    stale_after: float = 3.0
    fallback: int = 16
    fetchers: dict[str, Beat] = field(default_factory=dict)

    def heartbeat(self, fetcher: str, concurrency: int, busy: int, now: float) -> None:
        self.fetchers[fetcher] = Beat(max(0, concurrency), max(0, busy), now)

    def _fresh(self, now: float) -> list[Beat]:
        for name in [n for n, b in self.fetchers.items() if now - b.at > 10 * self.stale_after]:
            del self.fetchers[name]
        return [b for b in self.fetchers.values() if now - b.at <= self.stale_after]

    def total(self, now: float) -> int:
        """Permits that may be outstanding at once, fleet-wide."""
        if not self.fetchers:
            return self.fallback
        return sum(b.concurrency for b in self._fresh(now))

    def busy(self, now: float) -> int:
        return sum(b.busy for b in self._fresh(now))

    def live(self, now: float) -> int:
        return len(self._fresh(now))

    @property
    def heard(self) -> bool:
        return bool(self.fetchers)
