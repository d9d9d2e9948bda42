"""robots.txt: parsing and matching on Hutch's User-Agent, and the per-origin cache.

Matching is RFC 9309's, through Protego (Scrapy's parser): the group is picked by the
product token of the User-Agent (`hutch` for `Hutch/0.1 (...)`, else `*`), paths match with
`*` and `$` wildcards, and the longest matching rule wins, `Allow` on a tie. The stdlib's
`urllib.robotparser` took the first matching rule and no wildcards, so `Disallow: /*.pdf$`
let every PDF through and an early `Allow: /` undid a later `Disallow: /private`.
`Crawl-delay` and `Request-rate` of the same group, as Protego reads them, become a rate
ceiling for the domain. Only the first `MAX_ROBOTS_BYTES` of a file are parsed (RFC 9309
asks parsers to read at least 500 KiB), so a huge robots.txt costs bounded time.

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

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from protego import Protego

MAX_ROBOTS_BYTES = 512 * 1024


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of a URL, lower-cased: the unit robots.txt applies to."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower().rpartition('@')[2]}"


def robots_url(origin: str) -> str:
    return f"{origin}/robots.txt"


def product_token(user_agent: str) -> str:
    """The product token robots.txt groups are matched on: `hutch` for `Hutch/0.1 (...)`.

    Matching the whole header instead would let a group named after any word in the
    comment (`User-agent: scraping`) apply to Hutch.
    """
    return user_agent.split("/")[0].strip().lower()


@dataclass
class RobotsRules:
    """The rules of one robots.txt for one User-Agent.

    `parser` None means no file to match: `default` (allow all, or disallow all) decides.
    """

    user_agent: str
    parser: Protego | None = None
    default: bool = True
    crawl_delay: float | None = None
    request_rate: float | None = None
    why: str = "robots.txt"

    @classmethod
    def parse(cls, text: str, user_agent: str) -> RobotsRules:
        parser = Protego.parse(text[:MAX_ROBOTS_BYTES])
        token = product_token(user_agent)
        delay = parser.crawl_delay(token)
        rate = parser.request_rate(token)
        return cls(
            user_agent,
            parser,
            crawl_delay=delay if delay else None,
            request_rate=rate.requests / rate.seconds if rate is not None else None,
        )

    @classmethod
    def allow_all(cls, user_agent: str, why: str = "no robots.txt") -> RobotsRules:
        return cls(user_agent, None, default=True, why=why)

    @classmethod
    def disallow_all(cls, user_agent: str, why: str) -> RobotsRules:
        return cls(user_agent, None, default=False, why=why)

    def allowed(self, url: str) -> bool:
        if self.parser is None:
            return self.default
        return self.parser.can_fetch(url, product_token(self.user_agent))

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
    returns: int = 0  # robots tasks given back unsent since the last failure or answer


Verdict = Literal["allow", "deny", "fetch", "wait"]


@dataclass
class RobotsCache:
    user_agent: str
    ttl: float = 3600.0
    retry: float = 10.0
    attempts: int = 3
    fetch_deadline: float = 60.0
    max_returns: int = 100
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

    def in_flight(self, url: str) -> bool:
        """Whether the robots.txt of `url`'s origin is being fetched: a wait for it ends with
        the fetch's answer, usually long before its deadline."""
        state = self.origins.get(origin_of(url))
        return state is not None and state.phase == "fetching"

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
        state.returns = 0
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

    def returned(self, task_id: str, now: float) -> None:
        """A robots task came back unsent (its permit expired or came late): fetch that
        origin again. `max_returns` of those in a row count as one failed fetch, so an
        origin whose robots.txt is never sent ends disallowed like one that never answers."""
        for state in self.origins.values():
            if state.phase == "fetching" and state.task_id == task_id:
                state.task_id = None
                state.returns += 1
                if state.returns >= self.max_returns:
                    state.returns = 0
                    state.last_status = None
                    self._failed(state, None, now)
                else:
                    state.phase = "unknown"

    def rules(self, origin: str) -> RobotsRules | None:
        state = self.origins.get(origin)
        return state.rules if state is not None and state.phase == "known" else None


NOT_FETCHABLE = ("forbidden_target", "invalid_url")


def _status(status: int | None) -> str:
    return "no answer" if status is None else f"HTTP {status}"
