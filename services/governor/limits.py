"""Each domain key's configured limits: defaults from settings, overrides from a file and the CLI.

The limits file (`HUTCH_LIMITS_FILE`) is YAML::

    default: {rate: 2, burst: 1, concurrency: 8}   # optional; else HUTCH_RATE, HUTCH_BURST,
    domains:                                       #   HUTCH_CONCURRENCY_PER_DOMAIN
      example.com: {rate: 0.5}                     # also covers www.example.com, a.b.example.com
      "127.0.0.1:8001": {rate: 4, burst: 2, concurrency: 2}

`HUTCH_RATE_FOR` (what `--rate-for DOMAIN=R/s` sets) is a comma-separated list of
`domain=rate` entries and wins over the file. A key takes the entry of its own name, else
of its nearest parent domain; what an entry leaves out comes from the default. These are
ceilings: robots.txt and the adaptive rate only ever lower them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml


class LimitsError(ValueError):
    """A limits file or a rate-for entry that cannot be used."""


@dataclass(frozen=True)
class DomainLimit:
    rate: float
    burst: int
    concurrency: int

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise LimitsError(f"rate must be positive, got {self.rate}")
        if self.burst < 1:
            raise LimitsError(f"burst must be at least 1, got {self.burst}")
        if self.concurrency < 1:
            raise LimitsError(f"concurrency must be at least 1, got {self.concurrency}")


def parse_rate(text: str) -> float:
    """`2`, `2/s`, `0.5/s` or `30/m` as requests per second."""
    value = text.strip().lower()
    per = 1.0
    for suffix, seconds in (("/s", 1.0), ("/m", 60.0), ("/h", 3600.0)):
        if value.endswith(suffix):
            value, per = value[: -len(suffix)], seconds
            break
    try:
        rate = float(value) / per
    except ValueError:
        raise LimitsError(f"not a rate: {text!r} (like 2/s)") from None
    if not rate > 0:
        raise LimitsError(f"a rate must be positive: {text!r}")
    return rate


def parse_rate_for(text: str | None) -> dict[str, float]:
    """`a.example=2/s,b.example=0.5` as {domain: rate}."""
    rates: dict[str, float] = {}
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        domain, eq, rate = entry.partition("=")
        if not eq or not domain.strip():
            raise LimitsError(f"expected DOMAIN=RATE, got {entry.strip()!r}")
        rates[domain.strip().lower()] = parse_rate(rate)
    return rates


class Limits:
    def __init__(self, default: DomainLimit, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.default = default
        self.overrides = {k.lower(): v for k, v in (overrides or {}).items()}
        self._cache: dict[str, DomainLimit] = {}

    @classmethod
    def load(
        cls,
        *,
        rate: float,
        burst: int,
        concurrency: int,
        path: Path | None = None,
        rate_for: str | None = None,
    ) -> Limits:
        default = DomainLimit(rate, burst, concurrency)
        overrides: dict[str, dict[str, Any]] = {}
        if path is not None:
            try:
                data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
            except OSError as exc:
                raise LimitsError(f"cannot read limits file {path}: {exc.strerror}") from None
            except yaml.YAMLError as exc:
                raise LimitsError(f"{path}: not valid YAML: {exc}") from None
            if not isinstance(data, dict) or set(data) - {"default", "domains"}:
                raise LimitsError(f"{path}: expected a mapping with `default` and `domains`")
            default = _apply(default, data.get("default") or {}, f"{path}: default")
            domains = data.get("domains") or {}
            if not isinstance(domains, dict):
                raise LimitsError(f"{path}: `domains` must map domain names to limits")
            for name, entry in domains.items():
                _apply(default, entry or {}, f"{path}: {name}")  # refuse bad entries at load
                overrides[str(name).lower()] = dict(entry or {})
        for name, value in parse_rate_for(rate_for).items():
            overrides.setdefault(name, {})["rate"] = value
        return cls(default, overrides)

    def for_key(self, key: str) -> DomainLimit:
        found = self._cache.get(key)
        if found is None:
            entry = self._entry(key)
            found = _apply(self.default, entry, key) if entry else self.default
            self._cache[key] = found
        return found

    def _entry(self, key: str) -> dict[str, Any] | None:
        if key in self.overrides:
            return self.overrides[key]
        host, colon, port = key.rpartition(":")
        if not (colon and port.isdigit()) or host.endswith("]"):
            host, port = key, ""
        labels = host.split(".")
        for i in range(1, len(labels)):
            parent = ".".join(labels[i:])
            for name in ((parent + ":" + port) if port else parent, parent):
                if name in self.overrides:
                    return self.overrides[name]
        return None


def _apply(base: DomainLimit, entry: dict[str, Any], where: str) -> DomainLimit:
    if not isinstance(entry, dict) or set(entry) - {"rate", "burst", "concurrency"}:
        raise LimitsError(f"{where}: expected rate, burst and/or concurrency")
    try:
        changes: dict[str, Any] = {}
        if "rate" in entry:
            changes["rate"] = parse_rate(str(entry["rate"]))
        if "burst" in entry:
            changes["burst"] = int(entry["burst"])
        if "concurrency" in entry:
            changes["concurrency"] = int(entry["concurrency"])
        return replace(base, **changes)
    except (TypeError, ValueError) as exc:
        raise LimitsError(f"{where}: {exc}") from None
