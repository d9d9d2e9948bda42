"""The proxy pool: read from a file, in one of two formats, and re-read when the file changes.

Text format: one proxy a line, `URL [tier [cost]]`; the tier is `datacenter`, `residential`
or `mobile` (`datacenter` when omitted), the cost is the estimated price of one request
through it (the tier's default when omitted); blank lines and `#` comments are skipped.

YAML format (a file ending in `.yaml` or `.yml`):

    proxies:
      - {url: "http://user:pass@dc1.example:8080", tier: datacenter, cost: 0.0001}
      - {url: "http://res1.example:3128", tier: residential}
    domains:                       # optional: the cheapest tier a domain may use
      shop.example: {tier_floor: residential}

Each proxy gets a stable id derived from its scheme, user, host and port, never from its
password: the id is what travels in messages, the store, the state file and logs, while the
URL (which may carry credentials) only ever goes to the fetcher that uses it, in a lease.
Error messages name the file and the line, never the line's text.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

TIERS = ("datacenter", "residential", "mobile")
# Estimated price of one request, by tier, when the file gives none: datacenter IPs are
# rented flat, residential and mobile traffic is sold by the gigabyte (about 100-200 kB a page).
DEFAULT_COST = {"datacenter": 0.0001, "residential": 0.001, "mobile": 0.003}


class PoolError(ValueError):
    """A proxy file that cannot be used; the message names the line, never its content."""


@dataclass(frozen=True)
class Proxy:
    id: str
    url: str = field(repr=False)
    tier: str = "datacenter"
    cost: float = DEFAULT_COST["datacenter"]

    def __repr__(self) -> str:  # never show the URL: it may hold credentials
        return f"Proxy({self.id}, {self.tier})"

    __str__ = __repr__

    @property
    def level(self) -> int:
        return TIERS.index(self.tier)


@dataclass(frozen=True)
class PoolConfig:
    """What a proxy file says: the proxies, and tier floors per domain (YAML only)."""

    proxies: tuple[Proxy, ...] = ()
    tier_floors: dict[str, str] = field(default_factory=dict)

    @property
    def tiers(self) -> list[str]:
        present = {p.tier for p in self.proxies}
        return [t for t in TIERS if t in present]


def proxy_id(url: str) -> str:
    parts = urlsplit(url)
    identity = f"{parts.scheme}://{parts.username or ''}@{parts.hostname}:{parts.port}"
    return "px-" + hashlib.sha256(identity.encode()).hexdigest()[:10]


def make_proxy(url: object, tier: object, cost: object, where: str) -> Proxy:
    """One validated proxy; `where` ("pool line 3") is all an error message says about it."""
    if not isinstance(url, str):
        raise PoolError(f"{where}: the proxy URL must be text")
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        raise PoolError(f"{where}: bad port in proxy URL") from None
    if parts.scheme not in ("http", "https", "socks5") or not parts.hostname:
        raise PoolError(f"{where}: not a proxy URL (http://host:port)")
    if tier not in TIERS:
        shown = tier if isinstance(tier, str) and len(tier) < 40 else "?"
        raise PoolError(f"{where}: unknown tier {shown!r}; use one of {', '.join(TIERS)}")
    assert isinstance(tier, str)
    if cost is None:
        price = DEFAULT_COST[tier]
    else:
        try:
            if not isinstance(cost, (int, float, str)):
                raise TypeError(type(cost).__name__)
            price = float(cost)
        except (TypeError, ValueError):
            raise PoolError(f"{where}: the cost must be a number") from None
        if not math.isfinite(price) or price < 0:
            raise PoolError(f"{where}: the cost must be a number >= 0")
    return Proxy(proxy_id(url), url, tier, price)


def _dedupe(proxies: list[Proxy]) -> tuple[Proxy, ...]:
    seen: set[str] = set()
    kept = []
    for proxy in proxies:
        if proxy.id not in seen:
            seen.add(proxy.id)
            kept.append(proxy)
    return tuple(kept)


def parse_pool(text: str, source: str = "proxy file") -> list[Proxy]:
    """The text format: `URL [tier [cost]]` a line."""
    proxies: list[Proxy] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"{source} line {number}"
        if len(words) > 3:
            raise PoolError(f"{where}: expected 'URL [tier [cost]]'")
        url = words[0]
        tier = words[1] if len(words) > 1 else "datacenter"
        cost = words[2] if len(words) > 2 else None
        proxies.append(make_proxy(url, tier, cost, where))
    return list(_dedupe(proxies))


def parse_tier_floors(entries: object, source: str) -> dict[str, str]:
    """`domain=tier` entries (the setting) or a YAML `domains:` mapping."""
    floors: dict[str, str] = {}
    if isinstance(entries, dict):
        for domain, spec in entries.items():
            tier = spec.get("tier_floor") if isinstance(spec, dict) else None
            if tier not in TIERS:
                raise PoolError(f"{source}: domain {str(domain)[:80]!r} needs tier_floor: one of {', '.join(TIERS)}")
            floors[str(domain).lower()] = str(tier)
        return floors
    if entries is not None and not isinstance(entries, (list, tuple)):
        raise PoolError(f"{source}: expected domain=tier entries or a mapping of domains")
    for entry in entries or ():
        domain, _, tier = str(entry).partition("=")
        if not domain.strip() or tier.strip() not in TIERS:
            raise PoolError(f"{source}: expected domain=tier with tier one of {', '.join(TIERS)}")
        floors[domain.strip().lower()] = tier.strip()
    return floors


def parse_yaml_pool(text: str, source: str = "proxy file") -> PoolConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The YAML error quotes the offending line, which may hold a password: give its number only.
        mark = getattr(exc, "problem_mark", None)
        where = f" near line {mark.line + 1}" if mark is not None else ""
        raise PoolError(f"{source}: not valid YAML{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not set(data) <= {"proxies", "domains"}:
        raise PoolError(f"{source}: expected a mapping with 'proxies' and optionally 'domains'")
    entries = data.get("proxies") or []
    if not isinstance(entries, list):
        raise PoolError(f"{source}: 'proxies' must be a list")
    proxies = []
    for index, entry in enumerate(entries, 1):
        where = f"{source} proxy {index}"
        if not isinstance(entry, dict) or not set(entry) <= {"url", "tier", "cost"}:
            raise PoolError(f"{where}: expected a mapping with url, tier and cost")
        proxies.append(make_proxy(entry.get("url"), entry.get("tier", "datacenter"), entry.get("cost"), where))
    floors = parse_tier_floors(data.get("domains") or {}, source)
    return PoolConfig(_dedupe(proxies), floors)


def is_yaml(path: str | Path) -> bool:
    return Path(path).suffix.lower() in (".yaml", ".yml")


def load_pool_config(path: str | Path) -> PoolConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PoolError(f"cannot read proxy file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PoolError(f"proxy file {path} is not UTF-8 text") from None
    if is_yaml(path):
        return parse_yaml_pool(text, str(path))
    return PoolConfig(tuple(parse_pool(text, str(path))))


def load_pool(path: str | Path) -> list[Proxy]:
    """The proxies of a pool file, either format (what `hutch run --proxies` checks)."""
    return list(load_pool_config(path).proxies)


class PoolFile:
    """A pool file watched for changes: `changed()` says when to reload it.

    A change is a new (mtime, size, inode), so an editor's atomic rename counts as much as
    an in-place write.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> PoolConfig:
        signature = self._signature()
        config = load_pool_config(self.path)
        self._seen = signature
        return config

    def changed(self) -> bool:
        signature = self._signature()
        return signature is not None and signature != self._seen
