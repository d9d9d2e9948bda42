"""PostgreSQL under the store: a connection that the store's SQL uses as it uses sqlite3's.

The store (`hutch.store`) writes one dialect: SQLite's `?` placeholders, `BEGIN IMMEDIATE`,
rows readable by position and by name. `PgConnection` takes that dialect to PostgreSQL
(psycopg 3) so that every statement stays in one place:

- `?` becomes `%s` (and a literal `%` is doubled), once per distinct statement;
- `BEGIN IMMEDIATE` becomes `BEGIN`: the store writes in READ COMMITTED, where each of its
  updates is guarded by the state it moves from, so concurrent writers cannot undo each
  other (the same guard that makes a redelivered message change nothing);
- the connection is in autocommit outside the store's explicit transactions, and opened
  again on first use after it broke (the storer's write loop retries a group after an
  outage, as it does for a locked or full SQLite file);
- `pg_ddl` turns the schema's SQLite types into PostgreSQL's: `REAL` (a 4-byte float in
  PostgreSQL, too coarse for the timestamps the reconciler compares exactly) becomes
  `DOUBLE PRECISION`, and the dead-letter ledger's autoincrement key a `BIGSERIAL`.

psycopg is imported on first use (about 90 ms), so a process on SQLite never pays for it.

The schema version lives in a one-row table, `hutch_schema`, read and raised under an
advisory lock, so processes opening a new database at once migrate it once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

SCHEMES = ("postgresql://", "postgres://")
# pg_advisory_xact_lock's key for migrations: any constant that no other program uses.
_MIGRATION_LOCK = 0x68757463  # "hutc"


def is_postgres(location: str) -> bool:
    return location.startswith(SCHEMES)


class Row:
    """A result row read by position (`row[0]`) or by column name (`row["job"]`), and
    convertible with `dict(row)`, like `sqlite3.Row`."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int):
            return self._values[key]
        return self._values[self._index[key]]

    def keys(self) -> list[str]:
        return list(self._index)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Any:
        return iter(self._values)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    index = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(index, values)


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """One statement of the store's dialect in psycopg's."""
    if sql == "BEGIN IMMEDIATE":
        return "BEGIN"
    return sql.replace("%", "%%").replace("?", "%s")


_TYPES = [
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
]


def pg_ddl(statement: str) -> str:
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


def _text_safe(params: Sequence[Any] | None) -> Sequence[Any] | None:
    """PostgreSQL's text cannot hold NUL, which SQLite's can: a NUL in a free-text value (a
    dead letter's detail quoting a response) becomes U+FFFD rather than failing the write."""
    if params and any(isinstance(p, str) and "\x00" in p for p in params):
        return [p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params]
    return params


class PgConnection:
    """The part of `sqlite3.Connection` the store uses, on one psycopg connection."""

    def __init__(self, url: str, connect_timeout: float = 10.0) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        # Keepalives and a user timeout: a statement on a link that went dead fails within
        # about 30 s (an outage, retried) instead of waiting out the kernel's ~15 minutes.
        conn: psycopg.Connection[Any] = psycopg.connect(
            self.url,
            autocommit=True,
            row_factory=_rows,
            connect_timeout=max(1, int(self.connect_timeout)),
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            tcp_user_timeout=30_000,
        )
        # An item is acked after its commit: the commit must be on disk when it returns,
        # whatever the server's default says.
        conn.execute("SET synchronous_commit TO on")
        return conn

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        if self._conn.broken or self._conn.closed:
            return False
        return self._conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def _live(self) -> psycopg.Connection[Any]:
        # A connection that broke is replaced on the next statement outside a transaction
        # (inside one, the statement fails, and the transaction is retried whole).
        if self._conn.broken or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] | None = ()) -> psycopg.Cursor[Any]:
        return self._live().execute(translate(sql), _text_safe(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        cursor = self._live().cursor()
        cursor.executemany(translate(sql), [_text_safe(row) or () for row in rows])
        return cursor

    def stream(self, sql: str, params: Sequence[Any] = ()) -> Iterator[Row]:
        """Rows one at a time as the server sends them (a plain `execute` loads them all):
        for reads of any length, such as a job's items. Nothing else may run on the
        connection until the stream is read to its end or closed."""
        return self._live().cursor().stream(translate(sql), params)

    def close(self) -> None:
        self._conn.close()

    # -- the schema version ------------------------------------------------------------

    def current_schema(self) -> int | None:
        """The schema version, read without a lock or DDL (so a read-only role or a standby
        can open a store that is up to date); None where there is no version table yet."""
        row = self.execute("SELECT to_regclass('hutch_schema')").fetchone()
        if row is None or row[0] is None:
            return None
        found = self.execute("SELECT version FROM hutch_schema").fetchone()
        return None if found is None else int(found[0])

    def lock_schema(self) -> int:
        """Inside a transaction: wait for the migration lock, then read the version."""
        self.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        self.execute("CREATE TABLE IF NOT EXISTS hutch_schema (version INTEGER NOT NULL)")
        row = self.execute("SELECT version FROM hutch_schema").fetchone()
        if row is None:
            self.execute("INSERT INTO hutch_schema (version) VALUES (0)")
            return 0
        return int(row[0])

    def set_schema(self, version: int) -> None:
        self.execute("UPDATE hutch_schema SET version = ?", (version,))


def outage_errors() -> tuple[type[BaseException], ...]:
    """psycopg's errors that no message causes: a lost or refused connection, a server
    shutting down, a full disk, a lock not granted in time, a deadlock or serialization
    failure (all OperationalError), a statement on a connection already closed
    (InterfaceError), a server that takes no writes (a standby, or one set read-only), and a
    role without rights or a table missing."""
    import psycopg
    from psycopg import errors

    return (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        errors.ReadOnlySqlTransaction,
        # A role that lost its rights or a schema gone: the operator's to fix, not a message's.
        errors.InsufficientPrivilege,
        errors.UndefinedTable,
    )
