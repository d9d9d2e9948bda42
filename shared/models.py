"""The messages Hutch services exchange, as versioned pydantic models encoded as JSON (a page
as a line of JSON, then its text: `Page.split_form`).

Every message carries `v`, its schema version; a body that is not JSON, does not match its
model or names an unknown version fails `decode` with `DecodeError`, which the consumer
wrapper turns into a dead letter with reason `decode` (never a crash loop).

The schema evolves so that old and new services can run side by side during a rollout
(docs/messages.md): a field may be added, optional and with a default, without a new version.
A service that does not know it reads the message as before and keeps the field when it
passes the message on (`extra="allow"`: a task retried by an old fetcher still carries what
a new parser wants). Removing, renaming or retyping a field, or making one required, is a
breaking change: it raises `v`, and a service that does not know the version refuses the
message as `decode`, saying which version it got and which it reads; the letter can be
replayed once the service is upgraded. JSON and not
pickle: messages cross process and language boundaries and are read back from the DLQ.
The attempt count lives here, in the task, and not in RabbitMQ's `x-death` header, whose
semantics changed across broker versions.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any, Literal, TypeVar, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

from hutch.request_options import check_options

SCHEMA_VERSION = 1


class Model(BaseModel):
    """A message on the wire. What the AMQP layer asks of every message it consumes is here:
    which task it is about, and the letter it becomes when it is finished for good."""

    # Unknown fields are kept, not refused: they are a newer producer's additions (see above).
    model_config = ConfigDict(extra="allow")

    def subject(self) -> str | None:
        """The id of the task this message is about (span attributes, logs); None when none."""
        task = getattr(self, "task", None)
        if isinstance(task, Model):
            return task.subject()
        found = getattr(self, "task_id", None)
        return found if isinstance(found, str) else None

    def trace(self) -> str | None:
        """The trace id (32 hex digits) of the task this message is about: every span about a
        task goes into the task's one trace. None when it is about no task."""
        task = getattr(self, "task", None)
        return task.trace() if isinstance(task, Model) else None

    def span_attributes(self) -> dict[str, str | int]:
        """What every span and log line about this message carries: the task's job, id,
        domain and attempt (just the id, or nothing, when that is all there is)."""
        task = getattr(self, "task", None)
        if isinstance(task, Model):
            return task.span_attributes()
        subject = self.subject()
        return {"hutch.task.id": subject} if subject else {}

    def dead_letter(self, stage: str, reason: str, detail: str = "", queue: str | None = None) -> DeadLetter:
        """This message finished for good at `stage`, as the dead exchange takes it."""
        return DeadLetter.of(stage, reason, detail, about=self, queue=queue)

    def dead_letters(self, stage: str, reason: str, detail: str = "", queue: str | None = None) -> list[DeadLetter]:
        """The letters this message becomes: one, unless it carries many tasks (`Parked`)."""
        return [self.dead_letter(stage, reason, detail, queue)]

    @staticmethod
    def undecodable_letter(stage: str, reason: str, detail: str, raw: bytes, queue: str | None = None) -> DeadLetter:
        """The letter of a body that is no message at all: kept raw."""
        return DeadLetter.of(stage, reason, detail, raw=raw, queue=queue)


class DecodeError(ValueError):
    """A message body that is not a valid message of the expected kind and version."""


M = TypeVar("M", bound=BaseModel)


def encode(message: Model) -> bytes:
    if isinstance(message, Page):
        return message.split_form()
    return message.model_dump_json(exclude_none=True).encode()


def content_type(message: Model | bytes) -> str:
    """The AMQP content type of `message` as `encode` makes it (raw bytes: JSON, as before)."""
    return PAGE_CONTENT_TYPE if isinstance(message, Page) else "application/json"


def decode(body: bytes, model: type[M]) -> M:
    try:
        if model is Page and body.startswith(SPLIT_PREFIX):
            return cast(M, Page.from_split_form(body))
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        if first["loc"] and first["loc"][-1] == "v" and first["type"] == "literal_error":
            raise DecodeError(
                f"a {model.__name__} of schema version {str(first.get('input'))[:20]!r} at {where}: this Hutch "
                f"reads version {SCHEMA_VERSION}; upgrade it, then replay the letter"
            ) from None
        raise DecodeError(f"not a {model.__name__} v{SCHEMA_VERSION}: {where}: {first['msg']}") from None


def new_trace_id() -> str:
    """A W3C trace id: 32 lower-case hex digits, not all zero."""
    return f"{secrets.randbits(128) or 1:032x}"


TRACE_ID = r"^[0-9a-f]{32}$"
SPAN_ID = r"^[0-9a-f]{16}$"


def task_id(job: str, url: str) -> str:
    """Stable id of a URL within a job, so submitting a job twice never stores a URL twice."""
    return hashlib.sha256(f"{job}\n{url}".encode()).hexdigest()[:32]


class Permit(Model):
    """The governor's permission to fetch once: a fetcher honours it only before `expires`, not
    before `not_before` (None: at once), and only within `late_after` seconds of that moment.
    Both moments are on the governor's clock, and a fetcher reads them against the quickest
    a permit of this governor has reached it, so the two hosts' clocks need not agree (see
    `hutch.services.fetcher.lateness`)."""

    id: str
    issued: float
    expires: float
    late_after: float | None = None
    not_before: float | None = None


# What one fetch attempt came to: the keys of the failure policy's rules, what proxy health
# and the cost report read. Events and a task's history also name why a task went back
# unspent (`permit_late`, `no_proxy`...), so their `outcome` fields are plain text.
Outcome = Literal[
    "ok", "timeout", "reset", "proxy_failure", "blocked", "throttled", "server_error", "redirect",
    "not_found", "client_error", "too_large", "bad_encoding", "redirects", "invalid_url", "forbidden_target",
    "crashed", "error",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
_OUTCOME_BY_NAME: dict[str, Outcome] = {outcome: outcome for outcome in OUTCOMES}


def attempt_outcome(text: str | None) -> Outcome | None:
    """`text` as an attempt's `Outcome`, or None when it names something else."""
    return _OUTCOME_BY_NAME.get(text or "")


# Outcomes of events after which no request went out, even with a proxy leased: they cost
# nothing (the cost report and a job's proxy budget leave them out).
NO_REQUEST = (
    "forbidden_target",
    "invalid_url",
    "permit_expired",
    "permit_late",
    "redelivered",
    "no_lease",
    "no_proxy",
    "never_sent",
    "stored_already",
)
MAX_BUDGET = 1e12  # a job's proxy budget, in the pool's cost units


class Attempt(Model):
    """One attempt in a task's history. `proxy_id` is an id, never a proxy URL."""

    n: int
    at: float
    outcome: str
    status: int | None = None
    proxy_id: str | None = None
    tier: str | None = None
    elapsed: float = 0.0
    delay: float | None = None
    spent: bool = True
    detail: str | None = None
    # The attempt's fetch span (with tracing on): the next attempt's span links to it.
    span_id: str | None = Field(None, pattern=SPAN_ID)


class FieldRule(Model):
    """One field to extract: a CSS or XPath expression on the page's HTML, or a JMESPath
    expression on its JSON; the first match, or all with `many`. `re`, with CSS or XPath
    only, filters the matches through a regular expression (parsel's `.re()`)."""

    kind: Literal["css", "xpath", "jmespath"]
    expr: str
    many: bool = False
    re: str | None = None


ItemType = Literal["string", "number", "integer", "boolean", "list", "object"]


class ItemField(Model):
    """What one field of an item must hold: a JSON type, and whether null is refused."""

    type: ItemType
    required: bool = False


class FollowRule(Model):
    """Links a crawl follows from each page (see `hutch.services.parser.links`): the strings
    `links` selects, resolved; kept if `allow` is empty or one of them matches, none of `deny`
    does, and (with `same_domain`) they stay in the page's domain."""

    links: FieldRule
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    same_domain: bool = True


class Spec(Model):
    """What to extract from a page, by field name (see `hutch.services.parser.spec`), and
    optionally the types the item's fields must have (`item`, checked after extraction).

    With `follow`, the job is a crawl: the links each page offers become tasks of the job, at
    most `max_depth` links away from a submitted URL and `max_pages` tasks in all.

    `headers` and `cookies` go with every fetch of the job's pages (`hutch.request_options`,
    which checks them here too, so a hand-made intake message meets the spec file's rules);
    `budget` is the job's proxy cost budget: it pauses once its spend reaches it."""

    # A value a validation error would show may be a credential: errors name the key only.
    model_config = ConfigDict(extra="allow", hide_input_in_errors=True)

    fields: dict[str, FieldRule]
    item: dict[str, ItemField] | None = None
    follow: list[FollowRule] = Field(default_factory=list)
    max_depth: int | None = None
    max_pages: int | None = None
    # Keep every fetched page's body (compressed, once per content) for `hutch reparse`.
    archive: bool = False
    headers: dict[str, str] | None = None
    cookies: dict[str, str] | None = None
    budget: float | None = Field(None, gt=0, le=MAX_BUDGET, allow_inf_nan=False)

    @model_validator(mode="after")
    def _request_options(self) -> Spec:
        if self.headers or self.cookies:
            headers, cookies = check_options(self.headers, self.cookies)  # values stripped as sent
            self.headers, self.cookies = headers or None, cookies or None
        return self


class Task(Model):
    v: Literal[1] = 1
    id: str
    job: str
    url: str
    domain: str
    # `robots`: the governor's fetch of a site's robots.txt; its result goes back to the
    # governors as an event instead of to the parser.
    purpose: Literal["page", "robots"] = "page"
    spec: Spec | None = None
    tier_floor: str | None = None  # the cheapest proxy tier this job may use
    # After a redirect the task fetches `fetch_url` (in `domain`, which follows it) while
    # `url`, the URL submitted, stays its identity.
    fetch_url: str | None = None
    redirects: int = 0
    submitted_at: float = Field(default_factory=time.time)
    attempts: int = 0
    history: list[Attempt] = Field(default_factory=list)
    failed_proxies: list[str] = Field(default_factory=list)
    permit: Permit | None = None
    # Times a fetcher gave it back to the frontier unsent (permit expired or late, no
    # lease): no attempt is spent, so this is what bounds a task that never gets sent.
    returns: int = 0
    # Raised each time the reconciler republishes a lost task: a copy with a lower number
    # is stale and is dropped where it surfaces (governor, storer), so a rescue never
    # leaves two live copies.
    incarnation: int = 0
    # Out of a `Parked` that a governor died holding (`x-hutch-crashes`): that governor may
    # have released this task, or parked it again, before it died, so another copy of it may
    # have been fetched and stored already. The fetcher asks the store first.
    maybe_done: bool = False
    # One trace per task, whatever the exporter: spans about the task go into it, and each
    # attempt in the store records it (`hutch trace`), with tracing on or off.
    trace_id: str = Field(default_factory=new_trace_id, pattern=TRACE_ID)

    def subject(self) -> str | None:
        return self.id

    def trace(self) -> str | None:
        return self.trace_id

    def span_attributes(self) -> dict[str, str | int]:
        return {"hutch.job": self.job, "hutch.task.id": self.id, "hutch.domain": self.domain,
                "hutch.attempt": self.attempts}


MAX_PARKED = 256  # tasks in one park message, at most


class Parked(Model):
    """Tasks the governor parked together: one message instead of one per task.

    Parks are most of a frontier's messages when a domain's backlog is larger than what the
    governor holds: each task parked alone cost a publish, a delay queue, a dead-lettering and
    a delivery, about two a small page (docs/benchmarks.md, eighth round). The governor
    gathers the tasks it parks into the same delay queue, due back in the same second, for
    the same domain, for a few milliseconds, and parks them as one of these. Back in a shard,
    each task is held or parked again as if it came alone; the message is acked once every
    one of them has been released, parked again or ended. It is dead only as a whole (a
    governor that dies holding it every time, a body that does not decode): then each task
    becomes a dead letter of its own (`dead_letters`), and a replay sends each back alone.
    """

    v: Literal[1] = 1
    tasks: list[Task] = Field(min_length=1, max_length=MAX_PARKED)

    @property
    def domain(self) -> str:
        """The domain of its tasks (the governor parks one domain's tasks together)."""
        return self.tasks[0].domain

    def span_attributes(self) -> dict[str, str | int]:
        return {"hutch.domain": self.domain, "hutch.parked": len(self.tasks)}

    def dead_letters(self, stage: str, reason: str, detail: str = "", queue: str | None = None) -> list[DeadLetter]:
        return [task.dead_letter(stage, reason, detail, queue) for task in self.tasks]


MAX_SUBMISSION_URLS = 1000  # URLs in one intake message: a big file goes as many messages


class Submission(Model):
    """URLs of one job submitted through the broker (`intake`: exchange `work`, key `intake`).

    Any AMQP client can send one: `{"v": 1, "job": "catalogue", "urls": ["https://..."]}`,
    optionally with `spec` (the fields to extract) and `tier_floor`. The storer records the
    tasks, then publishes them to the frontier, with a confirm at each step; a URL already
    recorded for the job is not published again. A submission is taken whole or refused
    whole: one invalid URL, a bad job name or an unknown `tier_floor` makes it dead (`invalid_submission`), naming it.
    """

    v: Literal[1] = 1
    job: str
    urls: list[str] = Field(min_length=1, max_length=MAX_SUBMISSION_URLS)
    spec: Spec | None = None
    tier_floor: str | None = None


class Page(Model):
    """A fetched page on its way to the parser."""

    v: Literal[1] = 1
    task: Task
    status: int
    final_url: str
    content_type: str | None = None
    text: str
    fetched_at: float
    # A crawl's page whose body is a gzip file (`sitemap.xml.gz`): binary, so no text carries it.
    # The body itself, base64, for the parser to inflate (under the body cap); `text` is empty.
    gzip_body: str | None = None

    def split_form(self) -> bytes:
        """The page as it crosses the broker (`encode`): its other fields as one line of JSON
        whose `v` is 2, a newline, then its text as UTF-8. JSON never holds a raw newline, so
        the first one ends the line. The text is most of a page (about 100 KB of HTML against
        1-2 KB of task), and inside JSON every quote, backslash and newline of it is escaped
        by the fetcher and unescaped by the parser: 0.29 ms of CPU a ~100 KB page, a copy
        now (docs/benchmarks.md, fourteenth round). Inside a dead letter a page stays JSON,
        version 1. A text UTF-8 cannot hold (a lone surrogate, which no decoded body has)
        raises UnicodeEncodeError, as JSON would."""
        head = self.model_dump_json(exclude_none=True, exclude={"text"}).encode()
        assert head.startswith(FIRST_PREFIX)  # `v` is declared first
        return SPLIT_PREFIX + head[len(FIRST_PREFIX) :] + b"\n" + self.text.encode("utf-8")

    @classmethod
    def from_split_form(cls, body: bytes) -> Page:
        """A page read from `split_form` (its body starts with `SPLIT_PREFIX`): the line read
        as JSON exactly as a page's first form is, then the text put in."""
        head, newline, text = body.partition(b"\n")
        if not newline or not head.endswith(b"}"):
            raise DecodeError("not a Page v2: no line of fields ended by a newline before its text")
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not a Page v2: its text is not UTF-8 ({exc.reason} at byte {exc.start})") from None
        page = cls.model_validate_json(FIRST_PREFIX + head.removeprefix(SPLIT_PREFIX)[:-1] + b',"text":""}')
        page.text = decoded
        return page


# How a page's JSON starts, in the first form and in the split one (`Page.split_form`).
FIRST_PREFIX = b'{"v":1,'
SPLIT_PREFIX = b'{"v":2,'
# A split page is no JSON document: its content type says so to anyone who looks at a queue.
PAGE_CONTENT_TYPE = "application/vnd.hutch.page"


class Item(Model):
    """Extracted fields on their way to the storer."""

    v: Literal[1] = 1
    task: Task
    status: int
    fields: dict[str, Any]
    parsed_at: float
    # A crawl's page: the links its spec's `follow:` rules found (absolute, checked, at most
    # HUTCH_MAX_LINKS_PER_PAGE), for the storer to admit. None: not a crawl.
    links: list[str] | None = None


class DeadLetter(Model):
    """Work that gave up, with the stage that gave up and why.

    `task` is absent only when the body could not be decoded at all; `raw` then holds it.
    """

    v: Literal[1] = 1
    stage: str
    reason: str
    detail: str = ""
    at: float = Field(default_factory=time.time)
    task: Task | None = None
    page: Page | None = None  # a page that failed to parse: replayed to the parser, not refetched
    raw: str | None = None
    queue: str | None = None

    @classmethod
    def of(
        cls,
        stage: str,
        reason: str,
        detail: str = "",
        *,
        about: Model | None = None,
        raw: bytes | None = None,
        queue: str | None = None,
    ) -> DeadLetter:
        """The letter of `about` (a task, a page, or any message carrying a task), or of a raw
        body. A page keeps its page, so a replay re-parses without a re-fetch; what carries no
        task is kept as its JSON."""
        page = about if isinstance(about, Page) else None
        task = about if isinstance(about, Task) else getattr(about, "task", None)
        if not isinstance(task, Task):
            task = None
        if task is None and raw is None and about is not None:
            raw = encode(about)
        return cls(
            stage=stage,
            reason=reason,
            detail=detail[:2000],
            task=task,
            page=page,
            raw=raw.decode("utf-8", "replace")[:65536] if raw is not None and task is None else None,
            queue=queue,
        )


class Event(Model):
    """A fact about one attempt, published on the events exchange.

    `released`: the governor gave the task a permit (it is now in flight).
    `outcome`: a fetcher finished an attempt; `next` says where the task went.
    Routing keys: `outcome.<domain>`; released events travel in an `EventBatch` (`released`).
    """

    v: Literal[1] = 1
    kind: Literal["released", "outcome"]
    task_id: str
    job: str
    domain: str
    attempt: int
    at: float = Field(default_factory=time.time)
    permit_id: str | None = None
    fetcher: str | None = None
    outcome: str | None = None
    status: int | None = None
    retry_after: float | None = None
    proxy_id: str | None = None
    tier: str | None = None
    cost: float | None = None
    elapsed: float | None = None
    next: Literal["parse", "retry", "dead", "frontier"] | None = None
    delay: float | None = None
    incarnation: int = 0  # of the task copy this event is about
    trace_id: str | None = Field(None, pattern=TRACE_ID)  # the task's (`outcome`)
    span_id: str | None = Field(None, pattern=SPAN_ID)  # the attempt's fetch span, when traced
    # `outcome`: the task as the fetcher routed it next (without its permit), so the store
    # keeps each task's latest message and the reconciler can rebuild a lost one.
    task: Task | None = None

    def trace(self) -> str | None:
        return self.trace_id

    def span_attributes(self) -> dict[str, str | int]:
        return {"hutch.job": self.job, "hutch.task.id": self.task_id, "hutch.domain": self.domain,
                "hutch.attempt": self.attempt}


class Rescued(Model):
    """The reconciler republished a lost task as `incarnation` (routing key `rescued.<domain>`).

    Governors remember the newest incarnation of recently rescued tasks and drop an older
    copy when it surfaces from the frontier.
    """

    v: Literal[1] = 1
    task_id: str
    domain: str
    incarnation: int
    at: float = Field(default_factory=time.time)


class EventBatch(Model):
    """Several events in one message: a governor's releases of the last few milliseconds.

    Routing key `released` (a batch spans domains), so it reaches every queue bound to
    `released.#`. One message per batch instead of one per permit is what lets a governor
    release thousands of permits a second (bench/governor_permits.py).
    """

    v: Literal[1] = 1
    events: list[Event]


class AnyEvent(RootModel[Event | EventBatch]):
    """What the events queues carry: one event, or a batch of them."""

    def events(self) -> list[Event]:
        return self.root.events if isinstance(self.root, EventBatch) else [self.root]


class FetcherHeartbeat(Model):
    """A fetcher's free capacity, published every second on `fetcher.heartbeat`."""

    v: Literal[1] = 1
    fetcher: str
    concurrency: int
    busy: int
    at: float = Field(default_factory=time.time)


class RobotsFetched(Model):
    """The result of a robots.txt fetch, for the governors (`robots.<domain>`).

    `status` None means the site could not be reached (timeout, reset).
    """

    v: Literal[1] = 1
    domain: str
    url: str
    status: int | None = None
    text: str = ""
    outcome: str
    at: float = Field(default_factory=time.time)


class JobControl(Model):
    """A change of a job's state, appended to the `jobs` stream that every governor reads whole.

    `pause`: its tasks wait in `frontier.paused` (no message held, no other job blocked).
    `resume`: they go back to the frontier. `cancel`: its tasks end dead as `cancelled` where
    they surface (those already released finish). `weight`: its share of each domain's rate
    against the other jobs on that domain (default 1). The newest record of a job wins.
    """

    v: Literal[1] = 1
    job: str
    action: Literal["pause", "resume", "cancel", "weight"]
    weight: float | None = Field(default=None, gt=0, le=1000)
    at: float = Field(default_factory=time.time)
    # `pause`: why, when no person asked: `budget` (the storer saw the job's proxy spend reach
    # its budget). Plain text, so a reason added later does not make older readers drop it.
    reason: str | None = Field(default=None, max_length=40)
    # `resume`: the job's proxy budget from now on (raised past what it spent).
    budget: float | None = Field(default=None, gt=0, le=MAX_BUDGET, allow_inf_nan=False)


class DomainRecord(Model):
    """An entry of the durable domain registry (a stream): this domain has a frontier queue."""

    v: Literal[1] = 1
    domain: str
    at: float = Field(default_factory=time.time)


class LeaseRequest(Model):
    v: Literal[1] = 1
    task_id: str
    domain: str
    job: str | None = None
    attempt: int = 0
    exclude: list[str] = Field(default_factory=list)
    tier_floor: str | None = None


class StoredQuery(Model):
    """Asked of the storer before a task a fetcher once died holding is fetched again: the
    fetch it died in may have gone on to be parsed and stored (done, but never acked)."""

    v: Literal[1] = 1
    task_id: str


class StoredAnswer(Model):
    v: Literal[1] = 1
    stored: bool


class Lease(Model):
    """A proxy for one attempt.

    `direct`: no pool is configured, fetch without a proxy. Otherwise `proxy_id` and `url`
    name the proxy; when none can be used now (all banned, dead or at their rate cap for this
    domain) `proxy_id` is None and `retry_in` says when to ask again: the fetcher returns the
    task without spending an attempt.
    """

    v: Literal[1] = 1
    direct: bool = False
    proxy_id: str | None = None
    url: str | None = None
    tier: str | None = None
    cost: float | None = None
    retry_in: float | None = None
    # On a direct lease: no pool is configured, so the fetcher may go direct for this many
    # seconds without asking again (a pool appears only when a proxy-manager starts with one).
    valid_for: float | None = None


# -- `hutch status --domains`: the question every governor is asked, and its answer ---------

# What a domain row may be sorted by: `name` ascending, every other key largest first.
SortKey = Literal[
    "held", "parked", "in_flight", "released", "throttled", "rate", "paused_for", "oldest_held", "jobs", "name"
]
SORT_KEYS: tuple[str, ...] = get_args(SortKey)
DEFAULT_TOP = 20
MAX_TOP = 10_000  # rows one answer may carry (about 4 MB of JSON); narrow with `match` for more
MAX_PATTERN = 256


class StatusRequest(Model):
    """The question `hutch status --domains` asks every governor.

    `top` rows after filtering by `match` (a shell-style glob on the domain, `*` and `?`,
    case-insensitive) and `paused_only` (domains paused now), ordered by `sort`.
    """

    v: Literal[1] = 1
    top: int = Field(default=DEFAULT_TOP, ge=1, le=MAX_TOP)
    sort: SortKey = "held"
    match: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN)
    paused_only: bool = False
    at: float = Field(default_factory=time.time)


class GovernorStatus(Model):
    """One governor's answer: its view of every domain it knows."""

    v: Literal[1] = 1
    governor: str
    started: float
    capacity: int
    fetchers: int
    in_flight: int
    domains: list[dict[str, Any]]  # the selection the request asked for (`select_domains`)
    total_domains: int = 0  # every domain it knows, before the selection
    at: float = Field(default_factory=time.time)
