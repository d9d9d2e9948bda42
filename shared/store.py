"""The store: jobs, task state, items, attempt history and the dead-letter ledger.

Task state lives here and nowhere else, so a crash of any process loses no track of what
finished, and job counts come from here rather than from a client's memory or queue
depths. Every write is idempotent (upserts keyed by task id, attempt time or message id),
because every consumer is at-least-once: a redelivered message must change nothing.

A task moves through `new` (recorded, not yet confirmed on the broker) -> `queued` ->
`in_flight` (holds a permit) <-> `retrying` -> `stored` | `dead`. Events from different
services can arrive out of order, so a transition applies only from the states listed in
`_FROM`: a late `released` event never drags a stored task back to in flight. The
reconciler alone moves a lost task from `in_flight` or `retrying` back to `queued`.

Each task row also keeps the task's latest message (as submitted, then as the fetcher last
routed it), its incarnation and `due_at`, so the reconciler (`hutch.services.storer.reconcile`)
can tell a task nothing will move again and rebuild it. A copy of a task with a lower
incarnation than the row's is stale: its events do not move the task any more.

The default store is one SQLite file (WAL, so the CLI can read while the storer writes),
durable at commit (`synchronous=FULL`: an acked item is on disk; the storer commits many
messages per transaction so this costs no throughput), created 0600 in a 0700 folder.

Why this module is long (about 800 lines): it is the store's whole SQL, one statement per
method, and every method shares one connection and one transaction discipline
(`_Transaction`, `write_group`). It splits by backend, not by table, when a second backend
(PostgreSQL) arrives.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hutch.models import NO_REQUEST, DeadLetter, Event, Item, JobControl, Page, Task
from hutch.postgres import PgConnection, is_postgres, outage_errors, pg_ddl
from hutch.settings import redact_url

SCHEMA_VERSION = 9
STATES = ("new", "queued", "in_flight", "retrying", "stored", "dead")
TERMINAL = ("stored", "dead")
JOB_STATES = ("running", "paused", "cancelled")
# A job's state after each control record (a `weight` record leaves the state as it is).
_JOB_STATE_OF = {"pause": "paused", "resume": "running", "cancel": "cancelled"}

# Which states a task may enter each state from (a replay moves a dead task back to queued).
_FROM = {
    "queued": ("new", "dead"),
    "in_flight": ("new", "queued", "retrying"),
    "retrying": ("new", "queued", "in_flight"),
    "stored": ("new", "queued", "in_flight", "retrying", "dead"),
    "dead": ("new", "queued", "in_flight", "retrying"),
}

_SCHEMA = [
    # version 1
    """
    CREATE TABLE jobs (
        name TEXT PRIMARY KEY,
        spec TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        url TEXT NOT NULL,
        domain TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_outcome TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX tasks_by_job_state ON tasks (job, state);
    CREATE TABLE items (
        task_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        url TEXT NOT NULL,
        status INTEGER,
        fields TEXT NOT NULL,
        stored_at REAL NOT NULL
    );
    CREATE INDEX items_by_job ON items (job);
    CREATE TABLE attempts (
        task_id TEXT NOT NULL,
        n INTEGER NOT NULL,
        at REAL NOT NULL,
        outcome TEXT,
        status INTEGER,
        proxy_id TEXT,
        elapsed REAL,
        next TEXT,
        delay REAL,
        PRIMARY KEY (task_id, n, at)
    );
    CREATE TABLE dead (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id TEXT UNIQUE,
        task_id TEXT,
        job TEXT,
        url TEXT,
        domain TEXT,
        stage TEXT NOT NULL,
        reason TEXT NOT NULL,
        detail TEXT,
        attempts INTEGER,
        letter TEXT NOT NULL,
        dead_at REAL NOT NULL,
        replayed_at REAL
    );
    CREATE INDEX dead_by_job ON dead (job, reason, domain);
    """,
    # version 2: proxy tier and cost per attempt; purged dead letters
    """
    ALTER TABLE attempts ADD COLUMN tier TEXT;
    ALTER TABLE attempts ADD COLUMN cost REAL;
    ALTER TABLE dead ADD COLUMN purged_at REAL;
    """,
    # version 3: what the reconciler needs. `message`: the task's latest message (JSON);
    # `incarnation`: raised by each rescue; `due_at`: for a task in flight, when its permit
    # was issued, for a retrying one, when its delay tier returns it; NULL while the task
    # waits on a queue some service drains (a domain's backlog, parse).
    """
    ALTER TABLE tasks ADD COLUMN message TEXT;
    ALTER TABLE tasks ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN rescues INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN due_at REAL;
    CREATE INDEX tasks_watched ON tasks (due_at) WHERE due_at IS NOT NULL;
    """,
    # version 4: each job's control state and weight, as the `jobs` stream last set them;
    # `state_at` and `weight_at`: the `at` of the record that set each (the newest wins).
    """
    ALTER TABLE jobs ADD COLUMN state TEXT NOT NULL DEFAULT 'running';
    ALTER TABLE jobs ADD COLUMN state_at REAL;
    ALTER TABLE jobs ADD COLUMN weight REAL NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN weight_at REAL;
    """,
    # version 5: each attempt's trace (the task's trace id, the fetch span's id when traced)
    # and the fetcher that made it, for `hutch trace`.
    """
    ALTER TABLE attempts ADD COLUMN trace_id TEXT;
    ALTER TABLE attempts ADD COLUMN span_id TEXT;
    ALTER TABLE attempts ADD COLUMN fetcher TEXT;
    """,
    # version 6: crawls. `depth`: a task's shortest known distance from the job's submitted
    # URLs (NULL: a submitted URL, depth 0); `page_links`: the links each crawled page offered,
    # kept so that a page found closer later has them followed again; `crawls`: each crawl
    # job's counts for `hutch status`, and the row that serialises its admissions.
    """
    ALTER TABLE tasks ADD COLUMN depth INTEGER;
    CREATE TABLE page_links (
        task_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        links TEXT NOT NULL
    );
    CREATE INDEX page_links_by_job ON page_links (job);
    CREATE TABLE crawls (
        job TEXT PRIMARY KEY,
        discovered INTEGER NOT NULL DEFAULT 0,
        admitted INTEGER NOT NULL DEFAULT 0,
        duplicates INTEGER NOT NULL DEFAULT 0,
        over_depth INTEGER NOT NULL DEFAULT 0,
        over_pages INTEGER NOT NULL DEFAULT 0,
        depth INTEGER NOT NULL DEFAULT 0
    );
    """,
    # version 7: the page archive. `bodies`: each page body once, by the SHA-256 of its text,
    # zlib-compressed; `pages`: the page each task fetched last, naming its body.
    """
    CREATE TABLE bodies (
        hash TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        body BLOB NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE pages (
        task_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        final_url TEXT NOT NULL,
        status INTEGER NOT NULL,
        content_type TEXT,
        hash TEXT NOT NULL,
        fetched_at REAL NOT NULL
    );
    CREATE INDEX pages_by_job ON pages (job);
    CREATE INDEX pages_by_hash ON pages (hash);
    """,
    # version 8: a job's proxy budget. `budget`: NULL for none (its spec's, or raised by a
    # resume); `spent`: what its proxied requests cost, kept up with each attempt recorded
    # while it has a budget; `reason`: why it is paused when no person paused it (`budget`).
    """
    ALTER TABLE jobs ADD COLUMN budget REAL;
    ALTER TABLE jobs ADD COLUMN spent REAL NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN reason TEXT;
    """,
    # version 9: an archived page whose body is a gzip file (a crawl's `sitemap.xml.gz`,
    # `Page.gzip_body`): its body is kept as those bytes, and `gzip` says so.
    """
    ALTER TABLE pages ADD COLUMN gzip INTEGER NOT NULL DEFAULT 0;
    """,
]
# What a job's proxied requests cost so far, from its attempts (`cost_summary`'s rule: those
# that went out through a proxy); the starting point of `jobs.spent` when a budget is set.
_SPENT = (
    "(SELECT COALESCE(SUM(a.cost), 0) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.job = jobs.name "
    f"AND a.proxy_id IS NOT NULL AND COALESCE(a.outcome, '') NOT IN ({', '.join(repr(o) for o in NO_REQUEST)}))"
)


class StoreError(Exception):
    """The store cannot be opened or is of a schema this version does not know."""


class StoreUnavailable(Exception):
    """The store could not take a write for a while (disk full, locked, read-only, I/O)."""


def is_outage(exc: BaseException) -> bool:
    """True for errors of the store itself, which no message causes and a retry may heal.

    SQLite reports a full disk, a lock held too long, a read-only file and I/O errors as
    `OperationalError`, a damaged file as a plain `DatabaseError`. `IntegrityError`,
    `DataError` and the like come from what one message asked for, so they are not outages.
    PostgreSQL's outages are psycopg's `OperationalError` (a lost connection, a server
    shutting down, a full disk, a deadlock) and `InterfaceError` (a closed connection).
    """
    if isinstance(exc, (sqlite3.OperationalError, sqlite3.InternalError, OSError, StoreUnavailable)):
        return True
    if "psycopg" in sys.modules and isinstance(exc, outage_errors()):
        return True
    return type(exc) is sqlite3.DatabaseError


def is_conflict(exc: BaseException) -> bool:
    """A PostgreSQL deadlock or serialization failure: the server rolled the transaction back
    to let another one through, and running it again is the cure it asks for."""
    if "psycopg" not in sys.modules:
        return False
    from psycopg import errors

    return isinstance(exc, (errors.DeadlockDetected, errors.SerializationFailure))


CONFLICT_TRIES = 5  # runs of a write that another transaction's locks keep rolling back


# A crawl's counts, as `hutch status` shows them: links the pages offered, tasks the job has
# (its submitted URLs included), links already admitted, links past max_depth or max_pages, and
# the deepest depth admitted.
CRAWL_COUNTS = ("discovered", "admitted", "duplicates", "over_depth", "over_pages", "depth")
# A link a crawled page offered, as the storer admits it: (task id from its canonical form,
# the URL to fetch, its domain).
Link = tuple[str, str, str]


ARCHIVE_LEVEL = 6  # zlib's default: the archive is written once and kept, so size counts


@dataclass(frozen=True)
class ArchivedPage:
    """A page as the archive keeps it, with what is needed to parse it again."""

    task_id: str
    url: str
    domain: str
    final_url: str
    status: int
    content_type: str | None
    fetched_at: float
    text: str
    message: str | None  # the task's latest message (JSON), None for a task recorded without it
    gzip_body: str | None = None  # a gzip file's bytes, base64 (`Page.gzip_body`); `text` is then empty


def _archived(row: Any) -> ArchivedPage:
    """A row of `Store.archived_batch`'s query as the page it was: its body as text, or a gzip
    file's bytes as base64 (`Page.gzip_body`) with no text."""
    raw = zlib.decompress(bytes(row[5]))
    gzipped = bool(row[9])
    return ArchivedPage(
        task_id=str(row[0]), url=str(row[7]), domain=str(row[8]), final_url=str(row[1]), status=int(row[2]),
        content_type=row[3], fetched_at=float(row[4]), message=row[6],
        text="" if gzipped else raw.decode("utf-8", "surrogatepass"),
        gzip_body=base64.b64encode(raw).decode("ascii") if gzipped else None,
    )


@dataclass(frozen=True)
class CrawlLimits:
    max_depth: int | None  # None: no limit
    max_pages: int | None


@dataclass
class _Admission:
    """One admission's running state: the job's task count, what to publish, the counts."""

    admitted: int
    reached: int = 0
    publish: dict[str, Task] = field(default_factory=dict)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("discovered", "duplicates", "over_depth", "over_pages"), 0)
    )


@dataclass(frozen=True)
class Silent:
    """A task in flight or retrying that has reported nothing since `due_at`."""

    id: str
    job: str
    url: str
    domain: str
    state: str
    attempts: int
    incarnation: int
    rescues: int
    due_at: float | None  # None: its page went to the parsers (`pages_sent_before`)
    message: str | None
    spec: str | None  # the job's spec (JSON), to rebuild a task recorded without its message


@dataclass(frozen=True)
class JobCounts:
    job: str
    total: int
    stored: int
    dead: int
    in_flight: int
    pending: int  # everything not stored and not dead (in flight included)
    stalled: int = 0  # dead because the reconciler rescued them too often (reason `stalled`)
    rescued: int = 0  # rescued by the reconciler at least once, whatever became of them
    cancelled: int = 0  # dead because the job was cancelled (reason `cancelled`)
    state: str = "running"  # one of JOB_STATES, as the `jobs` stream last set it
    weight: float = 1.0  # its share of each domain's rate against other jobs there
    # A crawl's counts (Store.crawl_counts): links discovered, admitted, duplicates, over
    # max_depth, over max_pages, and the deepest depth admitted. None: not a crawl, or no link yet.
    crawl: dict[str, int] | None = None
    budget: float | None = None  # its proxy budget (the pool's cost units); None: none
    spent: float = 0.0  # what its proxied requests cost, counted while it has a budget
    reason: str | None = None  # why it is paused when no person paused it (`budget`)

    @property
    def done(self) -> bool:
        """Nothing pending, or the job cancelled: its tasks still in a delay tier end dead as
        they surface, and nothing of it will be fetched again, so nobody need wait for them."""
        return self.pending == 0 or self.state == "cancelled"


def _private_file(path: Path) -> None:
    """Create the store file 0600 (and any missing folder 0700) before SQLite opens it.

    SQLite gives the `-wal` and `-shm` files it creates the mode of the database file, so
    they are private too. Folders that already exist are left as they are (the store may
    live in a shared one); a file that exists is made private if it is not.
    """
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(folder, 0o700)  # mkdir's mode goes through the umask
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if name.stat().st_mode & 0o077:
                os.chmod(name, 0o600)
        except OSError:  # absent, or not ours to change: SQLite says so if it matters
            continue


def sqlite_path(location: str) -> Path:
    if location.startswith("sqlite:///"):
        return Path(location[len("sqlite:///") :])
    if "://" in location:
        raise StoreError(f"unsupported store URL scheme in {location.split('://')[0]}://...")
    return Path(location)


def store_exists(location: str) -> bool:
    """Whether there is a store at `location` to read, without creating one: an SQLite file
    that exists, or any PostgreSQL URL (whether it answers shows when it is opened)."""
    if is_postgres(location):
        return True
    try:
        return sqlite_path(location).exists()
    except StoreError:
        return False


def _greatest(a: Any, b: Any) -> Any:
    # PostgreSQL's GREATEST, which SQLite lacks: NULLs are ignored.
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


class Store:
    """Blocking access to the store; one instance per thread (see AsyncStore).

    `location` is an SQLite path or `sqlite:///` URL (the embedded default), or a
    `postgresql://` URL (`hutch.postgres`). The SQL below is written once, in SQLite's
    dialect with `GREATEST` and `CASE` where the two differ; `PgConnection` translates it.
    """

    def __init__(self, location: str) -> None:
        self.location = redact_url(location)
        self.db: Any
        if is_postgres(location):
            try:
                self.db = PgConnection(location)
            except outage_errors() as exc:
                raise StoreError(f"cannot open the store at {self.location}: {exc}") from exc
            self.path: Path | None = None
        else:
            self.path = sqlite_path(location)
            _private_file(self.path)
            self.db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.create_function("GREATEST", 2, _greatest, deterministic=True)
            self.db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk when it returns, so an item acked after its commit
            # survives a power cut (NORMAL in WAL mode may lose the last commits).
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA busy_timeout=30000")
        self._migrate()

    @property
    def backend(self) -> str:
        return "sqlite" if self.path is not None else "postgresql"

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        """Bring the schema up to SCHEMA_VERSION, one version per transaction.

        The version is read again under the write lock (SQLite's, or an advisory lock in
        PostgreSQL), so processes opening a new store at the same moment migrate it once.
        """
        postgres = self.path is None
        if postgres and self.db.current_schema() == SCHEMA_VERSION:
            return
        while True:
            with self._tx():
                if postgres:
                    version = self.db.lock_schema()
                else:
                    version = self.db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"store {self.location} has schema version {version}; this Hutch knows up to "
                        f"{SCHEMA_VERSION}: upgrade Hutch"
                    )
                if version == SCHEMA_VERSION:
                    return
                for statement in _SCHEMA[version].split(";"):
                    if statement.strip():
                        self.db.execute(pg_ddl(statement) if postgres else statement)
                if postgres:
                    self.db.set_schema(version + 1)
                else:
                    self.db.execute(f"PRAGMA user_version={version + 1}")

    def _tx(self) -> _Transaction:
        return _Transaction(self.db)

    # -- jobs and tasks ----------------------------------------------------------------

    def add_job(self, name: str, spec: dict[str, Any] | None) -> None:
        """Record the job and its spec; the spec's proxy budget (or none) becomes the job's,
        its spend counted from the attempts so far when it had none."""
        budget = spec.get("budget") if spec else None
        with self._tx():
            self.db.execute(
                "INSERT INTO jobs (name, spec, created_at, budget) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, budget = excluded.budget, "
                f"spent = CASE WHEN jobs.budget IS NULL THEN {_SPENT} ELSE jobs.spent END",
                (name, json.dumps(spec) if spec else None, time.time(), budget),
            )

    def job_exists(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone() is not None

    def delete_job(self, name: str) -> dict[str, int] | None:
        """Remove a job: its tasks, items, attempts, dead letters and its row, in one
        transaction; how many rows of each went. None for a job the store does not know."""
        with self._tx():
            if self.db.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone() is None:
                if self.db.execute("SELECT 1 FROM tasks WHERE job = ? LIMIT 1", (name,)).fetchone() is None:
                    return None
            gone = {
                "attempts": self.db.execute(
                    "DELETE FROM attempts WHERE task_id IN (SELECT id FROM tasks WHERE job = ?)", (name,)
                ).rowcount,
                "items": self.db.execute("DELETE FROM items WHERE job = ?", (name,)).rowcount,
                "dead": self.db.execute("DELETE FROM dead WHERE job = ?", (name,)).rowcount,
                "tasks": self.db.execute("DELETE FROM tasks WHERE job = ?", (name,)).rowcount,
            }
            self.db.execute("DELETE FROM page_links WHERE job = ?", (name,))
            self.db.execute("DELETE FROM crawls WHERE job = ?", (name,))
            gone["pages"] = self.db.execute("DELETE FROM pages WHERE job = ?", (name,)).rowcount
            self._drop_orphan_bodies()
            self.db.execute("DELETE FROM jobs WHERE name = ?", (name,))
        return gone

    def finished_jobs(self, before: float) -> list[str]:
        """Jobs done (nothing pending, or cancelled) whose last task moved before `before`:
        what the retention setting removes."""
        rows = self.db.execute(
            "SELECT t.job FROM tasks t LEFT JOIN jobs j ON j.name = t.job GROUP BY t.job "
            "HAVING MAX(t.updated_at) < ? AND (COUNT(CASE WHEN t.state NOT IN ('stored', 'dead') THEN 1 END) = 0 "
            "OR MAX(COALESCE(j.state, 'running')) = 'cancelled')",
            (before,),
        )
        return [str(row[0]) for row in rows]

    def job_spec(self, name: str) -> dict[str, Any] | None:
        """The spec the job was submitted with (as recorded), None when none was."""
        row = self.db.execute("SELECT spec FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None or row[0] is None:
            return None
        found = json.loads(row[0])
        return found if isinstance(found, dict) else None

    def job_state(self, name: str) -> tuple[str, float] | None:
        """(state, weight) of a job, None for a job the store does not know."""
        row = self.db.execute("SELECT state, weight FROM jobs WHERE name = ?", (name,)).fetchone()
        return None if row is None else (str(row[0]), float(row[1]))

    def job_budget(self, name: str) -> tuple[float | None, float] | None:
        """(proxy budget, spent) of a job: None as the budget when it has none; None for a
        job the store does not know."""
        row = self.db.execute("SELECT budget, spent FROM jobs WHERE name = ?", (name,)).fetchone()
        return None if row is None else (None if row[0] is None else float(row[0]), float(row[1]))

    def over_budget(self, jobs: Iterable[str]) -> list[str]:
        """Of `jobs`, the running ones whose proxy spend reached their budget: to be paused."""
        names = sorted(set(jobs))
        if not names:
            return []
        rows = self.db.execute(
            f"SELECT name FROM jobs WHERE name IN ({','.join('?' * len(names))}) AND budget IS NOT NULL "
            "AND spent >= budget AND state = 'running'",
            names,
        )
        return [str(row[0]) for row in rows]

    def apply_job_control(self, control: JobControl) -> None:
        """Record a control record of the `jobs` stream: the newest per job (by `at`) wins.

        Idempotent and order-free, so the storer may read the stream from its first record
        after every start: a record older than the one that set the state (or the weight)
        changes nothing, one of the same `at` is applied again (the stream's order decides,
        as it does for the governors). A job this store has not seen (submitted against
        another store) is recorded. The record's `reason` is kept with the state (a pause's
        only), and a resume's `budget` becomes the job's.
        """
        with self._tx():
            self.db.execute(
                "INSERT INTO jobs (name, spec, created_at) VALUES (?, NULL, ?) ON CONFLICT (name) DO NOTHING",
                (control.job, time.time()),
            )
            if control.action == "weight":
                self.db.execute(
                    "UPDATE jobs SET weight = ?, weight_at = ? "
                    "WHERE name = ? AND (weight_at IS NULL OR weight_at <= ?)",
                    (control.weight or 1.0, control.at, control.job, control.at),
                )
                return
            reason = control.reason if control.action == "pause" else None
            budget = control.budget if control.action == "resume" else None
            # A budget where there was none: the spend so far, from the attempts.
            raised = "" if budget is None else f", spent = CASE WHEN budget IS NULL THEN {_SPENT} ELSE spent END"
            self.db.execute(
                f"UPDATE jobs SET state = ?, state_at = ?, reason = ?, budget = COALESCE(?, budget){raised} "
                "WHERE name = ? AND (state_at IS NULL OR state_at <= ?)",
                (_JOB_STATE_OF[control.action], control.at, reason, budget, control.job, control.at),
            )

    def add_tasks(self, rows: Iterable[tuple[str, str, str, str]], messages: dict[str, str] | None = None) -> list[str]:
        """Record (id, job, url, domain) rows; return the ids still waiting to be published.

        `messages` maps a task id to the task as published (JSON), kept for the reconciler.
        Tasks already recorded keep their state; a task still `new` (recorded by an earlier
        submit that died before publishing it) is returned again so it gets published.
        """
        now = time.time()
        rows = list(rows)
        if not rows:
            return []
        messages = messages or {}
        with self._tx():
            self.db.executemany(
                "INSERT INTO tasks (id, job, url, domain, message, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, 'new', ?, ?) ON CONFLICT (id) DO NOTHING",
                [(*row, messages.get(row[0]), now, now) for row in rows],
            )
            ids = [row[0] for row in rows]
            waiting: set[str] = set()
            for chunk in _chunks(ids, 500):
                marks = ",".join("?" * len(chunk))
                found = self.db.execute(f"SELECT id FROM tasks WHERE state = 'new' AND id IN ({marks})", chunk)
                waiting.update(row[0] for row in found)
        return [i for i in ids if i in waiting]

    def mark_queued(self, ids: Iterable[str]) -> None:
        """Published: `new` tasks become `queued` (a `dead` one only through `mark_replayed`)."""
        with self._tx():
            for chunk in _chunks(list(ids), 500):
                self.db.execute(
                    f"UPDATE tasks SET state = 'queued', updated_at = ? "
                    f"WHERE id IN ({','.join('?' * len(chunk))}) AND state = 'new'",
                    (time.time(), *chunk),
                )

    def _transition(self, ids: list[str], state: str, outcome: str | None = None) -> int:
        if not ids:
            return 0
        sources = _FROM[state]
        now = time.time()
        changed = 0
        with self._tx():
            for chunk in _chunks(ids, 500):
                cursor = self.db.execute(
                    f"UPDATE tasks SET state = ?, updated_at = ?, "
                    f"last_outcome = COALESCE(?, last_outcome) "
                    f"WHERE id IN ({','.join('?' * len(chunk))}) "
                    f"AND state IN ({','.join('?' * len(sources))})",
                    (state, now, outcome, *chunk, *sources),
                )
                changed += cursor.rowcount
        return changed

    def task_state(self, task_id: str) -> str | None:
        row = self.db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
        return None if row is None else str(row[0])

    def tasks(self, job: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, url, domain, state, attempts, last_outcome FROM tasks WHERE job = ? ORDER BY url",
            (job,),
        ).fetchall()
        return [dict(row) for row in rows]

    def unpublished(self, job: str) -> Iterator[Any]:
        yield from self.db.execute("SELECT id, url, domain FROM tasks WHERE job = ? AND state = 'new'", (job,))

    # -- what the services report ----------------------------------------------------------

    def apply_event(self, event: Event) -> None:
        self.apply_events([event])

    def apply_events(self, events: list[Event]) -> None:
        """Record events in one transaction (a governor's releases come in batches)."""
        with self._tx():
            for event in events:
                self._apply_in_tx(event)

    def _apply_in_tx(self, event: Event) -> None:
        found = self.db.execute("SELECT incarnation FROM tasks WHERE id = ?", (event.task_id,)).fetchone()
        stale = found is not None and event.incarnation < found[0]
        if event.kind == "released":
            # Releases travel in batches every few milliseconds, so the outcome of a fast fetch
            # can arrive first: a release older than an outcome already here is old news.
            answered = self.db.execute(
                "SELECT 1 FROM attempts WHERE task_id = ? AND at >= ? LIMIT 1", (event.task_id, event.at)
            ).fetchone()
            if stale or answered is not None:
                return
            if self._transition_in_tx(event.task_id, "in_flight", None):
                self.db.execute("UPDATE tasks SET due_at = ? WHERE id = ?", (event.at, event.task_id))
            else:  # in flight already (a rescue not yet finished, a lost outcome): a fresher start
                self.db.execute(
                    "UPDATE tasks SET due_at = ? WHERE id = ? AND state = 'in_flight' AND due_at < ?",
                    (event.at, event.task_id, event.at),
                )
            return
        # The attempt happened, stale copy or not: it is history (and, the first time it is
        # recorded, a cost to a job with a proxy budget). The state moves only for the live copy.
        recorded = self.db.execute(
            "INSERT INTO attempts (task_id, n, at, outcome, status, proxy_id, tier, cost, elapsed, next, delay, "
            "trace_id, span_id, fetcher) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                event.task_id,
                event.attempt,
                event.at,
                event.outcome,
                event.status,
                event.proxy_id,
                event.tier,
                event.cost,
                event.elapsed,
                event.next,
                event.delay,
                event.trace_id,
                event.span_id,
                event.fetcher,
            ),
        )
        if recorded.rowcount == 1 and event.cost and event.proxy_id is not None and event.outcome not in NO_REQUEST:
            self.db.execute(
                "UPDATE jobs SET spent = spent + ? WHERE name = ? AND budget IS NOT NULL", (event.cost, event.job)
            )
        if stale:
            return
        self.db.execute(
            "UPDATE tasks SET attempts = GREATEST(attempts, ?), incarnation = GREATEST(incarnation, ?), "
            "message = COALESCE(?, message) WHERE id = ?",
            (
                event.attempt,
                event.incarnation,
                event.task.model_dump_json(exclude_none=True) if event.task else None,
                event.task_id,
            ),
        )
        if event.next in ("retry", "frontier"):
            if self._transition_in_tx(event.task_id, "retrying", event.outcome):
                # Back in a domain's backlog (`frontier`): nothing to watch. In a delay tier:
                # due back when the delay is over.
                due = event.at + event.delay if event.next == "retry" and event.delay is not None else None
                self.db.execute("UPDATE tasks SET due_at = ? WHERE id = ?", (due, event.task_id))
        elif event.next == "parse":
            # On the durable parse queue: the parser moves it on, or dead-letters it.
            self.db.execute("UPDATE tasks SET due_at = NULL WHERE id = ? AND state = 'in_flight'", (event.task_id,))

    def _transition_in_tx(self, task_id: str, state: str, outcome: str | None) -> bool:
        sources = _FROM[state]
        cursor = self.db.execute(
            f"UPDATE tasks SET state = ?, updated_at = ?, last_outcome = COALESCE(?, last_outcome) "
            f"WHERE id = ? AND state IN ({','.join('?' * len(sources))})",
            (state, time.time(), outcome, task_id, *sources),
        )
        return bool(cursor.rowcount > 0)

    def store_item(self, item: Item) -> None:
        task = item.task
        with self._tx():
            self.db.execute(
                "INSERT INTO items (task_id, job, url, status, fields, stored_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, "
                "fields = excluded.fields, stored_at = excluded.stored_at",
                (task.id, task.job, task.url, item.status, json.dumps(item.fields), time.time()),
            )
            # A task submitted elsewhere (another store) is recorded here on first sight.
            self.db.execute(
                "INSERT INTO tasks (id, job, url, domain, state, attempts, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, 'stored', ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (task.id, task.job, task.url, task.domain, task.attempts, time.time(), time.time()),
            )
            self.db.execute("UPDATE tasks SET attempts = GREATEST(attempts, ?) WHERE id = ?", (task.attempts, task.id))
            self._transition_in_tx(task.id, "stored", "ok")

    # -- crawls ---------------------------------------------------------------------------

    def admit_links(self, parent: Task, links: list[Link], limits: CrawlLimits) -> list[Task]:
        """Admit the links a crawled page offered; the tasks to publish (recorded as `new`).

        Each link is admitted at most once per job (its id comes from its canonical form), at
        the parent's depth + 1, while that is within `max_depth` and the job has fewer than
        `max_pages` tasks. A link already admitted deeper gets the shorter depth, and if its
        page was crawled, the links that page offered are offered again from there (recorded in
        `page_links`): so the pages admitted are those a breadth-first walk reaches within
        `max_depth`, whatever order the pages were fetched in. The job's `crawls` row is
        updated first, which locks it: admissions of one job never interleave.

        The same page offered again (its item redelivered) admits nothing new and counts
        nothing twice; it returns the children still `new`, which were recorded but whose
        publish was not confirmed before the storer stopped. The page offering other links
        than before (a reparse with other `follow:` rules) records and counts them anew.
        """
        job = parent.job
        with self._tx():
            self.db.execute(
                "INSERT INTO crawls (job, admitted) SELECT ?, COUNT(*) FROM tasks WHERE job = ? "
                "ON CONFLICT (job) DO NOTHING",
                (job, job),
            )
            row = self.db.execute(
                "UPDATE crawls SET admitted = admitted WHERE job = ? RETURNING admitted", (job,)
            ).fetchone()
            walk = _Admission(admitted=int(row[0]))
            first = self._record_links(parent, links)
            found = self.db.execute("SELECT depth FROM tasks WHERE id = ?", (parent.id,)).fetchone()
            depth = int(found[0]) if found is not None and found[0] is not None else 0
            offers: list[tuple[int, list[Link], bool]] = [(depth + 1, links, first)]
            while offers:
                at, offered, count = offers.pop(0)
                if count:
                    walk.counts["discovered"] += len(offered)
                if limits.max_depth is not None and at > limits.max_depth:
                    walk.counts["over_depth"] += len(offered) if count else 0
                    continue
                known = self._known_depths([link[0] for link in offered])
                offers += self._closer(offered, known, at, walk if count else None)
                self._admit_new(parent, offered, known, at, limits, walk, count)
            if not first:  # a redelivery: what was recorded but maybe never published
                for message in self._still_new([link[0] for link in links]):
                    task = Task.model_validate_json(message)
                    walk.publish.setdefault(task.id, task)
            c = walk.counts
            self.db.execute(
                "UPDATE crawls SET discovered = discovered + ?, admitted = ?, duplicates = duplicates + ?, "
                "over_depth = over_depth + ?, over_pages = over_pages + ?, depth = GREATEST(depth, ?) WHERE job = ?",
                (c["discovered"], walk.admitted, c["duplicates"], c["over_depth"], c["over_pages"], walk.reached, job),
            )
        return list(walk.publish.values())

    def _record_links(self, parent: Task, links: list[Link]) -> bool:
        """Record the links `parent`'s page offered; False when the same ones are recorded
        already (the item redelivered). Links that differ (the page re-parsed with other
        `follow:` rules, or fetched again with other content) replace the old ones, so a
        page found closer later re-offers what its page offers now."""
        encoded = json.dumps(links)
        held = self.db.execute("SELECT links FROM page_links WHERE task_id = ?", (parent.id,)).fetchone()
        if held is None:
            self.db.execute(
                "INSERT INTO page_links (task_id, job, links) VALUES (?, ?, ?)", (parent.id, parent.job, encoded)
            )
            return True
        if held[0] == encoded:
            return False
        self.db.execute("UPDATE page_links SET links = ? WHERE task_id = ?", (encoded, parent.id))
        return True

    def _closer(
        self, offered: list[Link], known: dict[str, int], at: int, walk: _Admission | None
    ) -> list[tuple[int, list[Link], bool]]:
        """Give the known links found closer (`at`) that depth; the links their pages offered,
        to offer again one step further. Counts the duplicates in `walk`, when given."""
        again: list[tuple[int, list[Link], bool]] = []
        for link_id, _, _ in offered:
            if link_id not in known:
                continue
            if walk is not None:
                walk.counts["duplicates"] += 1
            if known[link_id] <= at:
                continue
            self.db.execute("UPDATE tasks SET depth = ? WHERE id = ?", (at, link_id))
            known[link_id] = at
            held = self.db.execute("SELECT links FROM page_links WHERE task_id = ?", (link_id,)).fetchone()
            if held is not None:
                again.append((at + 1, [(str(a), str(b), str(c)) for a, b, c in json.loads(held[0])], False))
        return again

    def _admit_new(
        self,
        parent: Task,
        offered: list[Link],
        known: dict[str, int],
        at: int,
        limits: CrawlLimits,
        walk: _Admission,
        count: bool,
    ) -> None:
        """Record the links not known yet as `new` tasks at depth `at`, while the job has room."""
        now = time.time()
        for link_id, url, domain in offered:
            if link_id in known or link_id in walk.publish:
                continue
            if limits.max_pages is not None and walk.admitted >= limits.max_pages:
                walk.counts["over_pages"] += 1 if count else 0
                continue
            task = Task(id=link_id, job=parent.job, url=url, domain=domain, spec=parent.spec,
                        tier_floor=parent.tier_floor)  # fmt: skip
            inserted = self.db.execute(
                "INSERT INTO tasks (id, job, url, domain, message, state, depth, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, 'new', ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (link_id, parent.job, url, domain, task.model_dump_json(exclude_none=True), at, now, now),
            ).rowcount
            if inserted:
                walk.publish[link_id] = task
                walk.admitted += 1
                walk.reached = max(walk.reached, at)

    def _known_depths(self, ids: list[str]) -> dict[str, int]:
        """Depth of each of `ids` the job already has (a submitted URL: 0)."""
        known: dict[str, int] = {}
        for chunk in _chunks(list(dict.fromkeys(ids)), 500):
            marks = ",".join("?" * len(chunk))
            for row in self.db.execute(f"SELECT id, depth FROM tasks WHERE id IN ({marks})", chunk):
                known[str(row[0])] = 0 if row[1] is None else int(row[1])
        return known

    def _still_new(self, ids: list[str]) -> list[str]:
        messages: list[str] = []
        for chunk in _chunks(list(dict.fromkeys(ids)), 500):
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT message FROM tasks WHERE state = 'new' AND message IS NOT NULL AND id IN ({marks})", chunk
            )
            messages += [str(row[0]) for row in rows]
        return messages

    def crawl_counts(self, job: str) -> dict[str, int] | None:
        """A crawl job's counts (`CRAWL_COUNTS`); None for a job that has admitted no link yet."""
        row = self.db.execute(f"SELECT {', '.join(CRAWL_COUNTS)} FROM crawls WHERE job = ?", (job,)).fetchone()
        if row is None:
            return None
        return {key: int(value) for key, value in zip(CRAWL_COUNTS, tuple(row), strict=True)}

    # -- the page archive ------------------------------------------------------------------

    def archive_page(self, page: Page, level: int = ARCHIVE_LEVEL) -> None:
        """Keep the page's body (once per content, compressed) as the task's latest page: its
        text, or for a gzip file (`Page.gzip_body`) the file's bytes."""
        gzipped = page.gzip_body is not None
        raw = base64.b64decode(page.gzip_body or "") if gzipped else page.text.encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(raw).hexdigest()
        now = time.time()
        task = page.task
        with self._tx():
            before = self.db.execute("SELECT hash FROM pages WHERE task_id = ?", (task.id,)).fetchone()
            if self.db.execute("SELECT 1 FROM bodies WHERE hash = ?", (digest,)).fetchone() is None:
                self.db.execute(
                    "INSERT INTO bodies (hash, size, body, created_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (hash) DO NOTHING",
                    (digest, len(raw), zlib.compress(raw, level), now),
                )
            self.db.execute(
                "INSERT INTO pages (task_id, job, final_url, status, content_type, hash, fetched_at, gzip) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET final_url = excluded.final_url, "
                "status = excluded.status, content_type = excluded.content_type, hash = excluded.hash, "
                "fetched_at = excluded.fetched_at, gzip = excluded.gzip WHERE excluded.fetched_at >= pages.fetched_at",
                (task.id, task.job, page.final_url, page.status, page.content_type, digest, page.fetched_at,
                 int(gzipped)),
            )
            if before is not None and before[0] != digest:
                # Whichever body lost (the page's older one, or this one from a late copy of an
                # older fetch), unless another page names it.
                for lost in (before[0], digest):
                    self.db.execute(
                        "DELETE FROM bodies WHERE hash = ? AND NOT EXISTS (SELECT 1 FROM pages WHERE hash = ?)",
                        (lost, lost),
                    )

    def archived_batch(self, job: str, after: str, limit: int) -> list[ArchivedPage]:
        """Up to `limit` archived pages of `job` whose task id sorts after `after`, in task id
        order, each with its task's latest message: the whole job a batch at a time."""
        rows = self.db.execute(
            "SELECT p.task_id, p.final_url, p.status, p.content_type, p.fetched_at, b.body, t.message, t.url, "
            "t.domain, p.gzip FROM pages p JOIN bodies b ON b.hash = p.hash JOIN tasks t ON t.id = p.task_id "
            "WHERE p.job = ? AND p.task_id > ? ORDER BY p.task_id LIMIT ?",
            (job, after, limit),
        ).fetchall()
        return [_archived(row) for row in rows]

    def archive_counts(self, job: str) -> tuple[int, int]:
        """(pages archived, distinct bodies) of `job`."""
        row = self.db.execute("SELECT COUNT(*), COUNT(DISTINCT hash) FROM pages WHERE job = ?", (job,)).fetchone()
        return int(row[0]), int(row[1])

    def expire_archive(self, before: float) -> int:
        """Drop the pages fetched before `before` and the bodies no page names any more."""
        with self._tx():
            gone = int(self.db.execute("DELETE FROM pages WHERE fetched_at < ?", (before,)).rowcount)
            self._drop_orphan_bodies()
        return gone

    def _drop_orphan_bodies(self) -> None:
        self.db.execute("DELETE FROM bodies WHERE NOT EXISTS (SELECT 1 FROM pages p WHERE p.hash = bodies.hash)")

    def record_dead(self, letter: DeadLetter, message_id: str) -> None:
        """Record a dead letter in the ledger, and its task as dead.

        A letter from a stale copy of a task (a lower incarnation than the store's) is kept
        as history but purged at once: the live copy decides how the task ends.
        """
        task = letter.task
        with self._tx():
            stale = False
            if task is not None:
                found = self.db.execute("SELECT incarnation FROM tasks WHERE id = ?", (task.id,)).fetchone()
                stale = found is not None and task.incarnation < found[0]
            self.db.execute(
                "INSERT INTO dead (message_id, task_id, job, url, domain, stage, reason, detail, "
                "attempts, letter, dead_at, purged_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                (
                    message_id,
                    task.id if task else None,
                    task.job if task else None,
                    task.url if task else None,
                    task.domain if task else None,
                    letter.stage,
                    letter.reason,
                    letter.detail,
                    task.attempts if task else None,
                    letter.model_dump_json(exclude_none=True),
                    letter.at,
                    time.time() if stale else None,
                ),
            )
            if task is not None and not stale:
                self.db.execute(
                    "UPDATE tasks SET attempts = GREATEST(attempts, ?) WHERE id = ?",
                    (task.attempts, task.id),
                )
                self._transition_in_tx(task.id, "dead", letter.reason)

    # -- the reconciler ----------------------------------------------------------------

    def silent_tasks(self, in_flight_before: float, retrying_before: float, limit: int) -> list[Silent]:
        """Tasks in flight since before `in_flight_before` or due back before `retrying_before`.

        Oldest first, at most `limit`; the reconciler decides which of them are lost.
        """
        rows = self.db.execute(
            "SELECT t.id, t.job, t.url, t.domain, t.state, t.attempts, t.incarnation, t.rescues, "
            "t.due_at, t.message, j.spec FROM tasks AS t LEFT JOIN jobs AS j ON j.name = t.job "
            "WHERE t.due_at IS NOT NULL AND t.due_at < ? "
            "AND ((t.state = 'in_flight' AND t.due_at < ?) OR (t.state = 'retrying' AND t.due_at < ?)) "
            # A paused job's tasks wait aside on purpose; a cancelled one's end as they surface.
            "AND COALESCE(j.state, 'running') = 'running' "
            "ORDER BY t.due_at LIMIT ?",
            (max(in_flight_before, retrying_before), in_flight_before, retrying_before, int(limit)),
        ).fetchall()
        return [Silent(**dict(row)) for row in rows]

    def pages_sent_before(self, before: float, limit: int) -> list[Silent]:
        """Tasks whose page went to the parsers in their latest attempt, made before `before`,
        and not stored or dead since: those whose page or item a broker that lost its
        transient messages may have had (`hutch.services.storer.lost`). Such a task is in
        flight with no `due_at`, or still `queued` when its outcome came before its release
        (which is then old news). One moved since `before` (rescued) is not one. At most
        `limit`."""
        rows = self.db.execute(
            "SELECT t.id, t.job, t.url, t.domain, t.state, t.attempts, t.incarnation, t.rescues, "
            "t.due_at, t.message, j.spec FROM tasks AS t LEFT JOIN jobs AS j ON j.name = t.job "
            "WHERE t.state IN ('queued', 'in_flight') AND t.due_at IS NULL AND t.attempts > 0 AND t.updated_at < ? "
            "AND (SELECT a.next FROM attempts AS a WHERE a.task_id = t.id ORDER BY a.at DESC LIMIT 1) = 'parse' "
            "AND (SELECT MAX(a.at) FROM attempts AS a WHERE a.task_id = t.id) < ? LIMIT ?",
            (before, before, int(limit)),
        ).fetchall()
        return [Silent(**dict(row)) for row in rows]

    def begin_rescue(self, silent: Silent, rescued: Task, now: float) -> bool:
        """Claim a rescue: record `rescued` (the new incarnation) as the task's message and
        count the rescue, if the task has not moved since it was read.

        Done before the republish, so a copy that surfaces from now on is stale. `due_at`
        restarts now: if the republish fails, the task is looked at again one deadline later.
        False if the task moved since it was read (an event came in): leave it.
        """
        with self._tx():
            cursor = self.db.execute(
                "UPDATE tasks SET incarnation = ?, message = ?, rescues = rescues + 1, due_at = ?, "
                "updated_at = ? WHERE id = ? AND state = ? AND incarnation = ? AND "
                + ("due_at IS NULL" if silent.due_at is None else "due_at = ?"),
                (
                    rescued.incarnation,
                    rescued.model_dump_json(exclude_none=True),
                    now,
                    now,
                    silent.id,
                    silent.state,
                    silent.incarnation,
                    *(() if silent.due_at is None else (silent.due_at,)),
                ),
            )
            return bool(cursor.rowcount > 0)

    def finish_rescue(self, task: Task, claimed_at: float) -> None:
        """The rescued copy is confirmed in the frontier: the task waits in its backlog.

        Unless the new copy's release was heard already (`due_at` moved on since the claim
        at `claimed_at`): then it is in flight, and stays so.
        """
        with self._tx():
            self.db.execute(
                "UPDATE tasks SET state = 'queued', due_at = NULL, updated_at = ? "
                "WHERE id = ? AND incarnation = ? AND state IN ('in_flight', 'retrying') AND due_at = ?",
                (time.time(), task.id, task.incarnation, claimed_at),
            )

    # -- group commit ----------------------------------------------------------------

    def write_group(self, writes: list[Callable[[Store], None]]) -> list[Exception | None]:
        """Run `writes` in one transaction, one commit for all, each write undone alone if it fails.

        A write that fails for a reason of its own (its message) is undone alone and its
        error returned in its place; the others still commit. A store outage (`is_outage`)
        rolls the whole transaction back and raises: nothing of the group is written.
        """
        results: list[Exception | None] = [None] * len(writes)
        # First all in one go: a savepoint costs two statements a write, which on PostgreSQL
        # are two round trips. Only when a write fails (rare: its message is bad) is the
        # group written again, each write in its own savepoint. Writes are idempotent, and
        # the failed attempt was rolled back whole.
        try:
            with self._tx():
                for write in writes:
                    write(self)
            return results
        except Exception as exc:
            if is_outage(exc):
                raise
            if len(writes) == 1:
                return [exc]
        with self._tx():
            for i, write in enumerate(writes):
                self.db.execute("SAVEPOINT one")
                try:
                    write(self)
                except Exception as exc:
                    if is_outage(exc):
                        raise
                    self.db.execute("ROLLBACK TO one")
                    results[i] = exc
                self.db.execute("RELEASE one")
        return results

    # -- reading ---------------------------------------------------------------------

    def counts(self, job: str | None = None) -> list[JobCounts]:
        query = (
            "SELECT job, COUNT(*) AS total, "
            "COUNT(CASE WHEN state = 'stored' THEN 1 END) AS stored, "
            "COUNT(CASE WHEN state = 'dead' THEN 1 END) AS dead, "
            "COUNT(CASE WHEN state = 'in_flight' THEN 1 END) AS in_flight, "
            "COUNT(CASE WHEN state = 'dead' AND last_outcome = 'stalled' THEN 1 END) AS stalled, "
            "COUNT(CASE WHEN rescues > 0 THEN 1 END) AS rescued, "
            "COUNT(CASE WHEN state = 'dead' AND last_outcome = 'cancelled' THEN 1 END) AS cancelled "
            "FROM tasks "
        )
        params: tuple[str, ...] = ()
        if job is not None:
            query += "WHERE job = ? "
            params = (job,)
        query += "GROUP BY job ORDER BY job"
        controls = {
            str(row[0]): (str(row[1]), float(row[2])) for row in self.db.execute("SELECT name, state, weight FROM jobs")
        }
        budgets = {  # the few jobs with a proxy budget, or paused for a reason
            str(row[0]): {
                "budget": None if row[1] is None else float(row[1]),
                "spent": round(float(row[2]), 6),
                "reason": row[3],
            }
            for row in self.db.execute(
                "SELECT name, budget, spent, reason FROM jobs WHERE budget IS NOT NULL OR reason IS NOT NULL"
            )
        }
        crawls = {
            str(row[0]): dict(zip(CRAWL_COUNTS, (int(v) for v in tuple(row)[1:]), strict=True))
            for row in self.db.execute(f"SELECT job, {', '.join(CRAWL_COUNTS)} FROM crawls")
        }
        result = []
        for row in self.db.execute(query, params):
            total, stored, dead = row["total"], row["stored"] or 0, row["dead"] or 0
            state, weight = controls.get(row["job"], ("running", 1.0))
            result.append(
                JobCounts(
                    row["job"],
                    total,
                    stored,
                    dead,
                    row["in_flight"] or 0,
                    total - stored - dead,
                    row["stalled"] or 0,
                    row["rescued"] or 0,
                    row["cancelled"] or 0,
                    state,
                    weight,
                    crawls.get(row["job"]),
                    **budgets.get(row["job"], {}),
                )
            )
        if job is not None and not result and job in controls:
            state, weight = controls[job]
            result.append(JobCounts(job, 0, 0, 0, 0, 0, state=state, weight=weight, **budgets.get(job, {})))
        return result

    def waiting(self) -> list[tuple[str, int, float]]:
        """Per domain, over the running jobs: (domain, tasks not finished, the earliest time one
        of them last moved). What `hutch watch` flags as stale; paused and cancelled jobs wait
        on purpose and are left out."""
        rows = self.db.execute(
            "SELECT t.domain, COUNT(*), MIN(t.updated_at) FROM tasks t LEFT JOIN jobs j ON j.name = t.job "
            "WHERE t.state NOT IN ('stored', 'dead') AND COALESCE(j.state, 'running') = 'running' "
            "GROUP BY t.domain"
        )
        return [(str(row[0]), int(row[1]), float(row[2])) for row in rows]

    def _stream(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        """Rows of a read of any length, in constant memory on either backend."""
        if self.path is None:
            return iter(self.db.stream(sql, params))
        return iter(self.db.execute(sql, params))

    def items(self, job: str) -> Iterator[dict[str, Any]]:
        """A job's items, streamed; `url` is always the URL submitted (after redirects too)."""
        for row in self._stream("SELECT url, fields FROM items WHERE job = ? ORDER BY url", (job,)):
            fields = json.loads(row["fields"])
            yield {"url": row["url"], **{k: v for k, v in fields.items() if k != "url"}}

    def timeline(self, task_id: str) -> dict[str, Any] | None:
        """Everything the store knows of one task's life, for `hutch trace`: its row, its
        attempts in order, its item's time, and its dead letters (with replays). None when
        no such task was ever recorded."""
        task = self.db.execute(
            "SELECT id, job, url, domain, state, attempts, last_outcome, created_at, updated_at, rescues, message "
            "FROM tasks WHERE id = ?",
            (task_id,),
        ).fetchone()
        if task is None:
            return None
        item = self.db.execute("SELECT stored_at, status FROM items WHERE task_id = ?", (task_id,)).fetchone()
        dead = self.db.execute(
            "SELECT dead_at, stage, reason, detail, replayed_at, purged_at FROM dead "
            "WHERE task_id = ? ORDER BY dead_at",
            (task_id,),
        ).fetchall()
        return {
            "task": dict(task),
            "attempts": self.attempts(task_id),
            "item": dict(item) if item is not None else None,
            "dead": [dict(row) for row in dead],
        }

    def attempts(self, task_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM attempts WHERE task_id = ? ORDER BY at", (task_id,)).fetchall()
        return [dict(row) for row in rows]

    # -- the dead-letter ledger -----------------------------------------------------------

    @staticmethod
    def _dead_filter(
        job: str | None, domain: str | None, reason: str | None, stage: str | None = None
    ) -> tuple[str, list[Any]]:
        where = ["replayed_at IS NULL", "purged_at IS NULL"]
        params: list[Any] = []
        for column, value in (("job", job), ("domain", domain), ("reason", reason), ("stage", stage)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(where), params

    def dead_entries(
        self,
        job: str | None = None,
        domain: str | None = None,
        reason: str | None = None,
        stage: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Dead letters neither replayed nor purged, oldest first."""
        where, params = self._dead_filter(job, domain, reason, stage)
        query = (
            "SELECT id, task_id, job, url, domain, stage, reason, detail, attempts, dead_at "
            f"FROM dead WHERE {where} ORDER BY id"
        )
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return [dict(row) for row in self.db.execute(query, params)]

    def dead_groups(
        self, job: str | None = None, domain: str | None = None, reason: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = self._dead_filter(job, domain, reason)
        rows = self.db.execute(
            f"SELECT reason, domain, COUNT(*) AS count FROM dead WHERE {where} "
            "GROUP BY reason, domain ORDER BY count DESC, reason, domain",
            params,
        )
        return [dict(row) for row in rows]

    def dead_entry(self, entry_id: int) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM dead WHERE id = ?", (entry_id,)).fetchone()
        return None if row is None else dict(row)

    def mark_replayed(self, entry_ids: Iterable[int]) -> None:
        """These dead letters were republished (confirmed): their tasks are queued again."""
        now = time.time()
        with self._tx():
            for entry_id in entry_ids:
                row = self.db.execute(
                    "UPDATE dead SET replayed_at = ? WHERE id = ? AND replayed_at IS NULL RETURNING task_id",
                    (now, entry_id),
                ).fetchone()
                if row is not None and row[0] is not None:
                    # A replayed task gets its rescues back along with its place in the queue.
                    if self._transition_in_tx(row[0], "queued", None):
                        self.db.execute("UPDATE tasks SET rescues = 0, due_at = NULL WHERE id = ?", (row[0],))

    def mark_purged(self, entry_ids: Iterable[int]) -> int:
        now = time.time()
        with self._tx():
            return sum(
                self.db.execute(
                    "UPDATE dead SET purged_at = ? WHERE id = ? AND purged_at IS NULL AND replayed_at IS NULL",
                    (now, entry_id),
                ).rowcount
                for entry_id in entry_ids
            )

    def dead_letters(self, job: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM dead"
        params: tuple[str, ...] = ()
        if job is not None:
            query += " WHERE job = ?"
            params = (job,)
        return [dict(row) for row in self.db.execute(query + " ORDER BY id", params)]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, nested uses join the outer transaction."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        if not self.db.in_transaction:
            self.db.execute("BEGIN IMMEDIATE")
            self.outer = True

    def __exit__(self, exc_type: object, *_: object) -> None:
        if not self.outer:
            return
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except Exception:  # a full disk often shows only here
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        # SQLite may have rolled back on its own already (a full disk, an I/O error).
        if self.db.in_transaction:
            with contextlib.suppress(Exception):
                self.db.execute("ROLLBACK")


T = TypeVar("T")


class AsyncStore:
    """The store for asyncio code: every call runs on one dedicated thread, off the loop."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._store: Store | None = None

    async def open(self) -> AsyncStore:
        self._store = await self._run_raw(lambda: Store(self.location))
        return self

    async def _run_raw(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def run(self, fn: Callable[[Store], T]) -> T:
        store = self._store
        assert store is not None, "open() first"
        return await self._run_raw(lambda: fn(store))

    async def run_again_on_conflict(self, fn: Callable[[Store], T]) -> T:
        """`run` for a write that may be run again: a PostgreSQL deadlock or serialization
        failure (`is_conflict`) runs it again, up to `CONFLICT_TRIES` times, a moment apart.
        A process that writes beside the storer (`hutch run` submitting while items are
        stored) locks task rows in another order than the storer's group commits."""
        for attempt in range(1, CONFLICT_TRIES + 1):
            try:
                return await self.run(fn)
            except Exception as exc:
                if attempt == CONFLICT_TRIES or not is_conflict(exc):
                    raise
                await asyncio.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._store is not None:
            store = self._store
            self._store = None
            await self._run_raw(store.close)
        self._executor.shutdown(wait=True)


def _chunks(values: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]
