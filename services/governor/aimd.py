"""A domain's adaptive rate: multiplicative decrease on 429/503 streaks, additive recovery.

The configured rate (or the lower one robots.txt asks for) is the ceiling. A streak of
`streak` throttled answers (429 or 503, from any fetcher: every governor hears every
outcome) multiplies the rate by `decrease`; one decrease per `cooldown` at most, because the
answers to permits released before the first 429 arrive together and say nothing new. Each
success adds `increase` requests per second, back up to the ceiling. The rate never drops
below `floor`, so a domain always makes some progress.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdaptiveRate:
    ceiling: float
    decrease: float = 0.5
    increase: float = 0.05
    streak_limit: int = 2
    floor: float = 0.05
    cooldown: float = 1.0
    rate: float = 0.0
    streak: int = 0
    last_decrease: float = float("-inf")

    def __post_init__(self) -> None:
        if self.ceiling <= 0:
            raise ValueError("ceiling must be positive")
        if not 0 < self.decrease < 1:
            raise ValueError("decrease must be between 0 and 1")
        self.floor = min(self.floor, self.ceiling)
        if self.rate <= 0:
            self.rate = self.ceiling

    def throttled(self, now: float) -> bool:
        """A 429/503 came back; True when it lowered the rate."""
        self.streak += 1
        if self.streak < self.streak_limit or now - self.last_decrease < self.cooldown:
            return False
        self.rate = max(self.floor, self.rate * self.decrease)
        self.streak = 0
        self.last_decrease = now
        return True

    def succeeded(self) -> None:
        self.streak = 0
        self.rate = min(self.ceiling, self.rate + self.increase)

    def set_ceiling(self, ceiling: float) -> None:
        """A new ceiling (configuration or robots.txt); the rate never stays above it."""
        if ceiling <= 0:
            raise ValueError("ceiling must be positive")
        self.ceiling = ceiling
        self.floor = min(self.floor, ceiling)
        self.rate = min(self.rate, ceiling)

    @property
    def lowered(self) -> bool:
        return self.rate < self.ceiling
