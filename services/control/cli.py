"""The `hutch` command line.

Every command reads the same settings (`HUTCH_*` variables) as the services. Errors a user
can cause or fix (an unreachable broker, a bad URL file, a broken spec) end the command
with one sentence on stderr and exit status 2, never a traceback.

Why this module is long (about 740 lines): it is one small function per command plus the
parser that names them all, so `hutch --help` and the code that answers it read side by
side. What a command does beyond reading its arguments lives in a module of its own
(`submit`, `jobs`, `dlq`, `supervisor`, `terminal`, `demo`, and the governor's `status`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hutch import telemetry
from hutch.amqp import Broker, BrokerUnreachable, PublishFailed, queue_depth
from hutch.models import DEFAULT_TOP, MAX_PATTERN, MAX_TOP, SORT_KEYS, Spec, StatusRequest
from hutch.remote import RemoteError
from hutch.services import ALL, SERVICES, service_class
from hutch.services.control import dlq, exports, overapi, reparse, storecopy, timeline, watch
from hutch.services.control.jobs import (
    Action,
    JobControlError,
    append_control,
    check_budget,
    check_control,
    check_weight,
    control_record,
    known_job,
    note_control,
)
from hutch.services.control.submit import (
    JobNameError,
    Submitted,
    UrlFileError,
    check_job_name,
    check_urls,
    default_job_name,
    send,
    submit,
    valid_urls,
)
from hutch.services.control.supervisor import Supervisor
from hutch.services.control.terminal import json_text, shown
from hutch.services.governor.limits import LimitsError, parse_rate_for
from hutch.services.governor.status import DomainReport, domain_report
from hutch.services.parser.spec import SpecError, load_spec
from hutch.services.proxy_manager.costs import cost_summary
from hutch.services.proxy_manager.pool import TIERS, PoolError, load_pool
from hutch.settings import Settings, problems, redact_url
from hutch.store import AsyncStore, JobCounts, Store, StoreError


class UserError(Exception):
    """Something the user can fix; printed as one sentence."""


# -- helpers ------------------------------------------------------------------------------


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        # pydantic's own text spans several lines; one clause per bad variable reads better.
        raise UserError(f"invalid setting {problems(exc)}") from None
    except Exception as exc:
        raise UserError(f"invalid setting: {exc}") from None


def _rate(text: str) -> float:
    value = text.removesuffix("/s")
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rate like 2/s, got {text!r}") from None
    if rate <= 0:
        raise argparse.ArgumentTypeError("the rate must be positive")
    return rate


def _weight(text: str) -> float:
    try:
        return check_weight(float(text))
    except ValueError as exc:
        message = str(exc) if isinstance(exc, JobControlError) else f"expected a number, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def _budget(text: str) -> float:
    try:
        return check_budget(float(text))
    except ValueError as exc:
        message = str(exc) if isinstance(exc, JobControlError) else f"expected a number, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def _top(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"use 1 to {MAX_TOP} (narrow with --match for more)")
    return value


def _pattern(text: str) -> str:
    if not text or len(text) > MAX_PATTERN:
        raise argparse.ArgumentTypeError(f"a pattern of 1 to {MAX_PATTERN} characters")
    return text


def _job(given: str | None, urls_file: Path) -> str:
    """The job name: `--job` as given when valid, else one made from the file's name."""
    if given is None:
        return default_job_name(urls_file)
    try:
        return check_job_name(given)
    except JobNameError as exc:
        raise UserError(str(exc)) from None


def _open_store(settings: Settings) -> Store:
    """The store, or the reason it cannot be opened as one sentence for the user."""
    try:
        return Store(settings.store_location)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def _not_cancelled(settings: Settings, job: str) -> None:
    """Refuse to submit to a job the local store says is cancelled: its tasks would end dead."""
    known = known_job(settings.store_location, job)
    if known is not None and known.state == "cancelled":
        raise UserError(f"job {job!r} is cancelled: its tasks would end dead at once; submit them as a new job")


def _load_spec(path: str | None) -> Spec | None:
    if path is None:
        return None
    try:
        return load_spec(path)
    except SpecError as exc:
        raise UserError(str(exc)) from None


def _check_urls(path: Path, skip_invalid: bool, max_url_bytes: int) -> int:
    try:
        checked = check_urls(path, skip_invalid, max_url_bytes)
    except UrlFileError as exc:
        raise UserError(str(exc)) from None
    for number, text, why in checked.skipped:
        print(f"skipped line {number}: {shown(text[:200])} ({shown(why)})", file=sys.stderr)
    return checked.valid


async def _connect(settings: Settings, name: str = "control") -> Broker:
    # aiormq logs a failed connect itself (with no handler configured, straight to stderr);
    # the one sentence below already says it.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    try:
        return await Broker(settings, name).connect()
    except BrokerUnreachable as exc:
        raise UserError(f"{exc}. Start RabbitMQ (`make broker`) or set HUTCH_AMQP_URL.") from None


def _counts_line(counts: JobCounts) -> str:
    ended = " (cancelled)" if counts.state == "cancelled" else ""
    return f"done: {counts.stored} stored, {counts.dead} dead, {counts.pending} pending{ended}"


async def _job_counts(store: AsyncStore, job: str) -> JobCounts:
    found = await store.run(lambda s: s.counts(job))
    return found[0] if found else JobCounts(job, 0, 0, 0, 0, 0)


async def _services_running(broker: Broker) -> int:
    """Consumers on fetch.ready: more than zero means a set of services runs in this namespace."""
    channel = await broker.channel()
    try:
        depth = await queue_depth(channel, broker.topology.fetch_ready)
        if depth is None:
            raise RuntimeError(f"cannot read {broker.topology.fetch_ready}")
        return depth[1]
    finally:
        await channel.close()


class Progress:
    """A one-line progress bar on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: Any = sys.stderr) -> None:
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = time.monotonic()
        self.last_line = 0.0

    def show(self, counts: JobCounts) -> None:
        done = counts.stored + counts.dead
        total = max(counts.total, 1)
        rate = counts.stored / max(time.monotonic() - self.started, 1e-9)
        width = 30
        filled = int(width * done / total)
        text = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{counts.total} "
            f"stored {counts.stored} dead {counts.dead} in flight {counts.in_flight} "
            f"| {rate:.1f} pages/s"
        )
        if self.tty:
            print(f"\r{text}", end="", file=self.stream, flush=True)
        elif time.monotonic() - self.last_line >= 5:
            self.last_line = time.monotonic()
            print(text, file=self.stream, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=self.stream)


def _export(store_location: str, job: str, out: Path | None, form: str = "jsonl") -> int:
    store = Store(store_location)
    try:
        if not store.job_exists(job):
            raise UserError(f"no job named {job!r} in the store {redact_url(store_location)}")
        # newline="": the CSV writer ends its rows with CRLF itself (RFC 4180).
        with out.open("w", encoding="utf-8", newline="") if out else contextlib.nullcontext(sys.stdout) as handle:
            return exports.write(store, job, form, handle)
    finally:
        store.close()


def _export_format(args: argparse.Namespace) -> str:
    """`--format`, or what `--out`'s suffix says (`.csv`), else JSON lines."""
    if args.format:
        return str(args.format)
    return "csv" if args.out and args.out.lower().endswith(".csv") else "jsonl"


async def _submit_file(
    broker: Broker,
    store: AsyncStore,
    settings: Settings,
    job: str,
    path: Path,
    spec: Spec | None,
    tier_floor: str | None,
    weight: float | None,
) -> Submitted:
    """A URL file into a job; a weight goes on the jobs stream before any task of the job is out."""
    if weight is not None:
        await append_control(broker, control_record(job, "weight", weight))
    return await submit(
        broker,
        store,
        job,
        valid_urls(path, settings.max_url_bytes),
        spec,
        tier_floor=tier_floor,
        max_url_bytes=settings.max_url_bytes,
    )


# -- commands -----------------------------------------------------------------------------


async def cmd_submit(args: argparse.Namespace) -> int:
    settings = _settings()
    path = Path(args.urls_file)
    job = _job(args.job, path)
    spec = _load_spec(args.spec)
    _check_urls(path, args.skip_invalid, settings.max_url_bytes)
    if settings.api_url:
        sent_by_api = overapi.submit(settings, job, path, args.spec, args.tier_floor, args.weight)
        print(job)
        print(f"submitted {sent_by_api['urls']} URLs to job {job} through the API", file=sys.stderr)
        return 0
    _not_cancelled(settings, job)
    # The broker is all it needs: the storer records the URLs from the intake queue.
    broker = await _connect(settings)
    try:
        if args.weight is not None:
            await append_control(broker, control_record(job, "weight", args.weight))
        sent = await send(
            broker, job, valid_urls(path, settings.max_url_bytes), spec, args.tier_floor, settings.max_url_bytes
        )
    finally:
        await broker.close()
    duplicates = sent.lines - sent.urls
    print(job)
    print(
        f"submitted {sent.urls} URLs to job {job}"
        + (f", {duplicates} duplicate lines" if duplicates else "")
        + "; the storer records them (a URL the job has already is not fetched again)",
        file=sys.stderr,
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.domains:
        return asyncio.run(cmd_domains(args))
    if args.top is not None or args.sort is not None or args.match is not None or args.paused:
        raise UserError("--top, --sort, --match and --paused go with --domains")
    settings = _settings()
    if settings.api_url:
        rows, costs = overapi.job_rows(settings, args.job)
        print_status(rows, costs, args.json)
        return 0
    store = _open_store(settings)
    try:
        rows = store.counts(args.job)
        costs = cost_summary(store, args.job)
    finally:
        store.close()
    if args.job and not rows:
        raise UserError(f"no job named {args.job!r} in the store {redact_url(settings.store_location)}")
    print_status(rows, costs, args.json)
    return 0


def print_status(rows: list[JobCounts], costs: list[dict[str, Any]], as_json: bool) -> None:
    """`hutch status`'s table (or JSON) of jobs, then the proxy costs per job, domain and tier."""
    if as_json:
        by_job: dict[str, list[dict[str, Any]]] = {}
        for cost in costs:
            by_job.setdefault(cost["job"], []).append(cost)
        print(json_text([job_json(row, by_job.get(row.job, [])) for row in rows]))
        return
    print(
        f"{'job':<24} {'state':<16} {'total':>8} {'stored':>8} {'dead':>8} {'cancelled':>9} {'pending':>8} "
        f"{'in flight':>9} {'stalled':>8} {'rescued':>8}"
    )
    for row in rows:
        print(
            f"{shown(row.job):<24} {job_state_text(row):<16} {row.total:>8} {row.stored:>8} {row.dead:>8} "
            f"{row.cancelled:>9} {row.pending:>8} {row.in_flight:>9} {row.stalled:>8} {row.rescued:>8}"
        )
    for row in rows:
        if row.budget is not None or row.reason is not None:
            print(f"job {shown(row.job)}: {budget_text(row)}")
    for row in rows:
        if row.crawl:
            c = row.crawl
            print(
                f"crawl {shown(row.job)}: {c['discovered']} links found, {c['admitted']} pages admitted, "
                f"{c['duplicates']} duplicates, {c['over_depth']} beyond max_depth, {c['over_pages']} beyond "
                f"max_pages; depth {c['depth']} reached"
            )
    if costs:
        print()
        print(f"{'job':<24} {'domain':<28} {'tier':<12} {'requests':>8} {'ok':>8} {'est. cost':>10}")
        for cost in costs:
            print(
                f"{shown(cost['job']):<24} {shown(cost['domain']):<28} {shown(cost['tier']):<12} {cost['requests']:>8} "
                f"{cost['ok']:>8} {cost['cost']:>10.4f}"
            )


def domain_request(args: argparse.Namespace) -> StatusRequest:
    """The governors' query from `hutch status --domains` options."""
    return StatusRequest(
        top=args.top or DEFAULT_TOP, sort=args.sort or "held", match=args.match, paused_only=args.paused
    )


def _depth(value: int | None) -> str:
    return "?" if value is None else str(value)


def print_domains(report: DomainReport, request: StatusRequest) -> None:
    frontier = report.frontier
    print(
        f"frontier: {_depth(frontier.waiting)} tasks waiting in {len(frontier.shards)} shards, "
        f"{_depth(frontier.paused)} of paused jobs"
    )
    if not report.governors:
        print("no governor answered (is one running in this namespace?)")
        return
    how = f"by {request.sort}" + (f", matching {shown(request.match)}" if request.match else "")
    how += ", paused now only" if request.paused_only else ""
    print(f"domains: {len(report.rows)} of {report.total} shown ({how})")
    print(
        f"{'domain':<32} {'rate/s':>7} {'ceiling':>7} {'paused s':>8} {'held':>7} {'parked':>7} "
        f"{'in flight':>9} {'jobs':>5} {'released':>9} {'throttled':>9}"
    )
    for row in report.rows:
        print(
            f"{shown(row['domain']):<32} {row['rate']:>7.2f} {row['ceiling']:>7.2f} {row['paused_for']:>8.1f} "
            f"{_depth(row.get('held')):>7} {_depth(row.get('parked')):>7} {row['in_flight']:>9} "
            f"{_depth(row.get('jobs')):>5} {row.get('released', 0):>9} {row.get('throttled', 0):>9}"
        )


def domains_json(report: DomainReport) -> dict[str, Any]:
    """`hutch status --domains --json`: one document, the selected rows whole."""
    return {
        "total_domains": report.total,
        "governors": report.governors,
        "frontier": {
            "waiting": report.frontier.waiting,
            "paused": report.frontier.paused,
            "shards": report.frontier.shards,
        },
        "domains": report.rows,
    }


async def cmd_domains(args: argparse.Namespace) -> int:
    """`hutch status --domains`: the top domains by rate, pause, held tasks, from the governors."""
    settings = _settings()
    request = domain_request(args)
    if settings.api_url:
        report = overapi.domain_report(settings, request)
    else:
        broker = await _connect(settings)
        try:
            report = await domain_report(broker, request)
        finally:
            await broker.close()
    if args.json:
        print(json_text(domains_json(report)))
        return 0
    print_domains(report, request)
    return 0


def job_state_text(row: JobCounts) -> str:
    """`running`, `paused` (`paused: budget` when its proxy budget paused it) or `cancelled`
    (done, whatever is pending), `finished` once nothing is pending, and the weight if not 1."""
    text = row.state if row.state != "paused" or not row.reason else f"paused: {shown(row.reason)}"
    if row.total and row.pending == 0:
        text = "finished" if row.state == "running" else f"{row.state}, finished"
    return text if row.weight == 1 else f"{text} w={row.weight:g}"


def _cost(value: float) -> str:
    return f"{value:.2f}" if value >= 1 else f"{value:.4g}"


def budget_text(row: JobCounts) -> str:
    """A job's proxy budget and why it is paused, when not by a person:
    `paused: proxy budget 5.00 spent (5.02)`, or `proxy budget 5.00, 1.20 spent`."""
    if row.reason == "budget" and row.state == "paused":
        budget = _cost(row.budget) if row.budget is not None else "?"
        return f"paused: proxy budget {budget} spent ({_cost(row.spent)}); hutch resume {shown(row.job)} --budget B"
    if row.state == "paused" and row.reason:
        return f"paused: {shown(row.reason)}"
    return f"proxy budget {_cost(row.budget or 0.0)}, {_cost(row.spent)} spent"


def job_json(row: JobCounts, costs: list[dict[str, Any]]) -> dict[str, Any]:
    """A job's row in `hutch status --json`: its counts, state, weight, whether it finished."""
    return {**row.__dict__, "finished": row.total > 0 and row.done, "costs": costs}


async def control_job(
    settings: Settings, job: str, action: Action, weight: float | None = None, budget: float | None = None
) -> None:
    """Check what the store can tell, append the record to the `jobs` stream (confirmed), then
    record it in the store here, so `hutch status` and the next command see it at once."""
    if settings.api_url:  # the API checks and records, as below
        overapi.control(settings, job, action, weight, budget)
        return
    try:
        record = control_record(job, action, weight, budget)
        known = known_job(settings.store_location, job)
        check_control(job, action, known, budget)
    except (JobNameError, JobControlError) as exc:
        raise UserError(str(exc)) from None
    broker = await _connect(settings)
    try:
        await append_control(broker, record)
    finally:
        await broker.close()
    if known is not None:  # the storer records it too; the same record changes nothing twice
        note_control(settings.store_location, record)


_DONE = {"pause": "paused", "resume": "resumed", "cancel": "cancelled", "weight": "weighted"}


async def cmd_control(args: argparse.Namespace) -> int:
    """`hutch pause|resume|cancel JOB` and `hutch weight JOB W`."""
    settings = _settings()
    action: Action = args.command
    weight, budget = getattr(args, "weight", None), getattr(args, "budget", None)
    await control_job(settings, args.job, action, weight, budget)
    what = f"job {shown(args.job)} {_DONE[action]}" + (f" to {weight:g}" if weight is not None else "")
    what += f" with a proxy budget of {budget:g}" if budget is not None else ""
    print(f"{what}; governors follow the jobs stream", file=sys.stderr)
    return 0


async def cmd_reparse(args: argparse.Namespace) -> int:
    settings = _settings()
    if settings.api_url:
        raise UserError("hutch reparse reads the store: run it where the store is, without HUTCH_API_URL")
    try:
        job = check_job_name(args.job)
    except JobNameError as exc:
        raise UserError(str(exc)) from None
    store = _open_store(settings)
    try:
        if not store.job_exists(job):
            raise UserError(f"no job named {job!r} in the store {redact_url(settings.store_location)}")
        recorded = store.job_spec(job)
        archived, bodies = store.archive_counts(job)
    finally:
        store.close()
    spec = _load_spec(args.spec) if args.spec else (Spec.model_validate(recorded) if recorded else None)
    if spec is None:
        raise UserError(f"job {job!r} has no spec recorded: give one with --spec")
    if archived == 0:
        raise UserError(
            f"job {job!r} has no archived page: only a job whose spec says `archive: true` keeps its pages "
            "(or HUTCH_ARCHIVE_RETENTION has dropped them)"
        )
    broker = await _connect(settings)
    async_store = await AsyncStore(settings.store_location).open()
    try:
        print(f"reparsing {archived} archived pages of {shown(job)} ({bodies} distinct bodies)", file=sys.stderr)
        done = await reparse.reparse(
            broker, async_store, job, spec, follow=args.follow,
            progress=lambda n: print(f"  {n}/{archived} pages sent to the parsers", file=sys.stderr),
        )  # fmt: skip
    finally:
        await async_store.close()
        await broker.close()
    missing = done.tasks - done.pages
    print(
        f"{done.pages} pages sent to the parsers; the items are replaced as the parsers and the storer "
        f"get to them (`hutch status {job}`, `hutch export {job}`)"
        + (f"; {missing} tasks of the job have no archived page (not fetched, or dead)" if missing > 0 else ""),
        file=sys.stderr,
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    settings = _settings()
    out = Path(args.out) if args.out else None
    form = _export_format(args)
    if settings.api_url:
        overapi.job_rows(settings, args.job)  # an unknown job is refused before any file is opened
        with out.open("w", encoding="utf-8", newline="") if out else contextlib.nullcontext(sys.stdout) as handle:
            count = overapi.export(settings, args.job, handle, form)
    else:
        count = _export(settings.store_location, args.job, out, form)
    if out:
        what = "the items" if count is None else f"{count} items"
        print(f"exported {what} to {shown(out)} ({form})", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from hutch.service import main

    main(service_class(args.name), _settings())
    return 0


async def _run_supervisor(supervisor: Supervisor, until: Coroutine[Any, Any, Any] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await supervisor.start()
    try:
        waiters = [asyncio.create_task(stop.wait())]
        if until is not None:
            waiters.append(asyncio.create_task(until))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
    finally:
        await supervisor.stop()


def _limit_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Settings from the rate-limit flags of `up` and `run` (None: not given)."""
    rate_for = ",".join(args.rate_for) if args.rate_for else None
    try:
        parse_rate_for(rate_for)
    except LimitsError as exc:
        raise UserError(f"--rate-for: {exc}") from None
    return {
        "rate": getattr(args, "rate", None),
        "rate_for": rate_for,
        "concurrency_per_domain": args.concurrency_per_domain,
        "respect_robots": False if args.ignore_robots else None,
    }


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rate-for",
        action="append",
        metavar="DOMAIN=R/s",
        help="the rate of one domain, e.g. shop.example=0.5/s (repeatable)",
    )
    p.add_argument("--concurrency-per-domain", type=int, help="fetches in flight per domain, fleet-wide")
    p.add_argument("--ignore-robots", action="store_true", help="do not fetch or obey robots.txt")


async def cmd_up(args: argparse.Namespace) -> int:
    settings = _settings(**_limit_overrides(args))
    broker = await _connect(settings)
    await broker.close()
    env = settings.to_env(os.environ)
    print(f"starting {', '.join(SERVICES)} ({args.fetchers} fetchers); Ctrl-C stops all", file=sys.stderr)
    await _run_supervisor(Supervisor(env, fetchers=args.fetchers, grace=settings.shutdown_grace))
    return 0


async def run_job(
    settings: Settings,
    path: Path,
    job: str,
    spec: Spec | None,
    *,
    fetchers: int = 1,
    attach: bool = False,
    timeout: float | None = None,
    out: Path | None = None,
    verbose: bool = False,
    tier_floor: str | None = None,
    weight: float | None = None,
) -> JobCounts:
    """Start the services (unless attaching), submit, wait with a progress bar, export."""
    broker = await _connect(settings)
    supervisor: Supervisor | None = None
    store = await AsyncStore(settings.store_location).open()
    progress = Progress()
    try:
        running = await _services_running(broker)
        if attach and not running:
            raise UserError("--attach given but no services run in this namespace; start them with `hutch up`")
        if not attach:
            if running:
                raise UserError(
                    f"services already run in namespace {settings.namespace!r} "
                    f"({running} fetcher consumers); use --attach to submit to them, or stop them first"
                )
            supervisor = Supervisor(
                settings.to_env(os.environ),
                fetchers=fetchers,
                out=sys.stderr if verbose else None,
                grace=settings.shutdown_grace,
            )
            await supervisor.start()
            try:
                await supervisor.wait_ready(timeout=60)
            except TimeoutError as exc:
                raise UserError(f"{exc}; run with --verbose to see their logs") from None
        result = await _submit_file(broker, store, settings, job, path, spec, tier_floor, weight)
        print(f"job {job}: {result.published} tasks submitted", file=sys.stderr)
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            counts = await _job_counts(store, job)
            progress.show(counts)
            if counts.done or (deadline and time.monotonic() > deadline):  # cancelled counts as done
                break
            await asyncio.sleep(0.5)
        progress.end()
    finally:
        if supervisor is not None:
            await supervisor.stop()
        await store.close()
        await broker.close()
    out = out or settings.data_dir / f"{job}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    exported = _export(settings.store_location, job, out)
    print(f"items: {exported} in {shown(out)}", file=sys.stderr)
    print(_counts_line(counts))
    return counts


async def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(proxy_file=args.proxies, **_limit_overrides(args))
    path = Path(args.urls_file)
    spec = _load_spec(args.spec)
    if args.proxies:
        try:
            load_pool(args.proxies)
        except PoolError as exc:
            raise UserError(str(exc)) from None
    job = _job(args.job, path)
    _not_cancelled(settings, job)
    _check_urls(path, args.skip_invalid, settings.max_url_bytes)
    counts = await run_job(
        settings,
        path,
        job,
        spec,
        fetchers=args.fetchers,
        attach=args.attach,
        timeout=args.timeout,
        out=Path(args.out) if args.out else None,
        verbose=args.verbose,
        tier_floor=args.tier_floor,
        weight=args.weight,
    )
    return 0 if counts.done else 1


def cmd_dlq(args: argparse.Namespace) -> int:
    settings = _settings()
    try:
        code: int = args.dlq_run(settings, args)
    except (LookupError, PermissionError) as exc:
        raise UserError(str(exc)) from None
    except BrokerUnreachable as exc:
        raise UserError(f"{exc}. Start RabbitMQ (`make broker`) or set HUTCH_AMQP_URL.") from None
    return code


def sandbox_package() -> Any:
    """The sandbox, a distribution of its own (`sandbox/` in the repository, which `make`
    installs), kept out of Hutch's wheel and image: a deployed Hutch never serves fake sites."""
    try:
        import hutch_sandbox
    except ImportError:
        raise UserError(
            "the sandbox is not installed: it is the distribution `hutch-sandbox` in the repository's "
            "sandbox/ folder (pip install -e ./sandbox; make does it)"
        ) from None
    return hutch_sandbox


def cmd_jobs_delete(args: argparse.Namespace) -> int:
    """Remove a done job from the store: its tasks, items, attempts and dead letters."""
    settings = _settings()
    if settings.api_url:
        _print_deleted(args.job, overapi.delete(settings, args.job))
        return 0
    store = _open_store(settings)
    try:
        found = store.counts(args.job)
        if not found and not store.job_exists(args.job):
            raise UserError(f"no job named {args.job!r} in the store")
        if found and not found[0].done:
            raise UserError(
                f"job {args.job!r} has {found[0].pending} tasks pending: wait for it, or cancel it first "
                f"(hutch cancel {args.job})"
            )
        gone = store.delete_job(args.job) or {}
    finally:
        store.close()
    _print_deleted(args.job, gone)
    return 0


def _print_deleted(job: str, gone: dict[str, int]) -> None:
    print(
        f"deleted job {job}: {gone.get('tasks', 0)} tasks, {gone.get('items', 0)} items, "
        f"{gone.get('attempts', 0)} attempts, {gone.get('dead', 0)} dead letters",
        file=sys.stderr,
    )


def cmd_store_copy(args: argparse.Namespace) -> int:
    try:
        storecopy.run(_settings(), args.to, force=args.force)
    except storecopy.CopyRefused as exc:
        raise UserError(str(exc)) from None
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    if bool(args.task_id) == bool(args.job and args.url) or bool(args.job) != bool(args.url):
        raise UserError("give a task id, or --job and --url (not both)")
    settings = _settings()
    try:
        return timeline.run(settings, args)
    except LookupError as exc:
        raise UserError(str(exc)) from None


async def cmd_watch(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.window < args.interval:
        raise UserError("--interval must be above 0 and --window at least --interval")
    if (args.json or args.exit_code) and not args.once:
        raise UserError("--json and --exit-code go with --once")
    return await watch.run(_settings(), args)


def cmd_sandbox(args: argparse.Namespace) -> int:
    sandbox = sandbox_package()
    try:
        sandbox.load_config(args.config)  # refuse a bad config before binding anything
    except OSError as exc:
        raise UserError(f"cannot read sandbox config {args.config}: {exc.strerror}") from None
    except sandbox.ConfigError as exc:
        raise UserError(str(exc)) from None
    sandbox.run_forever(args.config, args.urls_out, args.proxies_out, args.access_log)
    return 0


# -- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hutch",
        description="Hutch: a scraping job system of small services on RabbitMQ. "
        "Settings come from HUTCH_* environment variables (see the README).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="run every service as a child process (Ctrl-C stops all)")
    p.add_argument("--fetchers", type=int, default=1, help="fetcher processes (default 1)")
    p.add_argument("--rate", type=_rate, help="fetches per second per domain, e.g. 2/s")
    _limit_args(p)
    p.set_defaults(run=cmd_up, is_async=True)

    p = sub.add_parser("serve", help="run one service (what a container runs)")
    p.add_argument("name", choices=ALL, help="the service")
    p.set_defaults(run=cmd_serve, is_async=False)

    def job_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("urls_file", help="a file with one URL a line (# comments and blank lines skipped)")
        p.add_argument("--job", help="job name (default: the file's name without extension)")
        p.add_argument("--spec", help="YAML spec of the fields to extract (default url, status, title)")
        p.add_argument("--skip-invalid", action="store_true", help="submit the valid lines, list the rest")
        p.add_argument(
            "--tier-floor",
            choices=TIERS,
            help="the cheapest proxy tier this job may use (default: the proxy-manager decides per domain)",
        )
        p.add_argument(
            "--weight",
            type=_weight,
            help="the job's share of each domain's rate against other jobs there (above 0, at most 1000; default 1)",
        )

    p = sub.add_parser("submit", help="submit a URL file as a job to running services")
    job_args(p)
    p.set_defaults(run=cmd_submit, is_async=True)

    p = sub.add_parser("status", help="stored, dead, pending and in-flight tasks per job")
    p.add_argument("job", nargs="?", help="one job (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--domains", action="store_true", help="the top domains: rate, pause, held tasks (asks the governors)"
    )
    p.add_argument("--top", type=_top, help=f"with --domains: rows shown (default {DEFAULT_TOP})")
    p.add_argument(
        "--sort",
        choices=SORT_KEYS,
        help="with --domains: order by this, largest first (name: alphabetical; default held)",
    )
    p.add_argument(
        "--match", type=_pattern, metavar="PATTERN", help="with --domains: domains matching a glob (*.shop.example)"
    )
    p.add_argument("--paused", action="store_true", help="with --domains: only domains paused now")
    p.set_defaults(run=cmd_status, is_async=False)

    for action, text in (
        ("pause", "pause a job: its tasks wait without holding messages (those in flight finish)"),
        ("resume", "resume a paused job"),
        ("cancel", "cancel a job: its tasks end dead as `cancelled` (those in flight finish)"),
    ):
        p = sub.add_parser(action, help=text)
        p.add_argument("job", help="the job's name")
        if action == "resume":
            p.add_argument(
                "--budget", type=_budget, metavar="B", help="the job's proxy budget from now on (above what it spent)"
            )
        p.set_defaults(run=cmd_control, is_async=True)
    p = sub.add_parser("weight", help="set a job's share of each domain's rate (default 1)")
    p.add_argument("job", help="the job's name")
    p.add_argument("weight", type=_weight, help="above 0, at most 1000")
    p.set_defaults(run=cmd_control, is_async=True)

    p = sub.add_parser("run", help="start the services, run a job to the end, export its items")
    job_args(p)
    p.add_argument("--rate", type=_rate, help="fetches per second per domain, e.g. 2/s")
    _limit_args(p)
    p.add_argument("--proxies", help="proxy file: a proxy URL a line, optional tier word after it")
    p.add_argument("--fetchers", type=int, default=1, help="fetcher processes (default 1)")
    p.add_argument("--out", help="JSONL file for the items (default <data dir>/<job>.jsonl)")
    p.add_argument("--attach", action="store_true", help="use services already running")
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    p.add_argument("--verbose", action="store_true", help="show the services' logs")
    p.set_defaults(run=cmd_run, is_async=True)

    p = sub.add_parser("export", help="write a job's items as JSON lines or CSV, streamed")
    p.add_argument("job")
    p.add_argument("--out", help="file (default: standard output)")
    p.add_argument(
        "--format", choices=exports.FORMATS, help="jsonl (default) or csv (the default for an --out ending in .csv)"
    )
    p.set_defaults(run=cmd_export, is_async=False)

    p = sub.add_parser("reparse", help="extract a job's archived pages again with a new spec; fetches nothing")
    p.add_argument("job")
    p.add_argument("--spec", help="spec YAML (default: the job's own)")
    p.add_argument("--follow", action="store_true", help="offer each page's links again (a crawl's follow: rules)")
    p.set_defaults(run=cmd_reparse, is_async=True)

    p = sub.add_parser("sandbox", help="serve the local test sites and proxies (loopback only)")
    p.add_argument("--config", help="sandbox YAML (default: the bundled one)")
    p.add_argument("--urls-out", help="write the URL list here")
    p.add_argument("--proxies-out", help="write the proxy file here")
    p.add_argument("--access-log", help="append every request as JSON lines here")
    p.set_defaults(run=cmd_sandbox, is_async=False)

    dlq.add_parser(sub)
    sub.choices["dlq"].set_defaults(run=cmd_dlq, is_async=False)
    watch.add_parser(sub).set_defaults(run=cmd_watch, is_async=True)
    timeline.add_parser(sub).set_defaults(run=cmd_trace, is_async=False)
    p = sub.add_parser("jobs", help="manage jobs in the store")
    jobs_sub = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    d = jobs_sub.add_parser("delete", help="remove a done (or cancelled) job: its tasks, items, attempts, dead letters")
    d.add_argument("job", help="the job's name")
    d.set_defaults(run=cmd_jobs_delete, is_async=False)
    p = sub.add_parser("store", help="manage the store itself")
    store_sub = p.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    c = store_sub.add_parser(
        "copy", help="copy this store (HUTCH_STORE_URL) into an empty one, e.g. SQLite to PostgreSQL; services stopped"
    )
    c.add_argument("--to", required=True, metavar="URL", help="the target store: postgresql://... or sqlite:///...")
    c.add_argument("--force", action="store_true", help="copy even though a storer seems to be consuming")
    c.set_defaults(run=cmd_store_copy, is_async=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], Any] = args.run
    if args.command in ("submit", "run"):
        telemetry.setup_tracing("control")  # each submitted task starts its own trace here
    try:
        code = asyncio.run(run(args)) if args.is_async else run(args)
    except UserError as exc:
        print(f"hutch: {shown(exc)}", file=sys.stderr)
        code = 2
    except PublishFailed as exc:
        print(f"hutch: the broker did not accept the work: {shown(exc)}", file=sys.stderr)
        code = 2
    except (StoreError, RemoteError) as exc:
        print(f"hutch: {shown(exc)}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    raise SystemExit(code)
