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

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_configured = False
_tracing = False  # a provider is installed that hands spans to someone
_tracer: trace.Tracer | None = None


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
        force=True,
    )
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
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
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


def extract(headers: Mapping[str, Any] | None) -> Context:
    """Read trace context from AMQP headers; header values may arrive as bytes."""
    carrier: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str):
            carrier[key] = value
    return propagate.extract(carrier)
