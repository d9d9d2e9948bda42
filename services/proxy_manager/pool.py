"""The proxy pool: read from a file, and chosen in turn for each attempt.

The file holds one proxy URL a line, optionally followed by its tier (`datacenter`,
`residential` or `mobile`; `datacenter` when omitted); blank lines and `#` comments are
skipped. Each proxy gets a stable id derived from its address and user name, never from
its password: the id is what travels in messages, the store and logs, while the URL (which
may carry credentials) only ever goes to the fetcher that uses it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

TIERS = ("datacenter", "residential", "mobile")


class PoolError(ValueError):
    """A proxy file that cannot be used; the message names the line."""


@dataclass(frozen=True)
class Proxy:
    id: str
    url: str
    tier: str

    def __repr__(self) -> str:  # never show the URL: it may hold credentials
        return f"Proxy({self.id}, {self.tier})"


def proxy_id(url: str) -> str:
    parts = urlsplit(url)
    identity = f"{parts.scheme}://{parts.username or ''}@{parts.hostname}:{parts.port}"
    return "px-" + hashlib.sha256(identity.encode()).hexdigest()[:10]


def parse_pool(text: str, source: str = "proxy file") -> list[Proxy]:
    proxies: list[Proxy] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        url, tier = words[0], (words[1] if len(words) > 1 else "datacenter")
        if len(words) > 2:
            raise PoolError(f"{source} line {number}: expected 'URL [tier]'")
        parts = urlsplit(url)
        try:
            _ = parts.port
        except ValueError:
            raise PoolError(f"{source} line {number}: bad port in proxy URL") from None
        if parts.scheme not in ("http", "https", "socks5") or not parts.hostname:
            raise PoolError(f"{source} line {number}: not a proxy URL (http://host:port)")
        if tier not in TIERS:
            raise PoolError(f"{source} line {number}: unknown tier {tier!r}; use one of {', '.join(TIERS)}")
        proxy = Proxy(proxy_id(url), url, tier)
        if proxy.id not in seen:
            seen.add(proxy.id)
            proxies.append(proxy)
    return proxies


def load_pool(path: str | Path) -> list[Proxy]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PoolError(f"cannot read proxy file {path}: {exc.strerror}") from None
    return parse_pool(text, str(path))


class RoundRobin:
    """Each lease takes the next proxy in turn, skipping those that failed this task."""

    def __init__(self, proxies: list[Proxy]) -> None:
        self.proxies = proxies
        self._next = 0

    def choose(self, exclude: set[str]) -> Proxy | None:
        candidates = len(self.proxies)
        for _ in range(candidates):
            proxy = self.proxies[self._next % candidates]
            self._next += 1
            if proxy.id not in exclude:
                return proxy
        # Every proxy failed this task once: start over rather than stall the task.
        if candidates:
            proxy = self.proxies[self._next % candidates]
            self._next += 1
            return proxy
        return None
