"""The API's routes: what the CLI does on jobs, over HTTP, with a generated OpenAPI document.

Every route but the probes, `/metrics` and `/openapi.json` needs `Authorization: Bearer
<HUTCH_API_TOKEN>` when a token is set (the service refuses to listen beyond loopback
without one). Errors are JSON, `{"error": "...", "field": "..."}`, with a 4xx status: 400
for a request that names a bad value (the field says which: `job`, `spec`, `urls[3]`,
`tier_floor`, `weight`), 401 without the token, 404 for a job, task or dead letter the store
does not know, 408 for a body that did not arrive within `HUTCH_API_BODY_TIMEOUT`, 409 for a
change the job's state forbids, 413 for a body over `HUTCH_API_MAX_BODY_BYTES` (`limits`), 503
when the broker or the store cannot be reached.

A submission is checked whole before anything is sent (every URL, the spec, the tier), then
goes on the intake queue in messages of up to 1,000 URLs, each confirmed by the broker, as
`hutch submit` does: a job is accepted whole or refused whole. URLs come inline (`POST
/jobs`, JSON) or streamed (`POST /jobs/{job}/urls`, multipart: a URL file as `hutch submit`
reads it, spooled to disk past 1 MiB, so memory stays flat for a file of any length up to the
body limit).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hutch.amqp import PublishFailed
from hutch.models import DEFAULT_TOP, MAX_TOP, SortKey, Spec, StatusRequest
from hutch.models import task_id as task_id_of
from hutch.request_options import redact
from hutch.services.api.limits import LimitBodies
from hutch.services.control import exports
from hutch.services.control.dlq import replay_with
from hutch.services.control.jobs import (
    Action,
    BudgetSpent,
    JobControlError,
    Known,
    append_control,
    check_control,
    control_record,
    known_in,
)
from hutch.services.control.submit import JobNameError, UrlFileError, check_job_name, check_urls, submissions
from hutch.services.control.submit import valid_urls as file_urls
from hutch.services.control.timeline import timeline
from hutch.services.governor.status import domain_report
from hutch.services.parser.spec import SpecError, parse_spec, spec_from_bytes
from hutch.services.proxy_manager.costs import cost_summary
from hutch.services.proxy_manager.pool import TIERS
from hutch.store import JobCounts, Store, StoreError, is_outage
from hutch.topology import INTAKE_KEY
from hutch.urls import InvalidURL, check_url

if TYPE_CHECKING:
    from hutch.services.api.app import Api

log = logging.getLogger(__name__)
MAX_INLINE_URLS = 100_000  # more go through the streamed route
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
MAX_STREAMS = 8  # item streams at once: each holds a thread and a store connection
ITEM_CHUNK = 500  # items per read from the store while streaming


class Refused(Exception):
    """A request the API answers with a 4xx (or 503): its status, message and field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSubmission(Strict):
    job: str = Field(description="the job's name: 1-100 letters, digits, '.', '_' or '-'")
    urls: list[str] = Field(min_length=1, max_length=MAX_INLINE_URLS, description="the URLs to fetch")
    spec: dict[str, Any] | None = Field(
        None, description="what to extract, as in a spec file: {'fields': {'title': 'css:title::text'}}"
    )
    tier_floor: str | None = Field(None, description="the cheapest proxy tier the job may use")
    weight: float | None = Field(None, description="the job's share of each domain's rate, set before any task is out")


class Submitted(Strict):
    job: str
    urls: int = Field(description="URLs sent (a repeat within a message of 1,000 goes once)")
    messages: int


class JobStatus(Strict):
    job: str
    total: int
    stored: int
    dead: int
    in_flight: int
    pending: int
    stalled: int
    rescued: int
    cancelled: int
    state: str
    weight: float
    finished: bool
    costs: list[dict[str, Any]] = Field(
        default_factory=list, description="requests and estimated proxy cost per domain and tier"
    )
    crawl: dict[str, int] | None = Field(
        None,
        description="a crawl's counts: links discovered, pages admitted, duplicates, over_depth, over_pages, depth",
    )
    budget: float | None = Field(None, description="the job's proxy budget (its spec's `budget:`), if any")
    spent: float = Field(0.0, description="what its proxied requests cost, counted while it has a budget")
    reason: str | None = Field(None, description="why it is paused when no person paused it: `budget`")


class Weight(Strict):
    weight: float


class Budget(Strict):
    budget: float = Field(description="the job's proxy budget from now on, in the proxies' cost units")


class DeadFilter(Strict):
    job: str | None = None
    domain: str | None = None
    reason: str | None = None


class ReplayRequest(DeadFilter):
    reset_attempts: bool = False


class PurgeRequest(DeadFilter):
    all: bool = Field(False, description="purge with no filter: every dead letter")


def status_of(row: JobCounts, costs: list[dict[str, Any]] | None = None) -> JobStatus:
    return JobStatus(**row.__dict__, finished=row.total > 0 and row.done, costs=costs or [])


def check_spec(spec: Spec | dict[str, Any] | None) -> Spec | None:
    if spec is None or isinstance(spec, Spec):
        return spec
    try:
        return parse_spec(spec)
    except (SpecError, ValidationError) as exc:
        raise Refused(400, f"invalid spec: {exc}", "spec") from None


def check_submission(job: str, tier_floor: str | None) -> None:
    try:
        check_job_name(job)
    except JobNameError as exc:
        raise Refused(400, str(exc), "job") from None
    if tier_floor is not None and tier_floor not in TIERS:
        raise Refused(400, f"tier_floor {tier_floor!r} is none of {', '.join(TIERS)}", "tier_floor")


def build(api: Api) -> FastAPI:
    """The application for `api`: the routes below, its error handlers, request counts."""
    app = FastAPI(
        title="Hutch",
        version="1",
        description="Submit scraping jobs, follow them, read their items, control them and replay their dead letters.",
        docs_url=None,  # the interactive pages load scripts from a CDN; /openapi.json is here
        redoc_url=None,
    )
    app.state.api = api
    app.state.token = api.settings.api_token.get_secret_value() if api.settings.api_token else None
    app.add_exception_handler(Refused, _refused)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(PublishFailed, _unpublished)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _failed)
    # Added before the request counter, so it runs inside it: the 413s and 408s are counted too.
    settings = api.settings
    app.add_middleware(LimitBodies, max_bytes=settings.api_max_body_bytes, timeout=settings.api_body_timeout)

    @app.middleware("http")
    async def count(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        template = getattr(request.scope.get("route"), "path", "unmatched")
        method = request.method if request.method in METHODS else "other"  # any token parses as a method
        api.metrics.api_requests.labels(template, method, str(response.status_code)).inc()
        return response

    app.include_router(probes)
    app.include_router(router, dependencies=[Depends(authorised)])
    return app


# -- errors ---------------------------------------------------------------------------------


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    return JSONResponse({"error": str(exc), "field": exc.field}, status_code=exc.status)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    field = _field(first.get("loc", ()))
    message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    return JSONResponse({"error": message, "field": field or None}, status_code=400)


async def _unpublished(request: Request, exc: PublishFailed) -> JSONResponse:
    return JSONResponse({"error": f"the broker did not take the message: {exc}", "field": None}, status_code=503)


bearer = HTTPBearer(auto_error=False, description="HUTCH_API_TOKEN, where the API has one")


async def _failed(request: Request, exc: Exception) -> JSONResponse:
    """A store that cannot be reached (or any outage of it) is 503, like a broker that refuses;
    anything else is a 500 whose detail stays in the log."""
    if is_outage(exc) or isinstance(exc, StoreError):
        return JSONResponse({"error": f"the store cannot be reached: {type(exc).__name__}", "field": None}, 503)
    log.exception("api: %s %s failed", request.method, request.url.path)
    return JSONResponse({"error": "internal error (see the API's log)", "field": None}, 500)


def authorised(request: Request, given: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    token: str | None = request.app.state.token
    if token is None:
        return
    if given is None or not hmac.compare_digest(given.credentials.encode(), token.encode()):
        raise Refused(401, "a bearer token is required (Authorization: Bearer $HUTCH_API_TOKEN)")


def _service(request: Request) -> Any:
    return request.app.state.api


# The running service (typed Any: FastAPI reads these annotations at run time).
Service = Annotated[Any, Depends(_service)]
probes = APIRouter()
router = APIRouter()


def _store(api: Api, fn: Callable[[Store], Any]) -> Any:
    return api.store.run(fn)


# -- probes and metrics ------------------------------------------------------------------------


@probes.get("/healthz", response_class=PlainTextResponse, include_in_schema=False)
async def healthz() -> str:
    return "ok\n"


@probes.get("/readyz", response_class=PlainTextResponse, include_in_schema=False)
async def readyz(api: Service) -> PlainTextResponse:
    if api.ready:
        return PlainTextResponse("ready\n")
    return PlainTextResponse("not ready: not connected to the broker\n", status_code=503)


@probes.get("/metrics", include_in_schema=False)
async def metrics(api: Service) -> Response:
    return Response(api.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


# -- jobs ----------------------------------------------------------------------------------------


async def _ready_to_submit(api: Api, job: str, weight: float | None) -> None:
    """Past `check_submission`: refuse a bad weight or a cancelled job, as `hutch submit`
    does; then the weight goes on the jobs stream before any task of the job is out."""
    record = None
    if weight is not None:
        try:
            record = control_record(job, "weight", weight)
        except JobControlError as exc:
            raise Refused(400, str(exc), "weight") from None
    found = await _store(api, lambda s: s.job_state(job))
    if found is not None and found[0] == "cancelled":
        raise Refused(409, f"job {job!r} is cancelled: its tasks would end dead at once; submit a new job", "job")
    if record is not None:
        await append_control(api.broker, record)


async def _publish(api: Api, job: str, urls: Iterator[str], spec: Spec | None, tier_floor: str | None) -> Submitted:
    sent = Submitted(job=job, urls=0, messages=0)
    for submission in submissions(job, urls, spec, tier_floor, api.settings.max_url_bytes):
        await api.broker.publish(api.broker.topology.work, INTAKE_KEY, submission)
        sent.urls += len(submission.urls)
        sent.messages += 1
    return sent


@router.post("/jobs", status_code=202, tags=["jobs"])
async def submit(api: Service, body: JobSubmission) -> Submitted:
    """Submit URLs inline. All are checked before any is sent: one bad URL refuses the whole job."""
    check_submission(body.job, body.tier_floor)
    spec = check_spec(body.spec)
    for i, url in enumerate(body.urls):
        try:
            check_url(url, api.settings.max_url_bytes)
        except InvalidURL as exc:
            raise Refused(400, f"urls[{i}]: {exc}", f"urls[{i}]") from None
    await _ready_to_submit(api, body.job, body.weight)
    return await _publish(api, body.job, iter(body.urls), spec, body.tier_floor)


@router.post("/jobs/{job}/urls", status_code=202, tags=["jobs"])
async def submit_file(
    api: Service,
    job: str,
    urls: Annotated[UploadFile, File(description="a URL file: one URL a line, '#' comments, as hutch submit")],
    spec: Annotated[str | None, Form(description="a spec file's text (YAML or JSON)")] = None,
    tier_floor: Annotated[str | None, Form()] = None,
    weight: Annotated[float | None, Form()] = None,
) -> Submitted:
    """Submit a URL file of any length, streamed. The file is checked whole first, then sent."""
    check_submission(job, tier_floor)
    parsed: Spec | None = None
    if spec is not None:
        try:
            parsed = spec_from_bytes(spec.encode(), "spec")
        except SpecError as exc:
            raise Refused(400, str(exc), "spec") from None
    limit = api.settings.max_url_bytes
    with tempfile.TemporaryDirectory(prefix="hutch-api-") as folder:
        path = Path(folder) / "urls.txt"
        with path.open("wb") as out:
            while chunk := await urls.read(1 << 20):
                out.write(chunk)
        try:
            await asyncio.to_thread(check_urls, path, False, limit)
        except UrlFileError as exc:
            raise Refused(400, str(exc).replace(str(path), "urls"), "urls") from None
        await _ready_to_submit(api, job, weight)
        return await _publish(api, job, file_urls(path, limit), parsed, tier_floor)


@router.get("/jobs", tags=["jobs"])
async def jobs(api: Service) -> list[JobStatus]:
    """Every job's counts, as `hutch status`."""
    rows, costs = await _store(api, lambda s: (s.counts(), cost_summary(s)))
    return [status_of(row, [c for c in costs if c["job"] == row.job]) for row in rows]


async def _counts_of(api: Api, job: str) -> JobCounts:
    rows: list[JobCounts] = await _store(api, lambda s: s.counts(job))
    if not rows:
        raise Refused(404, f"no job named {job!r} in the store", "job")
    return rows[0]


@router.get("/jobs/{job}", tags=["jobs"])
async def job_status(api: Service, job: str) -> JobStatus:
    row = await _counts_of(api, job)
    return status_of(row, await _store(api, lambda s: cost_summary(s, job)))


@router.get(
    "/jobs/{job}/items",
    tags=["jobs"],
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "one item a line"}},
)
async def items(api: Service, job: str, format: Literal["jsonl", "csv"] = "jsonl") -> StreamingResponse:
    """A job's items as JSON lines (or CSV: `url`, the spec's fields, then any other key, with
    a header row), streamed from the store in constant memory."""
    if not await _store(api, lambda s: s.job_exists(job)):
        raise Refused(404, f"no job named {job!r} in the store", "job")
    if api.streams.locked():
        raise Refused(503, f"{MAX_STREAMS} item streams are being read already; try again shortly")
    await api.streams.acquire()
    media = "text/csv; charset=utf-8" if format == "csv" else "application/x-ndjson"
    reader = _stream_items(api.settings.store_location, job, format, api.streams.release)
    return StreamingResponse(reader, media_type=media)


def _remove(job: str) -> Callable[[Store], dict[str, int] | None]:
    def remove(s: Store) -> dict[str, int] | None:
        found = s.counts(job)
        if not found and not s.job_exists(job):
            return None
        if found and not found[0].done:
            pending = found[0].pending
            raise Refused(409, f"job {job!r} has {pending} tasks pending: wait for it, or cancel it first", "job")
        return s.delete_job(job) or {}

    return remove


@router.delete("/jobs/{job}", tags=["jobs"])
async def delete(api: Service, job: str) -> dict[str, int]:
    """Remove a done or cancelled job: its tasks, items, attempts and dead letters."""
    gone = await _store(api, _remove(job))
    if gone is None:
        raise Refused(404, f"no job named {job!r} in the store", "job")
    return dict(gone)


async def _control(
    api: Api, job: str, action: Action, weight: float | None = None, budget: float | None = None
) -> JobStatus:
    try:
        record = control_record(job, action, weight, budget)
    except JobNameError as exc:
        raise Refused(400, str(exc), "job") from None
    except JobControlError as exc:
        raise Refused(400, str(exc), "weight" if budget is None else "budget") from None
    known: Known = await _store(api, lambda s: known_in(s, job))
    try:
        check_control(job, action, known, budget)
    except JobControlError as exc:
        where = "budget" if isinstance(exc, BudgetSpent) else "job"
        raise Refused(409 if known.exists else 404, str(exc), where) from None
    await append_control(api.broker, record)
    await _store(api, lambda s: s.apply_job_control(record))  # the storer will too: idempotent
    return status_of(await _counts_of(api, job))


@router.post("/jobs/{job}/pause", tags=["controls"])
async def pause(api: Service, job: str) -> JobStatus:
    """Hold the job's tasks aside; the governors release none of them until resumed."""
    return await _control(api, job, "pause")


@router.post("/jobs/{job}/resume", tags=["controls"])
async def resume(api: Service, job: str, body: Annotated[Budget | None, Body()] = None) -> JobStatus:
    """Release the job's tasks again. A job paused because its proxy budget is spent (`reason`
    `budget`) needs a new `budget`, above what it spent (409 otherwise)."""
    return await _control(api, job, "resume", budget=body.budget if body is not None else None)


@router.post("/jobs/{job}/cancel", tags=["controls"])
async def cancel(api: Service, job: str) -> JobStatus:
    """End the job: its tasks end dead as `cancelled` where they surface."""
    return await _control(api, job, "cancel")


@router.put("/jobs/{job}/weight", tags=["controls"])
async def set_weight(api: Service, job: str, body: Weight) -> JobStatus:
    """The job's share of each domain's rate against the other jobs there (default 1)."""
    return await _control(api, job, "weight", body.weight)


# -- dead letters --------------------------------------------------------------------------------


@router.get("/dead", tags=["dead letters"])
async def dead(
    api: Service,
    job: str | None = None,
    domain: str | None = None,
    reason: str | None = None,
    stage: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> dict[str, Any]:
    """Dead letters neither replayed nor purged: counts by reason and domain, then the oldest entries."""
    groups = await _store(api, lambda s: s.dead_groups(job, domain, reason))
    entries = await _store(api, lambda s: s.dead_entries(job, domain, reason, stage, limit))
    return {"groups": groups, "entries": entries}


@router.get("/dead/{entry_id}", tags=["dead letters"])
async def dead_entry(api: Service, entry_id: int) -> dict[str, Any]:
    """One dead letter whole, with the task's attempt history (a spec's header and cookie
    values redacted: they may be credentials)."""
    entry = await _store(api, lambda s: s.dead_entry(entry_id))
    if entry is None:
        raise Refused(404, f"no dead letter with id {entry_id}", "entry_id")
    shown: dict[str, Any] = redact({**entry, "letter": json.loads(entry["letter"])})
    return shown


@router.post("/dead/replay", tags=["dead letters"])
async def replay(api: Service, body: ReplayRequest) -> dict[str, int]:
    """Republish matching dead letters (confirmed), each marked replayed once the broker has it."""
    filters = {"job": body.job, "domain": body.domain, "reason": body.reason}
    async with api.replaying:
        replayed, skipped = await replay_with(api.broker, api.store.run, filters, body.reset_attempts)
    return {"replayed": replayed, "skipped": skipped}


@router.post("/dead/purge", tags=["dead letters"])
async def purge(api: Service, body: PurgeRequest) -> dict[str, int]:
    """Drop matching dead letters from the ledger. With no filter, `all` must be true."""
    if body.job is None and body.domain is None and body.reason is None and not body.all:
        raise Refused(400, "no filter given: name a job, domain or reason, or set all to true", "all")

    def drop(s: Store) -> int:
        return s.mark_purged(entry["id"] for entry in s.dead_entries(body.job, body.domain, body.reason))

    return {"purged": await _store(api, drop)}


# -- domains and traces ----------------------------------------------------------------------------


@router.get("/domains", tags=["domains"])
async def domains(
    api: Service,
    top: Annotated[int, Query(ge=1, le=MAX_TOP)] = DEFAULT_TOP,
    sort: SortKey = "held",
    match: str | None = None,
    paused_only: bool = False,
) -> dict[str, Any]:
    """Per-domain state from the running governors: rate, ceiling, pause, held and parked tasks."""
    try:
        request = StatusRequest(top=top, sort=sort, match=match, paused_only=paused_only)
    except ValidationError as exc:
        where = _field(exc.errors()[0]["loc"])
        raise Refused(400, f"{where}: {exc.errors()[0]['msg']}", where) from None
    report = await domain_report(api.broker, request)
    frontier = report.frontier
    return {
        "total_domains": report.total,
        "governors": report.governors,
        "frontier": {"waiting": frontier.waiting, "paused": frontier.paused, "shards": frontier.shards},
        "domains": report.rows,
    }


async def _trace_of(api: Api, wanted: str) -> dict[str, Any]:
    found = await _store(api, lambda s: s.timeline(wanted))
    if found is None:
        raise Refused(404, f"no task {wanted} in the store", "task_id")
    task = {k: v for k, v in found["task"].items() if k != "message"}
    return {"task": task, "timeline": timeline(found)}


@router.get("/tasks/{task_id}/trace", tags=["traces"])
async def trace(api: Service, task_id: str) -> dict[str, Any]:
    """A task's life: submit, each attempt, the item or the dead letter, with its trace id."""
    return await _trace_of(api, task_id)


@router.get("/trace", tags=["traces"])
async def trace_by_url(api: Service, job: str, url: str) -> dict[str, Any]:
    """The same, for the task of `url` in `job`."""
    return await _trace_of(api, task_id_of(job, url))


def _field(loc: Any) -> str:
    """A validation error's location as the request names it: `urls[3]`, `weight`, `top`."""
    parts = [p for p in loc if p not in ("body", "query", "path", "form")]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _read_items(
    location: str, job: str, form: str, put: Callable[[bytes | BaseException | None], None], stop: threading.Event
) -> None:
    """On a thread of its own: the job's items as chunks of lines (JSON or CSV) through `put`,
    then None (or the error); returns early once `stop` is set (the client went away)."""
    try:
        store = Store(location)
        try:
            lines: list[str] = []
            for line in exports.lines(store, job, form):
                if stop.is_set():
                    return
                lines.append(line)
                if len(lines) >= ITEM_CHUNK:
                    put("".join(lines).encode())
                    lines = []
            if lines:
                put("".join(lines).encode())
        finally:
            store.close()
        put(None)
    except BaseException as exc:  # handed to the response, which ends the stream
        if not stop.is_set():
            put(exc)


async def _stream_items(location: str, job: str, form: str, done: Callable[[], None]) -> AsyncIterator[bytes]:
    """The job's items as JSON lines, read with a store of their own (a long read must not
    hold the API's store), at most a few chunks ahead of the client; `done` at the end."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
    stop = threading.Event()

    def put(value: bytes | BaseException | None) -> None:
        asyncio.run_coroutine_threadsafe(queue.put(value), loop).result()

    threading.Thread(target=_read_items, args=(location, job, form, put, stop), name="items", daemon=True).start()
    try:
        while (chunk := await queue.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        stop.set()
        while not queue.empty():  # a reader blocked on a full queue then sees `stop`
            queue.get_nowait()
        done()
