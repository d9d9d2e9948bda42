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
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from hutch.models import task_id
from hutch.settings import Settings
from hutch.store import Store

from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    task_id: str | None
    kind: int = 0
    attributes: tuple[tuple[str, object], ...] = ()
    links: tuple[str, ...] = ()  # span ids linked to

    def attribute(self, key: str) -> object:
        return dict(self.attributes).get(key)


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
                        values = tuple(
                            (a.key, a.value.string_value if a.value.HasField("string_value") else a.value.int_value)
                            for a in span.attributes
                        )
                        self.spans.append(
                            ReceivedSpan(
                                attrs.get("service.name", "?"),
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                span.name,
                                task,
                                span.kind,
                                values,
                                tuple(link.span_id.hex() for link in span.links),
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
    # `hutch submit` sends the URLs in submissions on the intake queue, each in a trace of its
    # own; each task's trace begins where the storer publishes the task, linked to that.
    wanted = {"hutch-governor", "hutch-fetcher", "hutch-parser", "hutch-storer"}
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
        assert [r.service for r in roots] == ["hutch-storer"], task["url"]
        (link,) = roots[0].links
        with receiver.lock:
            (intake,) = [s for s in receiver.spans if s.span_id == link]
            submitted = {s.service for s in receiver.spans if s.trace_id == intake.trace_id}
        assert intake.service == "hutch-storer" and "hutch-control" in submitted, (intake, submitted)
    assert len({by_task[t["id"]][0].trace_id for t in stored}) == len(stored)


async def test_each_attempt_is_an_http_client_span_linked_to_the_one_before(
    settings: Settings, sandbox: Sandbox, services: Services, receiver: Receiver
) -> None:
    url = f"{sandbox.sites['alpha'].base_url}/flaky/linked?fail=2&code=500"
    await submit_urls(settings, "linked", [url])
    await services.wait_done("linked", timeout=60)
    tid = task_id("linked", url)
    store = Store(settings.store_location)
    try:
        attempts = store.attempts(tid)
    finally:
        store.close()
    assert [a["outcome"] for a in attempts] == ["server_error", "server_error", "ok"]
    spans: list[ReceivedSpan] = []
    for _ in range(100):
        with receiver.lock:
            spans = [s for s in receiver.spans if s.task_id == tid]
        if len([s for s in spans if s.name == "GET"]) == 3 and any(s.service == "hutch-storer" for s in spans):
            break
        await asyncio.sleep(0.1)
    assert len({s.trace_id for s in spans}) == 1
    assert {a["trace_id"] for a in attempts} == {spans[0].trace_id}  # the store's trace id is the spans'
    fetches = sorted((s for s in spans if s.name == "GET"), key=lambda s: s.attribute("hutch.attempt"))  # type: ignore[arg-type, return-value]
    assert [s.span_id for s in fetches] == [a["span_id"] for a in attempts]
    assert [s.attribute("http.response.status_code") for s in fetches] == [500, 500, 200]
    assert [s.attribute("hutch.outcome") for s in fetches] == ["server_error", "server_error", "ok"]
    assert all(s.kind == 3 for s in fetches)  # SPAN_KIND_CLIENT
    assert all(s.attribute("url.full") == url and s.attribute("http.request.method") == "GET" for s in fetches)
    assert [s.links for s in fetches] == [(), (fetches[0].span_id,), (fetches[1].span_id,)]
    domain = urlsplit(url).netloc
    for span in spans:  # every span about the task says which job, domain and attempt
        assert span.attribute("hutch.job") == "linked", span
        assert span.attribute("hutch.domain") == domain, span
        assert isinstance(span.attribute("hutch.attempt"), int), span
