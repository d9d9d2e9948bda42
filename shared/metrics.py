"""Prometheus metrics: the series dashboards, alerts and autoscalers read, and the port that serves them.

The article's four signals of a queue system are queue depth, task age, retries per target
and dead-letter volume; every series below serves one of them, or the proxies and permits
that explain them. Their names are a contract (the dashboard, the alert rules and KEDA's
triggers in `deploy/` name them), so they are all declared here, in one place, with the
labels they carry; `docs/metrics.md` lists them.

Each service process has a `Metrics` of its own (its own registry: a test may run several
services in one process) and serves it on its own port (`HUTCH_<SERVICE>_METRICS_PORT`),
with `/healthz` (the process answers) and `/readyz` (connected to the broker and consuming)
on the same port, so a probe and a scrape need one port per pod.

Label values stay bounded: a domain is a label only while it is among the `HUTCH_METRICS_DOMAINS`
busiest this process has seen, and `other` otherwise (`DomainLabels`); outcomes, reasons,
stages and tiers come from fixed vocabularies; no URL, proxy URL or credential is ever a label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

__all__ = ["OTHER", "SERIES", "DomainLabels", "Endpoint", "Metric", "Metrics", "by_label", "gauge"]
log = logging.getLogger(__name__)

OTHER = "other"
# Every series name a Hutch service exports, as PromQL names it (a histogram by its base
# name: `_bucket`, `_sum` and `_count` follow). Dashboards, alert rules and KEDA triggers in
# deploy/ may name only these (tests/unit/test_deploy_manifests.py); docs/metrics.md lists them.
SERIES = (
    "hutch_queue_depth",
    "hutch_task_age_seconds",
    "hutch_oldest_task_age_seconds",
    "hutch_domain_backlog",
    "hutch_fetches_total",
    "hutch_retries_total",
    "hutch_dead_letters_total",
    "hutch_permits_total",
    "hutch_permit_wait_seconds",
    "hutch_domain_rate",
    "hutch_fetch_duration_seconds",
    "hutch_proxy_requests_total",
    "hutch_proxy_leases_total",
    "hutch_proxies",
    "hutch_proxy_bans",
    "hutch_items_stored_total",
    "hutch_api_requests_total",
    "hutch_pages_parsed_total",
    "hutch_parse_duration_seconds",
    "hutch_fetch_slots_wanted",
    "hutch_fetches_in_flight",
    "hutch_fetch_demand",
)
# Task age at fetch and the wait for a permit: from a second to a day (a rate-limited
# backlog's tasks wait hours by design).
AGE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
FETCH_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


@dataclass
class DomainLabels:
    """Which domains get a label of their own: the `top` busiest seen, the rest `other`.

    Counts are kept for at most `4 x top` domains (the quietest forgotten first), so memory is
    bounded on a crawl of millions of hosts. A domain outside the labelled set takes the place
    of the quietest labelled one once it has twice that one's count (the margin keeps two
    domains of equal traffic from trading places at every event); the one it replaces loses
    its series (`forget`), so the number of series stays bounded too.
    """

    top: int
    forget: Callable[[str], None] = lambda domain: None
    counts: dict[str, int] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)

    def __call__(self, domain: str) -> str:
        if self.top <= 0:
            return OTHER
        count = self.counts.get(domain, 0) + 1
        self.counts[domain] = count
        if domain in self.named:
            return domain
        if len(self.named) < self.top:
            self.named.add(domain)
            return domain
        if len(self.counts) > 4 * self.top:
            self._trim()
        quietest = min(self.named, key=lambda d: self.counts.get(d, 0))
        if count >= 2 * max(self.counts.get(quietest, 0), 1):
            self.named.discard(quietest)
            self.named.add(domain)
            self.forget(quietest)
            return domain
        return OTHER

    def peek(self, domain: str) -> str:
        """The label `domain` has now, without counting it as traffic (for gauges read at a scrape)."""
        return domain if domain in self.named else OTHER

    def _trim(self) -> None:
        unnamed = sorted((c, d) for d, c in self.counts.items() if d not in self.named)
        for _, domain in unnamed[: len(self.counts) - 2 * self.top]:
            del self.counts[domain]


F = TypeVar("F", Counter, Histogram)


class _Family(Generic[F]):
    """A family of series made and registered on its first use, so that a service exports
    only what it updates (an unlabelled counter would otherwise show 0 on every service)."""

    def __init__(self, make: Callable[[], F]) -> None:
        self.make: Callable[[], F] = make
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, metrics: Metrics, owner: type | None = None) -> F:
        family: F | None = metrics.__dict__.get(self.name)
        if family is None:
            family = metrics.__dict__[self.name] = self.make()
            metrics.registry.register(family)
        return family


class Metrics:
    """Every series a Hutch service can export, in a registry of this process's own.

    A service updates what is its own (the fetcher its fetches, the storer the dead letters...),
    and exports only that: a family is registered at its first use. Services with
    state that is cheaper to read when scraped than to mirror (the governor's domains, the
    proxy-manager's pool) add a collector (`collect`).
    """

    fetches = _Family(lambda: Counter(
        "hutch_fetches", "Attempts that reached a fetch, by domain and outcome", ["domain", "outcome"], registry=None
    ))
    retries = _Family(lambda: Counter(
        "hutch_retries", "Tasks sent to a delay tier to be tried again, by domain and reason", ["domain", "reason"],
        registry=None,
    ))
    dead_letters = _Family(lambda: Counter(
        "hutch_dead_letters", "Tasks and messages that went dead, by domain, stage and reason",
        ["domain", "stage", "reason"], registry=None,
    ))
    permits = _Family(lambda: Counter("hutch_permits", "Fetch permits issued, by domain", ["domain"], registry=None))
    permit_wait = _Family(lambda: Histogram(
        "hutch_permit_wait_seconds", "Time a task waited in the governor for its permit", buckets=AGE_BUCKETS,
        registry=None,
    ))
    task_age = _Family(lambda: Histogram(
        "hutch_task_age_seconds", "Age of a task (since it was submitted) when it is fetched", buckets=AGE_BUCKETS,
        registry=None,
    ))
    fetch_seconds = _Family(lambda: Histogram(
        "hutch_fetch_duration_seconds", "Time one fetch took, by proxy tier (direct: no proxy)", ["tier"],
        buckets=FETCH_BUCKETS, registry=None,
    ))
    proxy_requests = _Family(lambda: Counter(
        "hutch_proxy_requests", "Requests sent, by proxy tier (direct: no proxy)", ["tier"], registry=None
    ))
    leases = _Family(lambda: Counter(
        "hutch_proxy_leases", "Proxy leases given (none: no proxy usable then), by tier", ["tier"], registry=None
    ))
    stored = _Family(lambda: Counter("hutch_items_stored", "Items written to the store", registry=None))
    api_requests = _Family(lambda: Counter(
        "hutch_api_requests", "API requests, by route (its template), method and status", ["route", "method", "status"],
        registry=None,
    ))
    parsed = _Family(lambda: Counter(
        "hutch_pages_parsed", "Pages the parser finished, by outcome (ok, or the parse failure's reason)",
        ["outcome"], registry=None,
    ))
    parse_seconds = _Family(lambda: Histogram(
        "hutch_parse_duration_seconds", "Time extracting one page took, in a parse worker and waiting for one",
        buckets=FETCH_BUCKETS, registry=None,
    ))

    def __init__(self, top_domains: int = 50) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU seconds, descriptors
        self.domains = DomainLabels(top_domains, forget=self._forget)
        self._series: dict[str, set[tuple[Counter, tuple[str, ...]]]] = {}

    def count(self, family: Counter, domain: str, *labels: str, amount: float = 1.0) -> None:
        """Add to a counter whose first label is a domain, keeping its series bounded."""
        name = self.domains(domain)
        values = (name, *labels)
        family.labels(*values).inc(amount)
        if name != OTHER:
            self._series.setdefault(name, set()).add((family, values))

    def _forget(self, domain: str) -> None:
        for family, values in self._series.pop(domain, set()):
            with contextlib.suppress(KeyError):
                family.remove(*values)

    def collect(self, collector: Callable[[], Iterable[Metric]]) -> None:
        """Add series computed at each scrape from a service's own state."""
        self.registry.register(_Collect(collector))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Collect(Collector):
    def __init__(self, collector: Callable[[], Iterable[Metric]]) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        yield from self._collector()


def gauge(name: str, help_text: str, labels: list[str], samples: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    """A gauge family computed at scrape time."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def by_label(pairs: Iterable[tuple[str, float]], combine: Callable[[float, float], float]) -> dict[str, float]:
    """Fold (label, value) pairs whose labels repeat (several domains mapped to `other`)."""
    folded: dict[str, float] = {}
    for label, value in pairs:
        folded[label] = combine(folded[label], value) if label in folded else value
    return folded


# -- the port ---------------------------------------------------------------------------

MAX_HEAD = 8192  # bytes of a request head: a scrape's or a probe's is a few hundred
HEAD_TIMEOUT = 5.0


class Endpoint:
    """`/metrics`, `/healthz` and `/readyz` of one service, on a port of its own.

    HTTP/1.1 with `Connection: close`, GET only: what Prometheus and the kubelet's probes
    send. Served on the service's event loop, so a scrape reads the service's state without
    locks; exposition of a few thousand series takes milliseconds.
    """

    def __init__(self, metrics: Metrics, ready: Callable[[], bool], host: str, port: int) -> None:
        self.metrics = metrics
        self.ready = ready
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound (the one asked for, or a free one for 0)."""
        # The reader's limit bounds a request head: a longer one is never buffered whole.
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                return
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, kind, body = self._answer(method, path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", text, b"GET only\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, self.metrics.exposition()
        if path == "/healthz":
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            if self.ready():
                return "200 OK", text, b"ready\n"
            return "503 Service Unavailable", text, b"not ready: not connected to the broker, or not consuming\n"
        return "404 Not Found", text, b"/metrics, /healthz or /readyz\n"
