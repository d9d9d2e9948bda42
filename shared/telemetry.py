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
    """Install a TracerProvider for this process from the OTEL_* variables (once)."""
    global _configured
    if _configured or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    _configured = True
    name = os.environ.get("OTEL_SERVICE_NAME") or f"hutch-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER")
    if exporter_name is None:
        has_endpoint = any(
            os.environ.get(var)
            for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        exporter_name = "otlp" if has_endpoint else "none"
    for exporter in (part.strip() for part in exporter_name.split(",")):
        if exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    trace.set_tracer_provider(provider)
    return provider


def tracer() -> trace.Tracer:
    return trace.get_tracer("hutch")


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
