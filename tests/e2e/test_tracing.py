"""One task is one trace: from the submit, through every service, to the store.

The services export spans over OTLP/HTTP (configured only by the standard OTEL_* variables)
to a receiver in this test, which decodes them with the OTLP protobuf definitions.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hutch_sandbox import Sandbox
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    task_id: str | None


class Receiver:
    """A minimal OTLP/HTTP trace receiver on loopback."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        task = next(
                            (a.value.string_value for a in span.attributes if a.key == "hutch.task.id"), None
                        )
                        self.spans.append(
                            ReceivedSpan(
                                attrs.get("service.name", "?"),
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                span.name,
                                task,
                            )
                        )


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()


@pytest.fixture
def extra_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


async def test_every_span_of_a_task_shares_one_trace_from_submit_to_store(
    settings: Settings, sandbox: Sandbox, services: Services, receiver: Receiver, extra_env: dict[str, str]
) -> None:
    urls = sandbox.urls()[:12]
    urls_file = settings.data_dir / "urls.txt"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    urls_file.write_text("\n".join(urls) + "\n")
    env = {**settings.to_env(os.environ), **extra_env}
    submit = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from hutch.services.control.cli import main; main()",
        "submit", str(urls_file), "--job", "traced",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(submit.communicate(), 60)
    assert submit.returncode == 0, err.decode()
    await services.wait_done("traced", timeout=60)
    store = Store(settings.store_location)
    try:
        stored = [t for t in store.tasks("traced") if t["state"] == "stored"]
    finally:
        store.close()
    assert stored
    wanted = {"hutch-control", "hutch-governor", "hutch-fetcher", "hutch-parser", "hutch-storer"}
    by_task: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for _ in range(100):  # the exporters flush every 200 ms
        with receiver.lock:
            by_task.clear()
            for span in receiver.spans:
                if span.task_id:
                    by_task[span.task_id].append(span)
        if all(wanted <= {s.service for s in by_task[t["id"]]} for t in stored):
            break
        await asyncio.sleep(0.1)
    for task in stored:
        spans = by_task[task["id"]]
        assert wanted <= {s.service for s in spans}, (task["url"], {s.service for s in spans})
        assert len({s.trace_id for s in spans}) == 1, task["url"]
        roots = [s for s in spans if not s.parent_id]
        assert [r.service for r in roots] == ["hutch-control"], task["url"]
    assert len({by_task[t["id"]][0].trace_id for t in stored}) == len(stored)
