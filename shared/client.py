"""A client for synchronous Python (an Airflow task, a Django view, a notebook).

    from hutch.client import Client

    with Client() as hutch:                       # settings from HUTCH_* variables, as the CLI
        sent = hutch.submit("catalogue", urls, spec={"fields": {"title": "css:title::text"}})
        progress = hutch.wait("catalogue", timeout=3600)
        for item in hutch.items("catalogue"):
            ...

It needs no event loop: it speaks to the broker with pika's blocking connection, the way any
producer may (submissions on the intake queue, job controls on the `jobs` stream, each with a
publisher confirm), and reads progress and items from the store where it can be opened (the
machine of the storer, for the embedded SQLite store). With `HUTCH_API_URL` set it goes
through the API instead (`hutch.remote`, over HTTP with `HUTCH_API_TOKEN`) and needs neither
the broker nor the store; the URLs are checked here first all the same, then streamed as one
file, so a job is accepted whole or refused whole. Over the API a control (pause, resume,
cancel, weight) for a job the storer has not recorded yet is refused (`InvalidInput`), as the
CLI refuses one for a job its store does not know: after `submit`, wait for `status(job).total`
to be above 0 first. The checks and errors are the CLI's:
an invalid job name, URL or spec raises `InvalidInput` before anything is sent, naming it;
a broker that cannot be reached or refuses a message raises `Unavailable`; a wait that runs
out raises `TimedOut`, with the job's progress at that moment.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions
from pydantic import ValidationError

from hutch.amqp import topology_for
from hutch.models import JobControl, Model, Spec, Submission
from hutch.remote import Remote, RemoteError, RemoteRefused
from hutch.services.control.jobs import JobControlError, control_record
from hutch.services.control.submit import JobNameError, check_job_name, submissions
from hutch.services.parser.spec import SpecError, parse_spec, spec_document
from hutch.services.proxy_manager.pool import TIERS
from hutch.settings import Settings
from hutch.store import Store, StoreError, store_exists
from hutch.topology import INTAKE_KEY
from hutch.urls import InvalidURL

T = TypeVar("T")


class HutchError(Exception):
    """Anything the client refuses or cannot do; the message says what and why."""


class InvalidInput(HutchError, ValueError):
    """A job name, URL, spec or weight that would be refused: nothing was sent."""


class Unavailable(HutchError):
    """The broker or the store cannot be reached, or the broker did not take a message."""


class TimedOut(HutchError):
    """`wait` ran out of time; `progress` is where the job stood."""

    def __init__(self, message: str, progress: Progress) -> None:
        super().__init__(message)
        self.progress = progress


@dataclass(frozen=True)
class Progress:
    """A job's counts as the store has them (the `hutch status` row)."""

    job: str
    total: int
    stored: int
    dead: int
    pending: int
    state: str

    @property
    def done(self) -> bool:
        """Every task recorded so far is stored or dead (or the job was cancelled)."""
        return (self.total > 0 and self.pending == 0) or self.state == "cancelled"


class Client:
    def __init__(self, settings: Settings | None = None, *, timeout: float | None = None) -> None:
        self.settings = settings or Settings()
        self.timeout = timeout if timeout is not None else self.settings.publish_timeout
        self.topology = topology_for(self.settings)
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None

    # -- the broker ------------------------------------------------------------------------

    def _publish(self, exchange: str, routing_key: str, message: Model) -> None:
        channel = self._open()
        try:
            channel.basic_publish(
                exchange,
                routing_key,
                message.model_dump_json(exclude_none=True).encode(),
                pika.BasicProperties(content_type="application/json", delivery_mode=2),
                mandatory=True,
            )
        except pika.exceptions.UnroutableError:
            where = routing_key or exchange
            raise Unavailable(f"the broker has no queue for {where!r}: has a service declared it yet?") from None
        except pika.exceptions.NackError:
            raise Unavailable("the broker refused the message (nack)") from None
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise Unavailable(f"lost the broker at {self.settings.safe_amqp_url}: {type(exc).__name__}") from None

    def _open(self) -> Any:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        nodes = []
        for url in self.settings.amqp_urls:  # a cluster's nodes: pika tries them in turn
            parts = urlsplit(url)  # the query holds aio-pika's options, not pika's
            parameters = pika.URLParameters(urlunsplit(parts._replace(query="")))
            parameters.blocked_connection_timeout = self.timeout
            parameters.socket_timeout = self.timeout
            nodes.append(parameters)
        try:
            self._connection = pika.BlockingConnection(nodes)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        except pika.exceptions.AMQPError as exc:
            where = self.settings.safe_amqp_url
            raise Unavailable(f"cannot reach RabbitMQ at {where}: {type(exc).__name__}") from None
        return self._channel

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except pika.exceptions.AMQPError:
                pass

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- submitting and controlling ----------------------------------------------------------

    def submit(
        self, job: str, urls: Iterable[str], spec: Spec | dict[str, Any] | None = None, tier_floor: str | None = None
    ) -> int:
        """Send `urls` as job `job`; how many URLs went (repeats within a message of 1,000 go
        once). All are checked first, so an invalid one (named by its position) sends
        nothing. A URL the job already has is recorded once and not fetched again (the
        storer drops it)."""
        try:
            check_job_name(job)
        except JobNameError as exc:
            raise InvalidInput(str(exc)) from None
        if tier_floor is not None and tier_floor not in TIERS:
            raise InvalidInput(f"tier_floor {tier_floor!r} is none of {', '.join(TIERS)}")
        position = 0

        def numbered() -> Iterator[str]:
            nonlocal position
            for position, url in enumerate(urls, 1):  # noqa: B007 (read when a URL is refused)
                yield url

        checked = _spec(spec)
        try:
            messages = list(submissions(job, numbered(), checked, tier_floor, self.settings.max_url_bytes))
        except InvalidURL as exc:
            raise InvalidInput(f"URL {position}: {exc}") from None
        if self.settings.api_url:
            return self._submit_by_api(job, messages, checked, tier_floor)
        for submission in messages:
            self._publish(self.topology.work, INTAKE_KEY, submission)
        return sum(len(submission.urls) for submission in messages)

    def _submit_by_api(self, job: str, messages: list[Submission], spec: Spec | None, tier_floor: str | None) -> int:
        """The checked URLs, streamed to the API as one file: accepted whole or refused whole."""
        spec_text = json.dumps(spec_document(spec)) if spec is not None else None
        with tempfile.TemporaryFile() as file:
            for submission in messages:
                file.write("".join(f"{url}\n" for url in submission.urls).encode())
            file.seek(0)
            sent = self._remote(lambda r: r.submit_file(job, file, spec_text, tier_floor))
        return int(sent["urls"])

    def _remote(self, call: Callable[[Remote], T]) -> T:
        """One call to the API, its errors as the client's."""
        try:
            with Remote(self.settings, timeout=max(self.timeout, 30.0)) as remote:
                return call(remote)
        except RemoteRefused as exc:
            if exc.status == 401:
                raise Unavailable(str(exc)) from None
            raise InvalidInput(str(exc)) from None
        except RemoteError as exc:
            raise Unavailable(str(exc)) from None

    def pause(self, job: str) -> None:
        self._control(job, "pause")

    def resume(self, job: str, budget: float | None = None) -> None:
        """Resume a paused job; `budget`: its proxy budget from now on (needed, above what it
        spent, when its budget paused it; the store's check is the CLI's and the API's)."""
        self._control(job, "resume", budget=budget)

    def cancel(self, job: str) -> None:
        self._control(job, "cancel")

    def weight(self, job: str, weight: float) -> None:
        self._control(job, "weight", weight)

    def _control(self, job: str, action: Any, weight: float | None = None, budget: float | None = None) -> None:
        try:
            control: JobControl = control_record(job, action, weight, budget)
        except (JobControlError, JobNameError) as exc:
            raise InvalidInput(str(exc)) from None
        if self.settings.api_url:
            self._remote(lambda r: r.control(job, action, weight, budget))
            return
        self._publish("", self.topology.jobs, control)  # a stream, published to like a queue

    # -- reading (the store) ----------------------------------------------------------------

    def _store(self) -> Store:
        location = self.settings.store_location
        try:
            if not store_exists(location):
                raise Unavailable(f"no store at {location} on this machine: progress and items are read there")
            return Store(location)
        except StoreError as exc:
            raise Unavailable(str(exc)) from None

    def status(self, job: str) -> Progress:
        """The job's counts now; all zero while the storer has recorded nothing of it yet."""
        if self.settings.api_url:
            return self._status_by_api(job)
        store = self._store()
        try:
            rows = store.counts(job)
        finally:
            store.close()
        if not rows:
            return Progress(job, 0, 0, 0, 0, "unknown")
        row = rows[0]
        return Progress(job, row.total, row.stored, row.dead, row.pending, row.state)

    def _status_by_api(self, job: str) -> Progress:
        try:
            check_job_name(job)
        except JobNameError as exc:
            raise InvalidInput(str(exc)) from None

        def row_of(remote: Remote) -> dict[str, Any] | None:
            try:
                return remote.job(job)
            except RemoteRefused as exc:
                if exc.status == 404:  # not recorded yet
                    return None
                raise

        row = self._remote(row_of)
        if row is None:
            return Progress(job, 0, 0, 0, 0, "unknown")
        return Progress(job, row["total"], row["stored"], row["dead"], row["pending"], row["state"])

    def wait(self, job: str, timeout: float, poll: float = 1.0, expected: int | None = None) -> Progress:
        """Block until every recorded task of `job` is stored or dead (and at least `expected`
        are recorded, e.g. what `submit` returned); `TimedOut` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.status(job)
            if progress.done and (expected is None or progress.total >= expected):
                return progress
            if time.monotonic() >= deadline:
                raise TimedOut(
                    f"job {job!r} not done after {timeout:g}s: {progress.stored} stored, {progress.dead} dead, "
                    f"{progress.pending} pending of {progress.total}",
                    progress,
                )
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def items(self, job: str) -> Iterator[dict[str, Any]]:
        """The job's items, one dict each (`url` and the fields), as `hutch export` writes them."""
        if self.settings.api_url:
            remote = Remote(self.settings, timeout=max(self.timeout, 30.0))
            try:
                for line in remote.items(job):
                    yield json.loads(line)
            except RemoteError as exc:
                raise Unavailable(str(exc)) from None
            finally:
                remote.close()
            return
        store = self._store()
        try:
            yield from store.items(job)
        finally:
            store.close()


def _spec(spec: Spec | dict[str, Any] | None) -> Spec | None:
    if spec is None or isinstance(spec, Spec):
        return spec
    try:
        return parse_spec(spec)
    except (SpecError, ValidationError) as exc:
        raise InvalidInput(f"invalid spec: {exc}") from None
