"""The API service (`hutch serve api`) in front of the five services, on the sandbox: bearer
auth, a bad submission refused whole with the field named, jobs inline and streamed, items as
JSON lines, controls, dead letters, traces, deletes, the generated OpenAPI document, and the
bounds on a request body (size and time).

The sandbox, the five services and the API are started once for the module; each test uses
jobs and sandbox URLs of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hutch_sandbox import Sandbox, load_config

from hutch.models import task_id
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings

from ..conftest import module_settings, service_env
from .conftest import HERE, Services, free_port, running_services

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "t0ken-for-tests-only"
SPEC = {"fields": {"title": "css:h1::text"}}
# The API's bounds on a request body, small here so that a test can cross them.
MAX_BODY = 1024 * 1024
BODY_TIMEOUT = 1.0
BOUNDARY = "hutch-test-boundary"
# Each test's slice of the sandbox's URLs, apart from the others': a site faults a URL by how
# many times it was asked for it, so a URL that one test alone fetches meets the same faults
# whatever ran before (none of these fails three attempts in a row from the first).
INLINE, FILE, CLI, CLIENT = slice(0, 40), slice(40, 70), slice(160, 180), slice(180, 195)
CAPPED_REFUSED, CAPPED_TAKEN, CHUNKED = slice(200, 210), slice(210, 220), slice(230, 235)
BUDGETED = slice(240, 245)


@pytest.fixture(scope="module")
def settings(
    amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    yield from module_settings(amqp_url, "api", tmp_path_factory, request)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox.yaml")) as box:
        yield box


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(settings: Settings, sandbox: Sandbox) -> AsyncIterator[Services]:
    async with running_services(settings, sandbox, {}) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(settings: Settings, services: Services) -> AsyncIterator[httpx.AsyncClient]:
    """The API as its own process beside the services; a client that sends the token."""
    port = free_port()
    env = service_env(
        settings,
        HUTCH_API_PORT=str(port),
        HUTCH_API_TOKEN=TOKEN,
        HUTCH_API_MAX_BODY_BYTES=str(MAX_BODY),
        HUTCH_API_BODY_TIMEOUT=str(BODY_TIMEOUT),
    )
    supervisor = Supervisor(env, fetchers=0, services=("api",), grace=settings.shutdown_grace)
    await supervisor.start()
    try:
        await supervisor.wait_ready(timeout=60)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:
            yield client
    finally:
        await supervisor.stop()


async def wait_finished(api: httpx.AsyncClient, job: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = await api.get(f"/jobs/{job}")
        if answer.status_code == 200 and answer.json()["finished"]:
            return dict(answer.json())
        await asyncio.sleep(0.3)
    raise AssertionError(f"job {job} not finished after {timeout:.0f}s: {answer.text}")


async def test_without_the_token_every_job_route_is_401_and_probes_and_the_document_stay_open(
    api: httpx.AsyncClient,
) -> None:
    async with httpx.AsyncClient(base_url=str(api.base_url)) as anonymous:
        for method, path in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/dead"), ("DELETE", "/jobs/x")):
            answer = await anonymous.request(method, path)
            assert answer.status_code == 401, (method, path, answer.text)
            assert "bearer token" in answer.json()["error"]
        wrong = await anonymous.get("/jobs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await anonymous.get("/healthz")).status_code == 200
        assert (await anonymous.get("/readyz")).text == "ready\n"
        assert (await anonymous.get("/openapi.json")).status_code == 200
        assert "hutch_api_requests_total" in (await anonymous.get("/metrics")).text
    assert (await api.get("/jobs")).status_code == 200


async def test_a_bad_submission_is_refused_whole_naming_the_field(api: httpx.AsyncClient, sandbox: Sandbox) -> None:
    good = sandbox.urls()[:3]
    cases = [
        ({"job": "bad", "urls": [*good[:2], "ftp://example.test/x", good[2]]}, "urls[2]"),
        ({"job": "bad", "urls": good, "spec": {"fields": {"t": "nonsense:x"}}}, "spec"),
        ({"job": "../etc", "urls": good}, "job"),
        ({"job": "bad", "urls": good, "tier_floor": "platinum"}, "tier_floor"),
        ({"job": "bad", "urls": []}, "urls"),
        ({"job": "bad", "urls": good, "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        answer = await api.post("/jobs", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["field"] == field, answer.json()
        assert field.split("[")[0] in answer.json()["error"]
    await asyncio.sleep(1.0)  # had anything gone out, the storer would have recorded it by now
    assert (await api.get("/jobs/bad")).status_code == 404


async def test_a_job_submitted_inline_completes_and_its_items_stream_as_json_lines(
    api: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    urls = sandbox.urls()[INLINE]
    missing = sandbox.sites["alpha"].base_url + "/status/404"
    answer = await api.post("/jobs", json={"job": "inline", "urls": [*urls, *urls[:5], missing], "spec": SPEC})
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"job": "inline", "urls": 41, "messages": 1}
    status = await wait_finished(api, "inline")
    assert status["total"] == 41 and status["stored"] + status["dead"] == 41 and status["dead"] >= 1

    async with api.stream("GET", "/jobs/inline/items") as streamed:
        assert streamed.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) async for line in streamed.aiter_lines() if line]
    assert len(lines) == status["stored"]
    assert {item["url"] for item in lines} <= set(urls)
    assert all(item["title"] for item in lines)
    as_csv = await api.get("/jobs/inline/items", params={"format": "csv"})
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(as_csv.text, newline="")))
    assert rows[0] == ["url", "title"] and len(rows) == 1 + status["stored"]

    dead = (await api.get("/dead", params={"job": "inline"})).json()
    [entry] = [e for e in dead["entries"] if e["url"] == missing]
    assert entry["reason"] == "not_found"
    whole = (await api.get(f"/dead/{entry['id']}")).json()
    assert whole["letter"]["task"]["url"] == missing
    trace = (await api.get("/trace", params={"job": "inline", "url": missing})).json()
    assert trace["task"]["state"] == "dead" and trace["timeline"][-1]["outcome"] == "not_found"
    by_id = await api.get(f"/tasks/{task_id('inline', urls[0])}/trace")
    assert by_id.status_code == 200 and by_id.json()["task"]["url"] == urls[0]
    replayed = await api.post("/dead/replay", json={"job": "inline", "reason": "not_found"})
    assert replayed.json() == {"replayed": 1, "skipped": 0}
    for _ in range(200):  # replayed, it is fetched again and dies again: a new letter
        if len((await api.get("/dead", params={"job": "inline"})).json()["entries"]) == 1:
            break
        await asyncio.sleep(0.1)
    [again] = (await api.get("/dead", params={"job": "inline"})).json()["entries"]
    assert again["id"] != entry["id"] and again["url"] == missing
    assert (await api.post("/dead/purge", json={})).json()["field"] == "all"
    assert (await api.post("/dead/purge", json={"job": "inline", "reason": "not_found"})).json() == {"purged": 1}

    gone = await api.delete("/jobs/inline")
    assert gone.status_code == 200 and gone.json()["tasks"] == 41
    assert (await api.get("/jobs/inline")).status_code == 404
    assert (await api.get("/jobs/inline/items")).status_code == 404


async def test_a_url_file_streamed_in_is_checked_whole_then_runs_and_controls_apply(
    api: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    urls = sandbox.urls()[FILE]
    text = "# a comment\n" + "\n".join(urls) + "\n"
    broken = text + "http://exa mple.test/\n"
    refused = await api.post("/jobs/file/urls", files={"urls": ("urls.txt", broken.encode())}, data={"spec": "x: ["})
    assert refused.status_code == 400 and refused.json()["field"] == "spec"
    refused = await api.post("/jobs/file/urls", files={"urls": ("urls.txt", broken.encode())})
    assert refused.status_code == 400 and refused.json()["field"] == "urls"
    assert "line 32" in refused.json()["error"]

    paused = await api.post("/jobs/file/pause")
    assert paused.status_code == 404  # not submitted yet: a typo pauses nothing silently
    answer = await api.post(
        "/jobs/file/urls",
        files={"urls": ("urls.txt", text.encode())},
        data={"spec": "fields:\n  title: 'css:h1::text'\n"},
    )
    assert answer.status_code == 202 and answer.json()["urls"] == 30
    for _ in range(300):  # until the storer recorded the job (at most 30 s)
        if (await api.get("/jobs/file")).status_code == 200:
            break
        await asyncio.sleep(0.1)
    weighted = await api.put("/jobs/file/weight", json={"weight": 2})
    assert weighted.status_code == 200 and weighted.json()["weight"] == 2
    assert (await api.put("/jobs/file/weight", json={"weight": -1})).json()["field"] == "weight"
    status = await wait_finished(api, "file")
    assert status["stored"] + status["dead"] == 30
    cancelled = await api.post("/jobs/file/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = await api.post("/jobs/file/resume")
    assert again.status_code == 409 and "cancelled" in again.json()["error"]
    domains = (await api.get("/domains", params={"top": 5})).json()
    assert domains["governors"] >= 1 and domains["domains"]


async def test_request_options_are_checked_and_a_resume_takes_a_new_proxy_budget(
    api: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    urls = sandbox.urls()[BUDGETED]
    owned = {**SPEC, "headers": {"Host": "elsewhere.test"}}
    refused = await api.post("/jobs", json={"job": "budgeted", "urls": urls, "spec": owned})
    assert refused.status_code == 400 and refused.json()["field"] == "spec"
    assert "headers: 'Host'" in refused.json()["error"]
    spec = {**SPEC, "headers": {"X-Job": "api"}, "cookies": {"sid": "api-session"}, "budget": 2.5}
    answer = await api.post("/jobs", json={"job": "budgeted", "urls": urls, "spec": spec})
    assert answer.status_code == 202
    for _ in range(300):  # until the storer recorded the job (at most 30 s)
        if (await api.get("/jobs/budgeted")).status_code == 200:
            break
        await asyncio.sleep(0.1)
    status = (await api.get("/jobs/budgeted")).json()
    assert (status["budget"], status["spent"], status["reason"]) == (2.5, 0.0, None)  # direct: nothing spent
    assert (await api.post("/jobs/budgeted/pause")).json()["state"] == "paused"
    bad = await api.post("/jobs/budgeted/resume", json={"budget": -1})
    assert bad.status_code == 400 and bad.json()["field"] == "budget"
    resumed = await api.post("/jobs/budgeted/resume", json={"budget": 4})
    assert resumed.status_code == 200
    assert (resumed.json()["state"], resumed.json()["budget"], resumed.json()["reason"]) == ("running", 4.0, None)
    finished = await wait_finished(api, "budgeted")
    assert finished["stored"] + finished["dead"] == len(urls)


def url_file_upload(urls: list[str], size: int) -> bytes:
    """A multipart body of exactly `size` bytes: the URL file `urls`, padded with a comment."""

    def framed(text: bytes) -> bytes:
        head = (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="urls"; filename="urls.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        )
        return head.encode() + text + f"\r\n--{BOUNDARY}--\r\n".encode()

    listed = ("\n".join(urls) + "\n").encode()
    padding = size - len(framed(b"#\n" + listed))
    assert padding >= 0
    body = framed(b"#" + b"." * padding + b"\n" + listed)
    assert len(body) == size
    return body


async def in_pieces(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """`body` as a stream: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def over_the_limit(answer: httpx.Response) -> None:
    assert answer.status_code == 413, answer.text
    assert answer.json() == {"error": answer.json()["error"], "field": None}
    assert str(MAX_BODY) in answer.json()["error"] and "HUTCH_API_MAX_BODY_BYTES" in answer.json()["error"]


async def test_an_upload_over_the_body_limit_is_413_and_nothing_of_it_is_submitted_while_one_at_it_runs(
    api: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    refused_urls, taken_urls = sandbox.urls()[CAPPED_REFUSED], sandbox.urls()[CAPPED_TAKEN]
    multipart = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    one_over = url_file_upload(refused_urls, MAX_BODY + 1)
    # Declared over the limit: refused before the body is read.
    over_the_limit(await api.post("/jobs/capped/urls", content=one_over, headers=multipart))
    # Chunked, with no length: refused once the bytes counted pass the limit.
    over_the_limit(await api.post("/jobs/capped/urls", content=in_pieces(one_over), headers=multipart))
    # Far over it, more than the sockets buffer: the client, still sending, reads the answer, not a reset.
    big = ("\n".join(refused_urls) + "\n").encode() + b"#" * (8 * MAX_BODY)
    over_the_limit(await api.post("/jobs/capped/urls", files={"urls": ("urls.txt", big)}))

    at_the_limit = url_file_upload(taken_urls, MAX_BODY)
    answer = await api.post("/jobs/capped/urls", content=in_pieces(at_the_limit), headers=multipart)
    assert answer.status_code == 202, answer.text
    assert answer.json()["urls"] == len(taken_urls)
    status = await wait_finished(api, "capped")
    assert status["total"] == len(taken_urls), status  # none of the refused uploads' URLs
    async with api.stream("GET", "/jobs/capped/items") as streamed:
        stored = {json.loads(line)["url"] async for line in streamed.aiter_lines() if line}
    assert stored and stored <= set(taken_urls)


async def test_a_json_body_over_the_limit_sent_chunked_is_413_and_submits_nothing(
    api: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    urls = sandbox.urls()[CHUNKED]
    # Valid JSON (white space between tokens), over the limit only by its padding.
    body = json.dumps({"job": "chunked", "urls": urls})[:-1].encode() + b" " * MAX_BODY + b"}"
    json.loads(body)
    answer = await api.post("/jobs", content=in_pieces(body), headers={"content-type": "application/json"})
    over_the_limit(answer)
    await asyncio.sleep(1.0)  # had anything gone out, the storer would have recorded it by now
    assert (await api.get("/jobs/chunked")).status_code == 404


async def slow_body(base_url: str, dribble: bool) -> tuple[float, bytes]:
    """A POST /jobs whose head is whole and whose body stops short (or comes a byte every
    0.1 s, each read by the API well within any per-read timeout): the seconds until the API
    answered and closed, and what it sent."""
    parts = httpx.URL(base_url)
    reader, writer = await asyncio.open_connection(parts.host, parts.port)
    head = (
        "POST /jobs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n"
    )
    writer.write(head.encode() + b'{"job": "stalled", "urls": [')
    await writer.drain()
    began = time.monotonic()

    async def send_a_byte_at_a_time() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.1)
                writer.write(b" ")
                await writer.drain()

    dribbling = asyncio.create_task(send_a_byte_at_a_time()) if dribble else None
    answer = b""
    try:
        async with asyncio.timeout(BODY_TIMEOUT + 10):
            with contextlib.suppress(ConnectionResetError):
                while chunk := await reader.read(65536):
                    answer += chunk
        return time.monotonic() - began, answer
    finally:
        if dribbling is not None:
            dribbling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dribbling
        writer.close()


@pytest.mark.parametrize("dribble", [False, True], ids=["stalled", "dribbled"])
async def test_a_body_that_does_not_arrive_within_the_deadline_is_408_and_the_connection_closes(
    api: httpx.AsyncClient, dribble: bool
) -> None:
    took, answer = await slow_body(str(api.base_url), dribble)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert BODY_TIMEOUT - 0.1 <= took < BODY_TIMEOUT + 5, took  # the read ended at EOF: closed
    error = json.loads(body)
    assert error["field"] is None and "HUTCH_API_BODY_TIMEOUT" in error["error"], error
    assert (await api.get("/jobs/stalled")).status_code == 404


async def test_the_generated_openapi_document_is_valid_and_documents_every_route_and_the_bearer_scheme(
    api: httpx.AsyncClient,
) -> None:
    from openapi_spec_validator import validate

    document = (await api.get("/openapi.json")).json()
    validate(document)
    paths = document["paths"]
    assert {"/jobs", "/jobs/{job}", "/jobs/{job}/urls", "/jobs/{job}/items", "/jobs/{job}/pause"} <= set(paths)
    assert {"/dead", "/dead/{entry_id}", "/dead/replay", "/dead/purge", "/domains", "/tasks/{task_id}/trace"} <= set(
        paths
    )
    assert set(paths["/jobs/{job}"]) == {"get", "delete"}
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    submission = document["components"]["schemas"]["JobSubmission"]
    assert set(submission["required"]) == {"job", "urls"}
    assert "/metrics" not in paths and "/healthz" not in paths


async def test_the_api_refuses_to_listen_beyond_loopback_without_a_token(settings: Settings) -> None:
    env = service_env(settings, HUTCH_API_HOST="0.0.0.0", HUTCH_API_PORT=str(free_port()))
    env.pop("HUTCH_API_TOKEN", None)
    command = [sys.executable, "-m", "hutch.services.api"]
    done = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "refusing to listen on 0.0.0.0 without HUTCH_API_TOKEN" in done.stderr
    assert os.environ.get("HUTCH_API_TOKEN") is None or TOKEN not in done.stderr


def remote_only_env(api: httpx.AsyncClient, tmp_path: Path) -> dict[str, str]:
    """An environment with the API and nothing else: the broker's URL points at a closed
    port and the store at an empty folder, so a command that touched either would fail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env.update(
        HUTCH_API_URL=str(api.base_url),
        HUTCH_API_TOKEN=TOKEN,
        HUTCH_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/",
        HUTCH_DATA_DIR=str(tmp_path / "nothing-here"),
    )
    return env


def hutch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("hutch")), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


async def test_the_cli_over_the_api_runs_a_job_with_neither_store_nor_broker_where_it_runs(
    api: httpx.AsyncClient, sandbox: Sandbox, tmp_path: Path
) -> None:
    env = remote_only_env(api, tmp_path)
    urls = sandbox.urls()[CLI]
    missing = sandbox.sites["beta"].base_url + "/status/404"
    (tmp_path / "urls.txt").write_text("\n".join([*urls, missing]) + "\n")
    (tmp_path / "spec.yaml").write_text("fields:\n  title: 'css:h1::text'\n")
    (tmp_path / "bad.txt").write_text(urls[0] + "\nnot a url\n")

    bad = await asyncio.to_thread(hutch, env, "submit", str(tmp_path / "bad.txt"), "--job", "viacli")
    assert bad.returncode == 2 and "line 2" in bad.stderr
    sent = await asyncio.to_thread(
        hutch, env, "submit", str(tmp_path / "urls.txt"), "--job", "viacli", "--spec", str(tmp_path / "spec.yaml")
    )
    assert sent.returncode == 0, sent.stderr
    assert "submitted 21 URLs" in sent.stderr
    # Waited for through the API (each `hutch status` is a Python start, a second of CPU taken
    # from the services), then read with the CLI.
    await wait_finished(api, "viacli")
    status = await asyncio.to_thread(hutch, env, "status", "viacli", "--json")
    assert status.returncode == 0, status.stderr
    rows: list[dict[str, Any]] = json.loads(status.stdout)
    assert rows and rows[0]["finished"] and rows[0]["total"] == 21, rows
    table = await asyncio.to_thread(hutch, env, "status")
    assert table.returncode == 0 and "viacli" in table.stdout

    exported = await asyncio.to_thread(hutch, env, "export", "viacli", "--out", str(tmp_path / "items.jsonl"))
    assert exported.returncode == 0, exported.stderr
    items = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert len(items) == rows[0]["stored"] and all(item["title"] for item in items)

    listed = await asyncio.to_thread(hutch, env, "dlq", "list", "--job", "viacli", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)["entries"]
    assert entry["url"] == missing
    shown = await asyncio.to_thread(hutch, env, "dlq", "show", str(entry["id"]))
    assert json.loads(shown.stdout)["letter"]["reason"] == "not_found"
    traced = await asyncio.to_thread(hutch, env, "trace", "--job", "viacli", "--url", urls[0], "--json")
    assert traced.returncode == 0 and json.loads(traced.stdout)["task"]["state"] == "stored"
    unknown = await asyncio.to_thread(hutch, env, "pause", "no-such-job")
    assert unknown.returncode == 2 and "no job named" in unknown.stderr
    purged = await asyncio.to_thread(hutch, env, "dlq", "purge", "--job", "viacli", "--yes")
    assert purged.returncode == 0 and "purged 1" in purged.stdout
    deleted = await asyncio.to_thread(hutch, env, "jobs", "delete", "viacli")
    assert deleted.returncode == 0 and "21 tasks" in deleted.stderr

    env["HUTCH_API_TOKEN"] = "wrong"
    denied = await asyncio.to_thread(hutch, env, "status")
    assert denied.returncode == 2 and "HUTCH_API_TOKEN" in denied.stderr and "wrong" not in denied.stderr


async def test_the_python_client_over_the_api_submits_waits_and_reads_items(
    api: httpx.AsyncClient, sandbox: Sandbox, tmp_path: Path
) -> None:
    from hutch.client import Client, InvalidInput

    settings = Settings(
        api_url=str(api.base_url),
        api_token=TOKEN,
        amqp_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/",
        data_dir=tmp_path / "nothing-here",
    )
    urls = sandbox.urls()[CLIENT]

    def run() -> tuple[int, Any, list[dict[str, Any]]]:
        with Client(settings) as client:
            with pytest.raises(InvalidInput, match="URL 2"):
                client.submit("viaclient", [urls[0], "nope://x"])
            sent = client.submit("viaclient", urls + urls[:3], spec={"fields": {"title": "css:h1::text"}})
            progress = client.wait("viaclient", timeout=120, poll=0.3, expected=15)
            return sent, progress, list(client.items("viaclient"))

    sent, progress, items = await asyncio.to_thread(run)
    assert sent == 15
    assert progress.done and progress.total == 15
    assert len(items) == progress.stored and {item["url"] for item in items} <= set(urls)
