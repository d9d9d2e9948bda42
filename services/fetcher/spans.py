"""The fetch span: one OpenTelemetry HTTP client span per attempt, in the task's trace.

Named and attributed after OpenTelemetry's HTTP semantic conventions (`GET`, kind CLIENT,
`http.request.method`, `url.full`, `server.address`, `server.port`,
`http.response.status_code`, `error.type`), plus Hutch's own: the job, task, domain and
attempt, the proxy's id and tier (never its URL), and the failure policy's outcome. Each
attempt's span links to the previous attempt's (its id travels in the task's history), so
a task retried twice shows three fetch spans chained by links in one trace. With no
exporter configured nothing is built (`telemetry.enabled()`), and the attempt records no
span id; the task's trace id is recorded either way.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, TraceFlags

from hutch import telemetry
from hutch.models import Lease, Task
from hutch.services.fetcher.policy import FetchResult


def safe_url(url: str) -> str:
    """`url` without credentials (user and password in its authority)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def fetch_span(task: Task, lease: Lease, url: str) -> contextlib.AbstractContextManager[trace.Span]:
    if not telemetry.enabled():
        return contextlib.nullcontext(trace.INVALID_SPAN)
    parts = urlsplit(url)
    links = []
    previous = next((a.span_id for a in reversed(task.history) if a.span_id), None)
    if previous is not None:
        before = SpanContext(int(task.trace_id, 16), int(previous, 16), True, TraceFlags(TraceFlags.SAMPLED))
        links.append(Link(before, {"hutch.link": "previous attempt"}))
    attributes: dict[str, str | int] = {
        "http.request.method": "GET",
        "url.full": safe_url(url),
        "server.address": parts.hostname or "",
        **task.span_attributes(),
        "hutch.attempt": task.attempts + 1,
        "hutch.proxy.tier": lease.tier or "direct",
    }
    if parts.port is not None:
        attributes["server.port"] = parts.port
    if lease.proxy_id is not None:
        attributes["hutch.proxy.id"] = lease.proxy_id
    return telemetry.task_span(
        "GET",
        task.trace_id,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        links=links,
    )


def finish(span: trace.Span, result: FetchResult) -> str | None:
    """Record what the attempt got on its span; the span's id (16 hex digits), or None."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    span.set_attribute("hutch.outcome", result.outcome)
    if result.status is not None:
        span.set_attribute("http.response.status_code", result.status)
    if result.outcome != "ok":
        span.set_attribute("error.type", result.outcome)
        span.set_status(trace.Status(trace.StatusCode.ERROR, result.outcome))
    return f"{context.span_id:016x}"
