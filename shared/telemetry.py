"""Tracing and logging set-up, and the one helper that carries trace context in headers.

One task is one trace: every publish injects the W3C `traceparent` into the message
headers and every consume extracts it, so the spans of submit, each release, each fetch
attempt, the parse and the store hang under one trace id across processes. The SDK is
configured from the standard OTel variables: `OTEL_TRACES_EXPORTER` (`otlp`, `console` or
`none`; `otlp` is the default when `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, else `none`), `OTEL_SERVICE_NAME`,
`OTEL_SDK_DISABLED`, and the exporter's own `OTEL_EXPORTER_OTLP_*` variables.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Protocol

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link

_configured = False
_tracing = False  # a provider is installed that hands spans to someone
_tracer: trace.Tracer | None = None


class About(Protocol):
    """What a message being handled is about (a task): what its log lines carry."""

    def span_attributes(self) -> dict[str, str | int]: ...

    def trace(self) -> str | None: ...


# The message being handled, for JSON log lines: the AMQP layer sets it around each handler
# (`about`), only when JSON logs are on, so that text logs cost nothing per message.
_about: contextvars.ContextVar[About | None] = contextvars.ContextVar("hutch_about", default=None)
_json_logs = False


def json_logs() -> bool:
    """Whether this process writes JSON log lines (`HUTCH_LOG_FORMAT=json`)."""
    return _json_logs


@contextlib.contextmanager
def about(subject: About | None) -> Iterator[None]:
    """Log lines written inside carry what `subject` is about (JSON logs)."""
    if not _json_logs or subject is None:
        yield
        return
    token = _about.set(subject)
    try:
        yield
    finally:
        _about.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, service, logger, message, the exception if any,
    and the job, task, domain, attempt and trace id of the message being handled."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        subject = _about.get()
        if subject is not None:
            for key, value in subject.span_attributes().items():
                line[key.removeprefix("hutch.").replace(".", "_")] = value
            found = subject.trace()
            if found:
                line["trace_id"] = found
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = f"{span.trace_id:032x}"
            line["span_id"] = f"{span.span_id:016x}"
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(service: str, level: str = "INFO", log_format: str = "text") -> None:
    global _json_logs
    _json_logs = log_format == "json"
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # aio-pika logs every reconnect attempt with a traceback at WARNING; one line is enough.
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def setup_tracing(service: str, extra_processor: SpanProcessor | None = None) -> TracerProvider | None:
    """Install a TracerProvider for this process from the OTEL_* variables (once).

    With no exporter (and no extra processor) nothing is installed: every span would be built
    and thrown away, which costs a busy service about a tenth of its time for nothing. The
    AMQP layer then skips spans and trace headers altogether (`enabled()` is False).
    """
    global _configured, _tracing
    if _configured or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    _configured = True
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER")
    if exporter_name is None:
        has_endpoint = any(
            os.environ.get(var) for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        exporter_name = "otlp" if has_endpoint else "none"
    processors: list[SpanProcessor] = []
    for exporter in (part.strip() for part in exporter_name.split(",")):
        if exporter == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if extra_processor is not None:
        processors.append(extra_processor)
    if not processors:
        return None
    name = os.environ.get("OTEL_SERVICE_NAME") or f"hutch-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}), id_generator=_TaskTraceIds())
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _tracing = True
    return provider


def enabled() -> bool:
    """Whether this process records spans (a provider with an exporter is installed)."""
    return _tracing


def tracer() -> trace.Tracer:
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("hutch")
    return _tracer


def inject(headers: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Write the current trace context into AMQP headers (W3C traceparent/tracestate)."""
    propagate.inject(headers)
    return headers


# The trace id a root span about to start should take (see `task_span`): read by the
# provider's id generator, which the SDK calls as the span starts.
_wanted_trace: contextvars.ContextVar[int | None] = contextvars.ContextVar("hutch_wanted_trace", default=None)


class _TaskTraceIds(RandomIdGenerator):
    """Random ids, except a root span's trace id when a task's trace is wanted."""

    def generate_trace_id(self) -> int:
        wanted = _wanted_trace.get()
        return wanted if wanted is not None else super().generate_trace_id()


@contextlib.contextmanager
def task_span(
    name: str, trace_id: str | None, carried: Context | None = None, **options: Any
) -> Iterator[trace.Span]:
    """A span about a task, in the task's one trace (`Task.trace_id`), made current.

    Under `carried` (a message's headers; else the current context) when that is in the
    task's trace already. Otherwise a root span that takes the task's trace id: where the
    task's trace begins (the storer publishing a submission's tasks, a submit), or a publish
    from a loop of a service's own. A root started under a span of another trace (the
    submission's, which carried many URLs) links to that span.
    """
    context = carried
    wanted: int | None = None
    if trace_id is not None:
        wanted = int(trace_id, 16)
        found = trace.get_current_span(carried).get_span_context()
        if found.is_valid and found.trace_id == wanted:
            wanted = None
        else:
            context = Context()
            if found.is_valid:
                options["links"] = [*options.get("links", ()), Link(found, {"hutch.link": "submitted by"})]
    token = _wanted_trace.set(wanted)
    try:
        span = tracer().start_span(name, context=context, **options)  # the trace id is drawn here
    finally:
        _wanted_trace.reset(token)
    with trace.use_span(span, end_on_exit=True):
        yield span


def extract(headers: Mapping[str, Any] | None) -> Context:
    """Read trace context from AMQP headers; header values may arrive as bytes."""
    carrier: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str):
            carrier[key] = value
    return propagate.extract(carrier)
