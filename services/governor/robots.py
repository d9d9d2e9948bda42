"""robots.txt: parsing and matching on Hutch's User-Agent, and the per-origin cache.

Matching is `urllib.robotparser`'s (groups picked by the product token of the User-Agent,
`Hutch` for `Hutch/0.1 (...)`, else `*`; first matching rule wins). `Crawl-delay` (which
robotparser reads only as a whole number) and `Request-rate` are read here for the same
group and become a rate ceiling for the domain.

The cache is the fleet's: every governor hears every `robots.<domain>` result. An origin is

- unknown: its robots.txt must be fetched first (the fetch takes a permit like any request);
- fetching: a robots task is out; its pages wait;
- known: rules cached until `ttl` runs out; a 2xx is parsed, any 4xx but 429 means allow
  all (as crawlers have always read a missing file);
- failing: a 5xx, a 429 or no answer at all; pages wait and robots.txt is tried again after
  `retry`, doubling, and after `attempts` failures the origin is disallowed whole until
  `ttl` runs out (its pages go dead with reason `robots`).
"""

from __future__ import annotations

import urllib.robotparser
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of a URL, lower-cased: the unit robots.txt applies to."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower().rpartition('@')[2]}"


def robots_url(origin: str) -> str:
    return f"{origin}/robots.txt"


def _product(user_agent: str) -> str:
    return user_agent.split("/")[0].strip().lower()


def _delays(text: str, product: str) -> tuple[float | None, float | None]:
    """(Crawl-delay seconds, Request-rate per second) of the group that applies to `product`."""
    groups: list[tuple[list[str], dict[str, str]]] = []
    agents: list[str] = []
    values: dict[str, str] = {}
    in_rules = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" not in line:
            continue
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "user-agent":
            if in_rules:
                groups.append((agents, values))
                agents, values, in_rules = [], {}, False
            agents.append(value.lower())
        elif agents:
            in_rules = True
            if name in ("crawl-delay", "request-rate"):
                values.setdefault(name, value)
    if agents:
        groups.append((agents, values))
    chosen = next((v for a, v in groups if any(x != "*" and x in product for x in a)), None)
    if chosen is None:
        chosen = next((v for a, v in groups if "*" in a), {})
    delay = rate = None
    try:
        if "crawl-delay" in chosen:
            delay = float(chosen["crawl-delay"])
            if delay < 0 or delay != delay:
                delay = None
    except ValueError:
        delay = None
    try:
        if "request-rate" in chosen:
            requests, _, seconds = chosen["request-rate"].partition("/")
            per = float(seconds.strip().rstrip("smhSMH") or 1)
            unit = seconds.strip()[-1:].lower()
            per *= {"m": 60, "h": 3600}.get(unit, 1)
            if float(requests) > 0 and per > 0:
                rate = float(requests) / per
    except ValueError:
        rate = None
    return delay, rate


@dataclass
class RobotsRules:
    """The rules of one robots.txt for one User-Agent."""

    user_agent: str
    parser: urllib.robotparser.RobotFileParser
    crawl_delay: float | None = None
    request_rate: float | None = None
    why: str = "robots.txt"

    @classmethod
    def parse(cls, text: str, user_agent: str) -> RobotsRules:
        parser = urllib.robotparser.RobotFileParser()
        parser.parse(text.splitlines())
        delay, rate = _delays(text, _product(user_agent))
        return cls(user_agent, parser, delay, rate)

    @classmethod
    def allow_all(cls, user_agent: str, why: str = "no robots.txt") -> RobotsRules:
        parser = urllib.robotparser.RobotFileParser()
        parser.allow_all = True
        return cls(user_agent, parser, why=why)

    @classmethod
    def disallow_all(cls, user_agent: str, why: str) -> RobotsRules:
        parser = urllib.robotparser.RobotFileParser()
        parser.disallow_all = True
        return cls(user_agent, parser, why=why)

    def allowed(self, url: str) -> bool:
        return self.parser.can_fetch(self.user_agent, url)

    @property
    def rate_cap(self) -> float | None:
        """The highest rate these rules allow, or None when they set none."""
        caps = [self.request_rate] if self.request_rate else []
        if self.crawl_delay:
            caps.append(1.0 / self.crawl_delay)
        return min(caps) if caps else None


@dataclass
class OriginState:
    phase: Literal["unknown", "fetching", "known", "failing"] = "unknown"
    rules: RobotsRules | None = None
    until: float = 0.0  # known: cache expiry; fetching: give up waiting; failing: next try
    failures: int = 0
    task_id: str | None = None
    last_status: int | None = None


Verdict = Literal["allow", "deny", "fetch", "wait"]


@dataclass
class RobotsCache:
    user_agent: str
    ttl: float = 3600.0
    retry: float = 10.0
    attempts: int = 3
    fetch_deadline: float = 60.0
    origins: dict[str, OriginState] = field(default_factory=dict)

    def check(self, url: str, now: float) -> tuple[Verdict, float, str]:
        """What to do with a page of `url` now: (verdict, until when to wait, why)."""
        state = self.origins.get(origin_of(url))
        if state is None:
            return "fetch", now, "robots.txt not fetched yet"
        if state.phase == "known" and now >= state.until:
            state.phase = "unknown"
        if state.phase == "fetching" and now >= state.until:
            self._failed(state, None, now)  # the robots task's result never came
        if state.phase == "unknown":
            return "fetch", now, "robots.txt not fetched yet"
        if state.phase == "fetching":
            return "wait", state.until, "fetching robots.txt"
        if state.phase == "failing":
            if now >= state.until:
                return "fetch", now, "retrying robots.txt"
            return "wait", state.until, f"robots.txt failed ({_status(state.last_status)}), retrying"
        assert state.rules is not None
        if state.rules.allowed(url):
            return "allow", now, ""
        return "deny", now, f"disallowed by {state.rules.why}"

    def fetching(self, origin: str, task_id: str, now: float) -> None:
        state = self.origins.setdefault(origin, OriginState())
        state.phase = "fetching"
        state.task_id = task_id
        state.until = now + self.fetch_deadline

    def result(
        self, origin: str, status: int | None, text: str, now: float, outcome: str | None = None
    ) -> RobotsRules | None:
        """A robots.txt fetch finished (`status` None: unreachable); the rules now in force.

        An origin Hutch may not fetch at all (`forbidden_target`, `invalid_url`) gets no
        robots verdict of its own: its pages meet the same refusal on their own fetch, and
        that refusal, not `robots`, is what their dead letters should say.
        """
        state = self.origins.setdefault(origin, OriginState())
        state.last_status = status
        state.task_id = None
        if outcome in NOT_FETCHABLE:
            self._known(state, RobotsRules.allow_all(self.user_agent, f"robots.txt {outcome}"), now)
        elif status is not None and 200 <= status < 300:
            self._known(state, RobotsRules.parse(text, self.user_agent), now)
        elif status is not None and 300 <= status < 500 and status != 429:
            self._known(state, RobotsRules.allow_all(self.user_agent, f"robots.txt HTTP {status}"), now)
        else:
            self._failed(state, status, now)
        return state.rules if state.phase == "known" else None

    def _known(self, state: OriginState, rules: RobotsRules, now: float) -> None:
        state.phase = "known"
        state.rules = rules
        state.failures = 0
        state.until = now + self.ttl

    def _failed(self, state: OriginState, status: int | None, now: float) -> None:
        state.failures += 1
        state.task_id = None
        if state.failures >= self.attempts:
            why = f"robots.txt unreachable ({_status(status)}) after {state.failures} tries"
            self._known(state, RobotsRules.disallow_all(self.user_agent, why), now)
            return
        state.phase = "failing"
        state.until = now + self.retry * 2 ** (state.failures - 1)

    def returned(self, task_id: str) -> None:
        """A robots task came back unfetched (its permit expired): fetch that origin again."""
        for state in self.origins.values():
            if state.phase == "fetching" and state.task_id == task_id:
                state.phase = "unknown"
                state.task_id = None

    def rules(self, origin: str) -> RobotsRules | None:
        state = self.origins.get(origin)
        return state.rules if state is not None and state.phase == "known" else None


NOT_FETCHABLE = ("forbidden_target", "invalid_url")


def _status(status: int | None) -> str:
    return "no answer" if status is None else f"HTTP {status}"
