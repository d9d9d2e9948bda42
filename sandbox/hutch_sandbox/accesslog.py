"""The record of every request the sandbox received, so tests can assert what really happened.

A scraper's own logs say what it meant to do; this log says what arrived where, from which
address, and what was done to it (including faults injected on purpose). Records stay in memory
and, if a path is given, are appended to a JSONL file flushed per line, so another process can
follow the run as it happens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

__all__ = ["AccessLog", "AccessRecord"]


@dataclass(frozen=True)
class AccessRecord:
    """One request, as received by a site or a proxy.

    ``status`` is the status code sent, or a word when no status line was: "reset", "hang"
    (site); "reset", "closed" (proxy, when the upstream gave no response). ``fault`` names the
    misbehaviour injected by configuration, or is None: for sites one of the fault kinds or
    "block"/"ban"; for proxies "fail"/"down".
    """

    ts: float  # time.time() at arrival
    kind: Literal["site", "proxy"]
    site: str | None  # the site; for a proxy record, the site its target is, if any
    proxy: str | None  # the proxy, on proxy records only
    port: int  # the listening port that received the request
    method: str
    path: str  # site: the request target; proxy: the absolute URL or CONNECT authority
    client: str  # the peer's IP address
    status: int | str
    fault: str | None = None
    upstream_source: str | None = None  # proxy records: the address it connects from
    host: str | None = None  # site records: the Host header (cut at 300 characters), None if absent
    # Site records: the request's headers, names lower-cased, repeats joined with ", " (the
    # first 64 headers, each value cut at 1,000 characters); None where no head was read.
    headers: dict[str, str] | None = None
    client_port: int | None = None  # site records: the peer's port, one per connection it opened

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


class AccessLog:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.records: list[AccessRecord] = []
        self._file: IO[str] | None = None

    def open(self) -> None:
        if self.path is not None and self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def add(self, record: AccessRecord) -> None:
        self.records.append(record)
        if self._file is not None:
            self._file.write(record.to_json() + "\n")
            self._file.flush()

    def for_site(self, name: str) -> list[AccessRecord]:
        """Requests the site ``name`` itself received (not the proxies' view of them)."""
        return [r for r in self.records if r.kind == "site" and r.site == name]

    def for_proxy(self, name: str) -> list[AccessRecord]:
        return [r for r in self.records if r.kind == "proxy" and r.proxy == name]
