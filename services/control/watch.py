"""`hutch watch`: the fleet's four signals, live, with the conditions that matter named.

With a queue and a pool of workers there is no progress bar to look at. What tells whether
a job is healthy are four signals: queue depth (is work piling up faster than workers clear
it?), task age (is anything sitting unprocessed for unusually long?), retries per target
(is one site flagging our traffic?) and dead-letter volume (how much fails outright?).
This view reads them where they are, with no Prometheus server needed:

- every service's `/metrics` (the ports of `docs/metrics.md`, or `--metrics URL`...);
- the store, where it can be opened (tasks of running jobs that have not moved);
- RabbitMQ's own metrics (the `rabbitmq_prometheus` plugin, `HUTCH_BROKER_METRICS_URL`), for
  the broker's descriptors and memory: RabbitMQ 3.10 stops accepting connections when it
  runs out of descriptors, and blocks publishers at its memory watermark.

It flags, by name (`flags`, a pure function of the readings):
- `under_provisioned`: the demand signal (slots the limits would fill minus fetches in
  flight) stayed above 0 for `HUTCH_WATCH_UNDER_FOR` seconds. A rising depth alone is not
  it: every rate-limited backlog's depth rises;
- `retry_spike`: one domain's retries per fetch over the window reached
  `HUTCH_WATCH_SPIKE_RATIO` (and `HUTCH_WATCH_SPIKE_MIN` retries) while every other domain
  stayed at a third of that or below: that site has likely started flagging the traffic;
- `dead_letters`: dead letters grew over the window;
- `stale`: a task of a running job has not moved for `HUTCH_WATCH_STALE_AFTER` seconds;
- `broker_descriptors`, `broker_memory`: the broker uses `HUTCH_WATCH_BROKER_HEADROOM` of
  its limit or more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hutch.services.control.terminal import json_text, shown
from hutch.settings import Settings
from hutch.store import Store, StoreError

if TYPE_CHECKING:
    import httpx

Samples = dict[str, list[tuple[dict[str, str], float]]]
FlagKind = Literal["under_provisioned", "retry_spike", "dead_letters", "stale", "broker_descriptors", "broker_memory"]
MAX_METRICS_BYTES = 8 * 1024 * 1024  # one endpoint's exposition; Hutch's are a few hundred KiB at most
SCRAPE_TIMEOUT = 3.0


@dataclass(frozen=True)
class Flag:
    kind: FlagKind
    subject: str
    detail: str


@dataclass(frozen=True)
class Thresholds:
    under_for: float = 60.0
    spike_ratio: float = 0.2
    spike_min: int = 5
    stale_after: float = 900.0
    headroom: float = 0.8

    @classmethod
    def of(cls, s: Settings) -> Thresholds:
        return cls(s.watch_under_for, s.watch_spike_ratio, s.watch_spike_min, s.watch_stale_after,
                   s.watch_broker_headroom)


@dataclass
class Reading:
    """One look at everything: the services' samples merged, the store's waiting tasks, the broker's."""

    at: float
    samples: Samples
    reached: list[str]
    missed: list[str]
    waiting: list[tuple[str, int, float]] | None = None  # (domain, tasks, earliest last move); None: no store
    broker: Samples | None = None

    def values(self, name: str, source: Samples | None = None) -> list[tuple[dict[str, str], float]]:
        return (self.samples if source is None else source).get(name, [])

    def by(self, name: str, label: str) -> dict[str, float]:
        """Sum of `name`'s samples grouped by one label."""
        found: dict[str, float] = {}
        for labels, value in self.values(name):
            key = labels.get(label, "")
            found[key] = found.get(key, 0.0) + value
        return found

    def top(self, name: str, source: Samples | None = None) -> float | None:
        """The largest sample of `name` (several governors export the same gauge), or None."""
        values = [v for _, v in self.values(name, source)]
        return max(values) if values else None


def parse(text: str) -> Samples:
    # Imported here, as httpx below: every `hutch` command imports this module for its
    # arguments, and only `hutch watch` reads metrics (both together about 0.1 s).
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def merge(parts: Iterable[Samples]) -> Samples:
    merged: Samples = {}
    for part in parts:
        for name, values in part.items():
            merged.setdefault(name, []).extend(values)
    return merged


def increase(first: Reading, last: Reading, name: str, label: str) -> dict[str, float]:
    """How much a counter grew between two readings, by one label (a reset counts from 0)."""
    before, after = first.by(name, label), last.by(name, label)
    return {k: v - before.get(k, 0.0) if v >= before.get(k, 0.0) else v for k, v in after.items()}


def flags(readings: Sequence[Reading], t: Thresholds, window: float) -> list[Flag]:
    """The conditions the readings show, by name; `window` seconds back for rates and growth."""
    if not readings:
        return []
    last = readings[-1]
    first = next(r for r in readings if r.at >= last.at - window)
    return [
        *_under_provisioned(readings, t),
        *_retry_spikes(first, last, t),
        *_dead_letters(first, last),
        *_stale(last, t),
        *_broker(last, t),
    ]


def _under_provisioned(readings: Sequence[Reading], t: Thresholds) -> list[Flag]:
    """The demand stayed above 0 for the whole of `under_for` (the readings must cover it)."""
    last = readings[-1]
    if readings[0].at > last.at - t.under_for:
        return []
    span = [r.top("hutch_fetch_demand") for r in readings if r.at >= last.at - t.under_for]
    if not span or not all(d is not None and d > 0 for d in span):
        return []
    now = span[-1] or 0.0
    return [Flag("under_provisioned", "fetchers",
                 f"demand above 0 for {t.under_for:g}s: {now:.1f} fetch slots wanted beyond those busy")]


def _retry_spikes(first: Reading, last: Reading, t: Thresholds) -> list[Flag]:
    """One domain's retries per fetch spiking while every other stays at a third of it or below."""
    fetched = increase(first, last, "hutch_fetches_total", "domain")
    retried = increase(first, last, "hutch_retries_total", "domain")
    ratios = {d: retried.get(d, 0.0) / n for d, n in fetched.items() if n > 0}
    found = []
    for domain, ratio in sorted(ratios.items()):
        others = [r for d, r in ratios.items() if d != domain]
        if retried.get(domain, 0.0) >= t.spike_min and ratio >= t.spike_ratio and all(r <= ratio / 3 for r in others):
            found.append(Flag("retry_spike", domain,
                              f"{retried[domain]:.0f} retries in {fetched[domain]:.0f} fetches ({ratio:.0%}) over "
                              f"{last.at - first.at:.0f}s; other domains at most {max(others, default=0.0):.0%}"))
    return found


def _dead_letters(first: Reading, last: Reading) -> list[Flag]:
    dead = {d: n for d, n in increase(first, last, "hutch_dead_letters_total", "domain").items() if n > 0}
    if not dead:
        return []
    worst = sorted(dead.items(), key=lambda kv: -kv[1])
    return [Flag("dead_letters", worst[0][0],
                 f"{sum(dead.values()):.0f} dead letters in the last {last.at - first.at:.0f}s ("
                 + ", ".join(f"{d}: {n:.0f}" for d, n in worst[:3]) + ")")]


def _stale(last: Reading, t: Thresholds) -> list[Flag]:
    """What has not moved for too long (the store's view), or, where no store can be read,
    what has waited too long for its permit since its submission (the governor's)."""
    if last.waiting is not None:
        return [
            Flag("stale", domain, f"{count} task(s) waiting; the oldest has not moved for {last.at - moved:.0f}s")
            for domain, count, moved in sorted(last.waiting)
            if last.at - moved > t.stale_after
        ]
    return [
        Flag("stale", labels.get("domain", ""), f"a task has waited {age:.0f}s for its permit")
        for labels, age in last.values("hutch_oldest_task_age_seconds")
        if age > t.stale_after
    ]


BROKER_LIMITS: tuple[tuple[FlagKind, str, str, str], ...] = (
    ("broker_descriptors", "rabbitmq_process_open_fds", "rabbitmq_process_max_fds", "file descriptors"),
    ("broker_memory", "rabbitmq_process_resident_memory_bytes", "rabbitmq_resident_memory_limit_bytes",
     "memory (of its high watermark)"),
)


def _broker(last: Reading, t: Thresholds) -> list[Flag]:
    if last.broker is None:
        return []
    found = []
    for kind, used, limit, what in BROKER_LIMITS:
        u, lim = last.top(used, last.broker), last.top(limit, last.broker)
        if u is not None and lim and u / lim >= t.headroom:
            found.append(Flag(kind, "rabbitmq", f"{u / lim:.0%} of its {what} in use ({u:.0f} of {lim:.0f})"))
    return found


def summary(readings: Sequence[Reading], t: Thresholds, window: float) -> dict[str, Any]:
    """What the view shows, as data (the `--json` output)."""
    last = readings[-1]
    first = next(r for r in readings if r.at >= last.at - window)
    fetched = increase(first, last, "hutch_fetches_total", "domain")
    retried = increase(first, last, "hutch_retries_total", "domain")
    dead = increase(first, last, "hutch_dead_letters_total", "domain")
    backlog = last.by("hutch_domain_backlog", "domain")
    rate = {labels.get("domain", ""): v for labels, v in last.values("hutch_domain_rate")}
    oldest = {labels.get("domain", ""): v for labels, v in last.values("hutch_oldest_task_age_seconds")}
    waiting = {d: (n, last.at - moved) for d, n, moved in (last.waiting or [])}
    names = set(fetched) | set(retried) | set(dead) | set(backlog) | set(rate) | set(waiting)
    domains: list[dict[str, Any]] = []
    for d in names:
        n = fetched.get(d, 0.0)
        domains.append({
            "domain": d,
            "backlog": backlog.get(d),
            "rate": rate.get(d),
            "fetches": n,
            "retries": retried.get(d, 0.0),
            "retry_ratio": round(retried.get(d, 0.0) / n, 4) if n else None,
            "dead": dead.get(d, 0.0),
            "oldest_age": oldest.get(d),
            "waiting": waiting[d][0] if d in waiting else None,
            "not_moved_for": round(waiting[d][1], 1) if d in waiting else None,
        })
    domains.sort(key=lambda row: (-(backlog.get(row["domain"]) or 0.0) - (waiting.get(row["domain"], (0, 0.0))[0]),
                                  -fetched.get(row["domain"], 0.0), row["domain"]))
    queues: dict[str, float] = {}
    for labels, depth in last.values("hutch_queue_depth"):
        queue = labels.get("queue", "")
        queues[queue] = max(queues.get(queue, 0.0), depth)
    proxies: dict[str, dict[str, float]] = {}
    for labels, n in last.values("hutch_proxies"):
        proxies.setdefault(labels.get("tier", ""), {})[labels.get("state", "")] = n
    for labels, n in last.values("hutch_proxy_bans"):
        proxies.setdefault(labels.get("tier", ""), {})["bans"] = n
    ages = increase(first, last, "hutch_task_age_seconds_sum", "__all__").get("", 0.0)
    aged = increase(first, last, "hutch_task_age_seconds_count", "__all__").get("", 0.0)
    broker = None
    if last.broker is not None:
        broker = {
            "descriptors": last.top("rabbitmq_process_open_fds", last.broker),
            "descriptors_limit": last.top("rabbitmq_process_max_fds", last.broker),
            "memory": last.top("rabbitmq_process_resident_memory_bytes", last.broker),
            "memory_limit": last.top("rabbitmq_resident_memory_limit_bytes", last.broker),
        }
    return {
        "at": last.at,
        "window": round(last.at - first.at, 1),
        "flags": [asdict(f) for f in flags(readings, t, window)],
        "queues": dict(sorted(queues.items())),
        "demand": {
            "slots_wanted": last.top("hutch_fetch_slots_wanted"),
            "in_flight": last.top("hutch_fetches_in_flight"),
            "demand": last.top("hutch_fetch_demand"),
        },
        "task_age": {"fetched": aged, "mean_seconds": round(ages / aged, 2) if aged else None},
        "domains": domains,
        "proxies": proxies,
        "broker": broker,
        "sources": {
            "metrics": last.reached,
            "unreachable": last.missed,
            "store": last.waiting is not None,
            "broker": last.broker is not None,
        },
    }


# -- reading ---------------------------------------------------------------------------------


def endpoints(settings: Settings, fetchers: int) -> list[str]:
    """The metrics URLs of a deployment on its configured ports (fetchers on consecutive ones)."""
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "::", "") else settings.metrics_host
    ports = [settings.metrics_port(name) for name in ("governor", "proxy-manager", "parser", "storer")]
    ports += [settings.fetcher_metrics_port + n for n in range(fetchers)]
    return [f"http://{host}:{port}/metrics" for port in ports if port]


class Reader:
    def __init__(self, settings: Settings, urls: list[str], broker_url: str | None) -> None:
        self.urls = urls
        self.broker_url = broker_url
        import httpx

        self.client: httpx.AsyncClient = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT, trust_env=False)
        self.store: Store | None = None
        location = settings.store_location
        if location.startswith("sqlite:///") and not Path(location.removeprefix("sqlite:///")).exists():
            return  # not on this machine: never create an empty store by looking
        try:
            self.store = Store(location)
        except StoreError:
            self.store = None

    async def close(self) -> None:
        await self.client.aclose()
        if self.store is not None:
            self.store.close()

    async def _get(self, url: str) -> Samples | None:
        import httpx

        try:
            async with self.client.stream("GET", url) as response:
                if response.status_code != 200:
                    return None
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        return None
            return parse(body.decode("utf-8", "replace"))
        except (httpx.HTTPError, ValueError, OSError):
            return None

    async def read(self) -> Reading:
        found = await asyncio.gather(*(self._get(url) for url in self.urls))
        broker = await self._get(self.broker_url) if self.broker_url else None
        waiting = None
        if self.store is not None:
            try:
                waiting = self.store.waiting()
            except Exception:  # a store in the middle of a migration, locked, gone: not shown this time
                waiting = None
        return Reading(
            at=time.time(),
            samples=merge(s for s in found if s is not None),
            reached=[u for u, s in zip(self.urls, found, strict=True) if s is not None],
            missed=[u for u, s in zip(self.urls, found, strict=True) if s is None],
            waiting=waiting,
            broker=broker,
        )


# -- showing ---------------------------------------------------------------------------------


def _cell(value: object, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return shown(value)


def render(view: dict[str, Any], top: int) -> Any:
    """The view as rich renderables (tables), every outside string escaped."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [
        Text(f"! {f['kind']}: {shown(f['subject'])}: {shown(f['detail'])}", style="bold red") for f in view["flags"]
    ] or [Text("no condition flagged", style="green")]
    demand, age = view["demand"], view["task_age"]
    parts.append(Text(
        f"window {view['window']:.0f}s | demand {_cell(demand['demand'], 1)} (wanted "
        f"{_cell(demand['slots_wanted'], 1)}, in flight {_cell(demand['in_flight'])}) | fetched "
        f"{age['fetched']:.0f}, mean task age {_cell(age['mean_seconds'], 1)}s"
    ))
    parts.append(_table("queues", ("queue", "ready"), ((q, f"{d:.0f}") for q, d in view["queues"].items())))
    parts.append(_table(
        f"domains (top {top})",
        ("domain", "backlog", "rate/s", "fetches", "retries", "retry %", "dead", "oldest s", "not moved s"),
        (
            (
                row["domain"], _cell(row["backlog"]), _cell(row["rate"], 2), _cell(row["fetches"]),
                _cell(row["retries"]), "-" if row["retry_ratio"] is None else f"{row['retry_ratio']:.0%}",
                _cell(row["dead"]), _cell(row["oldest_age"]), _cell(row["not_moved_for"]),
            )
            for row in view["domains"][:top]
        ),
    ))
    if view["proxies"]:
        rows = ((tier, *(_cell(s.get(k)) for k in ("alive", "dead", "bans"))) for tier, s in view["proxies"].items())
        parts.append(_table("proxies", ("tier", "alive", "dead", "bans"), rows))
    broker = view["broker"]
    if broker is not None:
        parts.append(Text(
            f"broker: descriptors {_cell(broker['descriptors'])}/{_cell(broker['descriptors_limit'])}, memory "
            f"{(broker['memory'] or 0) / 2**20:.0f}/{(broker['memory_limit'] or 0) / 2**20:.0f} MiB"
        ))
    sources = view["sources"]
    parts.append(Text(
        f"read {len(sources['metrics'])} metrics endpoint(s)"
        + (f", {len(sources['unreachable'])} unreachable" if sources["unreachable"] else "")
        + (", the store" if sources["store"] else ", no store") + (", the broker" if sources["broker"] else ""),
        style="dim",
    ))
    return Group(*parts)


def _table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for n, name in enumerate(columns):
        table.add_column(name, justify="left" if n == 0 else "right")
    for row in rows:
        table.add_row(shown(row[0]), *row[1:])
    return table


async def run(settings: Settings, args: argparse.Namespace) -> int:
    urls = list(args.metrics) or endpoints(settings, args.fetchers)
    broker_url = None if args.no_broker else (args.broker_metrics or settings.broker_metrics_url)
    thresholds = Thresholds.of(settings)
    keep = max(args.window, thresholds.under_for) + args.interval
    reader = Reader(settings, urls, broker_url)
    readings: deque[Reading] = deque()
    try:
        if args.once:
            deadline = time.monotonic() + args.window
            while True:
                readings.append(await reader.read())
                if time.monotonic() + args.interval > deadline:
                    break
                await asyncio.sleep(args.interval)
            view = summary(readings, thresholds, args.window)
            if args.json:
                print(json_text(view, indent=2))
            else:
                from rich.console import Console

                Console().print(render(view, args.top))
            return 1 if view["flags"] and args.exit_code else 0
        from rich.console import Console
        from rich.live import Live

        console = Console()
        # On a terminal the view redraws in place; into a pipe or a file, one view a reading.
        live = Live(console=console, refresh_per_second=4, screen=False) if console.is_terminal else None
        with live if live is not None else contextlib.nullcontext():
            while True:
                readings.append(await reader.read())
                while readings and readings[0].at < readings[-1].at - keep:
                    readings.popleft()
                view = render(summary(readings, thresholds, args.window), args.top)
                if live is not None:
                    live.update(view)
                else:
                    console.print(view)
                    console.file.flush()
                await asyncio.sleep(args.interval)
    finally:
        await reader.close()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help="live view of queues, domains, retries, dead letters, proxies and task age, with flags"
    )
    p.add_argument("--once", action="store_true", help="read for --window seconds, print one view and exit")
    p.add_argument("--json", action="store_true", help="with --once: the view as JSON")
    p.add_argument("--exit-code", action="store_true", help="with --once: exit 1 when a condition is flagged")
    p.add_argument("--window", type=float, default=30.0, help="seconds of readings rates and growth cover (default 30)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between readings (default 2)")
    p.add_argument("--metrics", action="append", default=[], metavar="URL",
                   help="a service's /metrics URL (repeat; default: the configured ports on HUTCH_METRICS_HOST)")
    p.add_argument("--fetchers", type=int, default=8,
                   help="fetcher ports to look at from HUTCH_FETCHER_METRICS_PORT on (default 8)")
    p.add_argument("--broker-metrics", metavar="URL", help="RabbitMQ's /metrics (default HUTCH_BROKER_METRICS_URL)")
    p.add_argument("--no-broker", action="store_true", help="do not read RabbitMQ's own metrics")
    p.add_argument("--top", type=int, default=20, help="domains shown (default 20; --json shows all)")
    return p
