"""The `hutch` command line, every command run as a real process against RabbitMQ and the sandbox.

What a user relies on: a job run from the shell ends with every page stored and exported
exactly as the site served it, through the proxies and at the rate asked for; input that
cannot be used is refused with one sentence before anything reaches the broker; and every
long-running command stops, children included, when told to.

Each command gets the environment of the test's settings (its own vhost, namespace and
store). The sandbox runs in this process's event loop, so commands run as asyncio
subprocesses; whatever a test started, down to the services a `hutch run` spawned, is
killed when the test ends, passed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiormq
import httpx
import pytest
from hutch_sandbox import Sandbox, expected_page, load_config
from parsel import Selector

from hutch.amqp import Broker
from hutch.domains import domain_of
from hutch.models import DeadLetter, Submission, Task
from hutch.services.control.cli import main
from hutch.settings import Settings
from hutch.store import Store
from hutch.topology import Topology

from .conftest import Services

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

HERE = Path(__file__).parent
SANDBOX_CONFIG = HERE / "sandbox-cli.yaml"
COMMANDS = (
    "up",
    "serve",
    "submit",
    "status",
    "pause",
    "resume",
    "cancel",
    "weight",
    "run",
    "export",
    "reparse",
    "sandbox",
    "dlq",
    "watch",
    "trace",
    "jobs",
    "store",
)
SCRIPT = Path(sys.executable).with_name("hutch")
# The installed console script; cli.py has no __main__ guard, so without it, call main().
HUTCH = (
    [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-c", "from hutch.services.control.cli import main; main()"]
)
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"
PAGE = re.compile(r"^/page/(\d+)$")
SPEC_YAML = 'fields:\n  title: "css:title::text"\n  links: {css: "a::attr(href)", many: true}\n'


# -- running the command ----------------------------------------------------------------------


@dataclass
class Finished:
    code: int
    out: str
    err: str

    @property
    def last_line(self) -> str:
        lines = self.out.strip().splitlines()
        return lines[-1] if lines else ""


async def start(env: dict[str, str], *args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *HUTCH,
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def stop(process: asyncio.subprocess.Process, sig: int = signal.SIGINT, grace: float = 15.0) -> None:
    """Ask politely (SIGINT: `hutch run` then stops its services), kill after `grace`."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def hutch(env: dict[str, str], *args: str, timeout: float = 60.0, cwd: Path | None = None) -> Finished:
    """Run `hutch ARGS` to its end; one still running after `timeout` is stopped and fails the test."""
    process = await start(env, *args, cwd=cwd)
    assert process.stdout is not None and process.stderr is not None
    readers = [asyncio.create_task(process.stdout.read()), asyncio.create_task(process.stderr.read())]
    try:
        await asyncio.wait_for(process.wait(), timeout)
        late = False
    except TimeoutError:
        late = True
    finally:
        await stop(process)
        done, _ = await asyncio.wait(readers, timeout=5)
        for reader in readers:
            reader.cancel()
    out, err = (r.result().decode() if r in done and not r.cancelled() else "" for r in readers)
    assert not late, f"`hutch {' '.join(args)}` still running after {timeout:.0f}s; its stderr:\n{err}"
    assert process.returncode is not None
    return Finished(process.returncode, out, err)


async def read_until(stream: asyncio.StreamReader, done: Callable[[list[str]], bool], timeout: float) -> list[str]:
    """Lines of `stream` until `done(lines)` holds; fails after `timeout` seconds or at EOF."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(lines):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("not there after {:.0f}s; output so far:\n{}".format(timeout, "\n".join(lines)))
        line = await asyncio.wait_for(stream.readline(), remaining)
        if not line:
            raise AssertionError("the command ended early; its output:\n" + "\n".join(lines))
        lines.append(line.decode("utf-8", "replace").rstrip())
    return lines


def processes_of(namespace: str) -> list[int]:
    """Pids of live processes started with this namespace (services spawned by a command)."""
    marker = f"HUTCH_NAMESPACE={namespace}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def children_of(pid: int, pids: list[int]) -> list[int]:
    """Those of `pids` whose parent is `pid` (a service's own workers are its children, not ours)."""
    found = []
    for child in pids:
        try:
            parent = int((Path("/proc") / str(child) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if parent == pid:
            found.append(child)
    return found


@pytest.fixture(autouse=True)
def no_process_left(namespace: str) -> Iterator[None]:
    """Kill whatever this test's commands started and left running, even after a failure."""
    yield
    for pid in processes_of(namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- fixtures and checks --------------------------------------------------------------------------


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """Two small fault-free sites and a proxy of each tier: a whole job in seconds."""
    async with Sandbox(load_config(SANDBOX_CONFIG)) as box:
        yield box


@pytest.fixture
def env(settings: Settings, sandbox: Sandbox) -> dict[str, str]:
    """The test's settings as `HUTCH_*` variables; the SSRF guard lets the sandbox's sites through."""
    return {**settings.to_env(os.environ), "HUTCH_ALLOWED_TARGETS": ",".join(sandbox.allowed_targets())}


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def site_of(sandbox: Sandbox, url: str) -> str:
    port = urlsplit(url).port
    return next(name for name, site in sandbox.sites.items() if site.port == port)


def check_items(sandbox: Sandbox, items: list[dict[str, object]], fields: tuple[str, ...]) -> None:
    """Every item is a page of the sandbox with exactly the fields the site served."""
    for item in items:
        match = PAGE.match(urlsplit(str(item["url"])).path)
        assert match, item
        expected = expected_page(site_of(sandbox, str(item["url"])), int(match.group(1)))
        assert {name: item[name] for name in fields} == {name: expected[name] for name in fields}  # type: ignore[literal-required]


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def stored_tasks(settings: Settings, job: str) -> list[dict[str, object]]:
    store = Store(settings.store_location)
    try:
        return store.tasks(job)
    finally:
        store.close()


def job_exists(settings: Settings, job: str) -> bool:
    store = Store(settings.store_location)
    try:
        return store.job_exists(job)
    finally:
        store.close()


async def declare_topology(settings: Settings) -> None:
    """Declare the namespace's queues, so an empty queue proves nothing was published."""
    broker = await Broker(settings, "test-cli").connect()
    await broker.close()


async def intake_submissions(settings: Settings) -> list[Submission]:
    """The submissions waiting on the intake queue (taken off it), when no storer runs."""
    broker = await Broker(settings, "test-cli").connect()
    found: list[Submission] = []
    try:
        channel = await broker.channel()
        queue = await channel.declare_queue(broker.topology.intake, passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            found.append(broker.decode(message.body, message.content_encoding, Submission))
    finally:
        await broker.close()
    return found


async def queued_messages(settings: Settings, domains: Iterable[str] = ()) -> dict[str, int]:
    """Messages waiting in every queue of the namespace (absent domain queues count as empty)."""
    broker = await Broker(settings, "test-cli").connect()
    counts: dict[str, int] = {}
    try:
        streams = {q.name for q in broker.topology.queues if q.arguments.get("x-queue-type") == "stream"}
        for name in broker.topology.all_queue_names(domains):
            if name in streams:
                continue  # a log of records (job controls, releases), never tasks
            channel = await broker.channel()
            try:
                queue = await channel.declare_queue(name, passive=True, robust=False)
                counts[name] = queue.declaration_result.message_count or 0
            except aiormq.exceptions.ChannelNotFoundEntity:
                counts[name] = 0
            finally:
                if not channel.is_closed:
                    await channel.close()
    finally:
        await broker.close()
    return counts


def refused_in_one_sentence(done: Finished, *needles: str) -> None:
    assert done.code == 2, done
    assert "Traceback" not in done.err, done.err
    lines = done.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hutch: "), done.err
    for needle in needles:
        assert needle in lines[0], done.err


# -- help ------------------------------------------------------------------------------------------


async def test_help_lists_every_command_and_every_command_has_its_own_help(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    top = await hutch(env, "--help")  # the installed command, as a user runs it
    assert top.code == 0, top
    listed = re.findall(r"^    (\w+) ", top.out, re.MULTILINE)
    assert listed == list(COMMANDS)
    # Each command's help from the same entry point, in this process: one process per
    # command cost a second of imports each, and the parser is all that answers `--help`.
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        done = Finished(int(exited.value.code or 0), *capsys.readouterr())
        assert done.code == 0, done
        assert done.out.startswith(f"usage: hutch {command}"), done.out
        assert "options:" in done.out


# -- hutch run ---------------------------------------------------------------------------------------


async def test_run_starts_the_services_stores_every_page_and_exports_url_status_and_title(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, tmp_path: Path
) -> None:
    urls = sandbox.urls()
    urls_file = write(tmp_path / "pages.txt", "".join(f"{url}\n" for url in urls))
    out = tmp_path / "items.jsonl"
    done = await hutch(env, "run", str(urls_file), "--out", str(out), timeout=75)
    assert done.code == 0, done
    assert done.last_line == f"done: {len(urls)} stored, 0 dead, 0 pending"
    items = jsonl(out)
    assert sorted(item["url"] for item in items) == sorted(urls)  # type: ignore[type-var]
    assert all(item["status"] == 200 and set(item) == {"url", "status", "title"} for item in items)
    check_items(sandbox, items, ("title",))
    assert {task["state"] for task in stored_tasks(settings, "pages")} == {"stored"}  # job named after the file
    assert processes_of(settings.namespace) == []  # the services it started have stopped


async def test_run_with_a_spec_a_rate_and_proxies_fetches_through_the_proxies_at_that_rate(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, tmp_path: Path
) -> None:
    urls = sandbox.urls()
    urls_file = write(tmp_path / "urls.txt", "".join(f"{url}\n" for url in urls))
    spec = write(tmp_path / "spec.yaml", SPEC_YAML)
    proxies = write(tmp_path / "proxies.txt", sandbox.proxy_file_text())
    out = tmp_path / "items.jsonl"
    done = await hutch(
        env, "run", str(urls_file), "--job", "proxied", "--spec", str(spec), "--rate", "5/s",
        "--proxies", str(proxies), "--out", str(out), timeout=75,
    )  # fmt: skip
    assert done.code == 0, done
    assert done.last_line == f"done: {len(urls)} stored, 0 dead, 0 pending"
    items = jsonl(out)
    assert sorted(item["url"] for item in items) == sorted(urls)  # type: ignore[type-var]
    assert all(set(item) == {"url", "title", "links"} for item in items)
    check_items(sandbox, items, ("title", "links"))
    # Every page request reached the sites from a proxy's source address, never directly.
    page_hits = [r for r in sandbox.log if r.kind == "site" and PAGE.match(r.path)]
    assert len(page_hits) == len(urls)
    sources = {proxy.source for proxy in sandbox.proxies.values()}  # 127.0.1.1 and 127.0.2.1
    assert {r.client for r in page_hits} <= sources
    # 5/s per site: any six consecutive requests to one site span about a second.
    for name in sandbox.sites:
        arrivals = sorted(r.ts for r in page_hits if r.site == name)
        assert len(arrivals) == len(urls) // len(sandbox.sites)
        spans = [later - earlier for earlier, later in zip(arrivals, arrivals[5:], strict=False)]
        assert min(spans) > 0.8, (name, spans)


async def test_run_with_a_rate_for_one_domain_and_ignore_robots(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, tmp_path: Path
) -> None:
    slow, fast = list(sandbox.sites.values())[:2]
    urls_file = write(tmp_path / "limits.txt", "".join(f"{url}\n" for url in sandbox.urls()))
    done = await hutch(
        env, "run", str(urls_file), "--rate", "20/s", "--rate-for", f"{slow.domain}=2/s",
        "--ignore-robots", "--out", str(tmp_path / "limits.jsonl"), timeout=75,
    )  # fmt: skip
    assert done.code == 0, done
    hits = [r for r in sandbox.log if r.kind == "site"]
    assert not [r for r in hits if r.path == "/robots.txt"]
    slow_arrivals = sorted(r.ts for r in hits if r.site == slow.name)
    fast_arrivals = sorted(r.ts for r in hits if r.site == fast.name)
    # 2/s with burst 1: any three requests to the slow site span about a second or more.
    assert min(b - a for a, b in zip(slow_arrivals, slow_arrivals[2:], strict=False)) > 0.8
    assert fast_arrivals[-1] - fast_arrivals[0] < slow_arrivals[-1] - slow_arrivals[0]
    bad = await hutch(env, "run", str(urls_file), "--rate-for", "nonsense")
    refused_in_one_sentence(bad, "--rate-for")


async def test_run_with_a_tier_floor_uses_only_proxies_of_that_tier_or_costlier(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, tmp_path: Path
) -> None:
    urls = sandbox.urls()
    urls_file = write(tmp_path / "floor.txt", "".join(f"{url}\n" for url in urls))
    proxies = write(tmp_path / "proxies.txt", sandbox.proxy_file_text())
    done = await hutch(
        env, "run", str(urls_file), "--proxies", str(proxies), "--tier-floor", "residential",
        "--rate", "20/s", "--out", str(tmp_path / "floor.jsonl"), timeout=75,
    )  # fmt: skip
    assert done.code == 0, done
    page_hits = [r for r in sandbox.log if r.kind == "site" and PAGE.match(r.path)]
    residential = {p.source for p in sandbox.proxies.values() if p.tier == "residential"}
    assert page_hits and {r.client for r in page_hits} <= residential
    status = await hutch(env, "status", "floor", "--json")
    (row,) = json.loads(status.out)
    assert {c["tier"] for c in row["costs"]} == {"residential"}
    assert sum(c["requests"] for c in row["costs"]) == len(page_hits)


async def test_run_refuses_to_start_a_second_set_of_services_and_attach_uses_the_running_set(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    urls = sandbox.urls()
    urls_file = write(tmp_path / "attached.txt", "".join(f"{url}\n" for url in urls))
    out = tmp_path / "items.jsonl"
    refused = await hutch(env, "run", str(urls_file), "--out", str(out))
    refused_in_one_sentence(refused, "services already run", settings.namespace, "--attach")
    assert not out.exists() and not job_exists(settings, "attached")

    done = await hutch(env, "run", str(urls_file), "--attach", "--out", str(out), timeout=75)
    assert done.code == 0, done
    assert done.last_line == f"done: {len(urls)} stored, 0 dead, 0 pending"
    items = jsonl(out)
    assert sorted(item["url"] for item in items) == sorted(urls)  # type: ignore[type-var]
    check_items(sandbox, items, ("title",))
    # Attaching started no services of its own: the fixture's set did the work and still runs.
    assert all(c.process and c.process.returncode is None and c.restarts == 0 for c in services.supervisor.children)


# -- submit, status, export ----------------------------------------------------------------------


async def status_of(env: dict[str, str], job: str) -> dict[str, int]:
    done = await hutch(env, "status", job, "--json")
    assert done.code == 0, done
    (row,) = json.loads(done.out)
    return row  # type: ignore[no-any-return]


async def test_status_domains_shows_each_domains_rate_and_what_waits_from_the_running_governor(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    urls_file = write(tmp_path / "domains.txt", "".join(f"{url}\n" for url in sandbox.urls()))
    assert (await hutch(env, "submit", str(urls_file), "--job", "domains")).code == 0
    await services.wait_done("domains", timeout=60)
    done = await hutch(env, "status", "--domains", "--json")
    assert done.code == 0, done
    answer = json.loads(done.out)
    rows = {row["domain"]: row for row in answer["domains"]}
    assert set(rows) >= {site.domain for site in sandbox.sites.values()}
    assert answer["total_domains"] >= len(sandbox.sites)
    assert answer["frontier"]["waiting"] == 0 and answer["frontier"]["paused"] == 0
    for site in sandbox.sites.values():
        row = rows[site.domain]
        assert row["ceiling"] == settings.rate and 0 < row["rate"] <= settings.rate
        assert row["held"] == 0 and row["parked"] == 0 and row["in_flight"] == 0
    table = await hutch(env, "status", "--domains")
    assert table.code == 0 and all(site.domain in table.out for site in sandbox.sites.values())


async def test_submit_status_and_export_drive_a_job_on_running_services_storing_each_url_once(
    settings: Settings, env: dict[str, str], sandbox: Sandbox, services: Services, tmp_path: Path
) -> None:
    urls = sandbox.urls()
    text = "# the whole sandbox, five pages twice\n\n" + "".join(f"{url}\n" for url in urls + urls[:5])
    urls_file = write(tmp_path / "urls.txt", text)
    spec = write(tmp_path / "spec.yaml", SPEC_YAML)

    done = await hutch(env, "submit", str(urls_file), "--job", "cli-job", "--spec", str(spec))
    assert done.code == 0, done
    assert done.out == "cli-job\n"
    assert f"submitted {len(urls)} URLs to job cli-job, 5 duplicate lines" in done.err
    await services.wait_for("cli-job", lambda c: c.total == len(urls), timeout=30)  # the storer recorded them

    # Waited for in the store (each `hutch status` is a Python start, a second of CPU taken
    # from the services), then read with the CLI.
    await services.wait_done("cli-job", timeout=60)
    row = await status_of(env, "cli-job")
    total = len(urls)
    costs = row["costs"]
    counts = {k: v for k, v in row.items() if k != "costs"}
    assert counts == {
        "job": "cli-job", "total": total, "stored": total, "dead": 0, "in_flight": 0, "pending": 0,
        "stalled": 0, "rescued": 0, "cancelled": 0, "state": "running", "weight": 1.0, "finished": True,
        "crawl": None, "budget": None, "spent": 0.0, "reason": None,
    }  # fmt: skip
    # No pool in this test: every request went direct, and cost nothing.
    assert {(c["tier"], c["cost"]) for c in costs} == {("direct", 0.0)}
    assert sum(c["ok"] for c in costs) == total

    table = await hutch(env, "status")
    assert table.code == 0, table
    header = ["job", "state", "total", "stored", "dead", "cancelled", "pending", "in", "flight", "stalled", "rescued"]
    assert table.out.splitlines()[0].split() == header
    lines = [" ".join(line.split()) for line in table.out.splitlines()]
    assert any(line.startswith("cli-job ") and line.endswith(f" {total} {total} 0 0 0 0 0 0") for line in lines), lines
    every = await hutch(env, "status", "--json")
    assert every.code == 0 and [r["job"] for r in json.loads(every.out)] == ["cli-job"], every

    out = tmp_path / "export.jsonl"
    exported = await hutch(env, "export", "cli-job", "--out", str(out))
    assert exported.code == 0, exported
    assert f"exported {total} items to {out}" in exported.err
    items = jsonl(out)
    assert sorted(item["url"] for item in items) == sorted(urls)  # type: ignore[type-var]
    check_items(sandbox, items, ("title", "links"))
    to_stdout = await hutch(env, "export", "cli-job")
    assert to_stdout.code == 0 and to_stdout.out == out.read_text(encoding="utf-8"), to_stdout

    fetched = len([r for r in sandbox.log if r.kind == "site"])
    again = await hutch(env, "submit", str(urls_file), "--job", "cli-job", "--spec", str(spec))
    assert again.code == 0 and again.out == "cli-job\n", again
    assert f"submitted {total} URLs to job cli-job" in again.err  # the storer drops them: known already
    await asyncio.sleep(1.5)  # time enough for a wrongly republished task to be fetched
    assert len([r for r in sandbox.log if r.kind == "site"]) == fetched
    tasks = stored_tasks(settings, "cli-job")
    assert sorted(t["url"] for t in tasks) == sorted(urls)  # type: ignore[type-var]
    assert await status_of(env, "cli-job") == row


# -- input that cannot be used ---------------------------------------------------------------------


async def test_a_url_file_with_an_invalid_line_is_refused_with_its_line_number_and_nothing_submitted(
    settings: Settings, env: dict[str, str], tmp_path: Path
) -> None:
    good = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b", "https://example.invalid/c"]
    urls_file = write(tmp_path / "mixed.txt", f"{good[0]}\nftp://x\nnot a url\n{good[1]}\n{good[2]}\n")
    await declare_topology(settings)
    domains = {domain_of(url) for url in good}

    for done in await asyncio.gather(*(hutch(env, command, str(urls_file)) for command in ("submit", "run"))):
        refused_in_one_sentence(done, "mixed.txt line 2", "ftp://x")
    assert stored_tasks(settings, "mixed") == []
    assert not job_exists(settings, "mixed")
    assert set((await queued_messages(settings, domains)).values()) == {0}

    done = await hutch(env, "submit", str(urls_file), "--skip-invalid")
    assert done.code == 0, done
    assert done.out == "mixed\n"
    skipped = [line for line in done.err.splitlines() if line.startswith("skipped")]
    assert [line.split(":")[0] for line in skipped] == ["skipped line 2", "skipped line 3"]
    assert "ftp://x" in skipped[0] and "not a url" in skipped[1]
    # No storer runs: the good URLs wait in one submission on the intake queue, nothing else.
    waiting = await queued_messages(settings, domains)
    topology = Topology(settings.namespace)
    assert {name: n for name, n in waiting.items() if n} == {topology.intake: 1}
    (submission,) = await intake_submissions(settings)
    # Each domain's first URL goes ahead (`submissions`): c, on a domain of its own, before b.
    assert (submission.job, submission.urls) == ("mixed", [good[0], good[2], good[1]])


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ('"cs:title::text"', "unknown selector kind"),
        ('"css:title[[["', "broken css selector"),
        ('"xpath://h1[["', "broken xpath selector"),
    ],
)
async def test_a_spec_with_a_bad_selector_is_refused_before_anything_is_submitted(
    settings: Settings, env: dict[str, str], tmp_path: Path, rule: str, why: str
) -> None:
    urls_file = write(tmp_path / "good.txt", "http://127.0.0.1:9/a\nhttp://127.0.0.1:9/b\n")
    spec = write(tmp_path / "spec.yaml", f'fields:\n  price: "css:span.price::text"\n  title: {rule}\n')
    await declare_topology(settings)
    commands = ("submit", "run")
    for done in await asyncio.gather(*(hutch(env, c, str(urls_file), "--spec", str(spec)) for c in commands)):
        refused_in_one_sentence(done, "spec.yaml", "field 'title'", why)
    assert not job_exists(settings, "good")
    assert set((await queued_messages(settings, {"127.0.0.1:9"})).values()) == {0}


async def test_missing_files_are_refused_in_one_sentence(env: dict[str, str], tmp_path: Path) -> None:
    urls_file = write(tmp_path / "urls.txt", "http://127.0.0.1:9/a\n")
    missing = str(tmp_path / "missing.txt")
    cases = [
        (["submit", missing], "cannot read"),
        (["run", missing], "cannot read"),
        (["submit", str(urls_file), "--spec", missing], "cannot read spec"),
        (["run", str(urls_file), "--proxies", missing], "cannot read proxy file"),
        (["sandbox", "--config", missing], "cannot read sandbox config"),
    ]
    results = await asyncio.gather(*(hutch(env, *args) for args, _ in cases))
    for (_, needle), done in zip(cases, results, strict=True):
        refused_in_one_sentence(done, needle, "missing.txt")


async def test_an_unreachable_broker_is_one_sentence_and_exit_2_without_credentials(
    settings: Settings, tmp_path: Path
) -> None:
    env = {**settings.to_env(os.environ), "HUTCH_AMQP_URL": UNREACHABLE}
    urls_file = write(tmp_path / "urls.txt", "http://127.0.0.1:9/a\n")
    results = await asyncio.gather(
        hutch(env, "submit", str(urls_file)), hutch(env, "run", str(urls_file)), hutch(env, "up")
    )
    for done in results:
        refused_in_one_sentence(done, "cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1/")
        assert "guest:guest" not in done.err
    assert not job_exists(settings, "urls")


async def test_an_unknown_job_or_a_bad_setting_is_refused_in_one_sentence(
    settings: Settings, env: dict[str, str]
) -> None:
    results = await asyncio.gather(
        hutch(env, "status", "nosuchjob"),
        hutch(env, "status", "nosuchjob", "--json"),
        hutch(env, "export", "nosuchjob"),
        hutch({**env, "HUTCH_RATE": "fast"}, "status"),
        hutch({**env, "HUTCH_STORE_URL": "mysql://db/hutch"}, "export", "nosuchjob"),
    )
    for done in results[:3]:
        refused_in_one_sentence(done, "no job named 'nosuchjob'")
        assert done.out == ""
    refused_in_one_sentence(results[3], "invalid setting HUTCH_RATE")
    refused_in_one_sentence(results[4], "unsupported store URL scheme")


@pytest.mark.parametrize("job", ["../x", "a/b", "..", ".hidden", "x\x1b[2J", "j" * 101, ""])
async def test_a_job_name_that_could_leave_the_data_folder_is_refused_and_nothing_is_written(
    settings: Settings, env: dict[str, str], tmp_path: Path, job: str
) -> None:
    urls_file = write(tmp_path / "urls.txt", "http://127.0.0.1:9/a\n")
    before = files_under(tmp_path)
    for done in await asyncio.gather(*(hutch(env, c, str(urls_file), "--job", job) for c in ("submit", "run"))):
        refused_in_one_sentence(done, "invalid job name", "letters, digits")
        assert "\x1b" not in done.err
    assert files_under(tmp_path) == before  # no store, no export file, nothing outside
    assert not (tmp_path / "x.jsonl").exists()


async def test_the_default_job_name_is_made_valid_from_the_file_name(
    settings: Settings, env: dict[str, str], tmp_path: Path
) -> None:
    urls_file = write(tmp_path / ".my urls!.txt", "http://127.0.0.1:9/a\n")
    await declare_topology(settings)
    done = await hutch(env, "submit", str(urls_file))
    assert done.code == 0, done
    assert done.out == "my-urls-\n"
    assert [s.job for s in await intake_submissions(settings)] == ["my-urls-"]


async def test_control_characters_from_urls_reasons_and_job_names_are_printed_escaped(
    settings: Settings, env: dict[str, str], tmp_path: Path
) -> None:
    bad = write(tmp_path / "bad.txt", "http://127.0.0.1:9/a\nhttp://127.0.0.1:9/\x1b[2J\x9b31m\n")
    done = await hutch(env, "submit", str(bad))
    refused_in_one_sentence(done, "bad.txt line 2", "control character", "\\x1b[2J")
    skipped = await hutch(env, "submit", str(bad), "--skip-invalid", "--job", "skipping")

    # A ledger written by an older or hostile writer: every field the CLI prints holds escapes.
    evil = "evil\x1b[2J\x1b]0;owned\x07\x9b\u202e"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(settings.store_location)
    try:
        store.add_job(evil, None)
        task = Task(id="t1", job=evil, url="http://127.0.0.1:9/" + evil, domain="127.0.0.1:9")
        store.add_tasks([(task.id, task.job, task.url, task.domain)])
        store.record_dead(DeadLetter(stage="fetch\x1b[2J", reason=evil, detail=evil, task=task), "m1")
    finally:
        store.close()
    results = await asyncio.gather(
        hutch(env, "status"),
        hutch(env, "dlq", "list"),
        hutch(env, "dlq", "list", "--json"),
        hutch(env, "dlq", "show", "1"),
        hutch(env, "status", evil),
    )
    for finished in [skipped, *results]:
        printed = finished.out + finished.err
        assert not set(printed) & {"\x1b", "\x07", "\x9b", "\u202e"}, printed
    assert skipped.code == 0 and "\\x1b[2J\\x9b31m" in skipped.err
    assert all(r.code == 0 for r in results), results
    assert "evil\\x1b[2J\\x1b]0;owned\\x07\\x9b\\u202e" in results[0].out  # status: the job name
    assert results[1].out.count("evil\\x1b[2J") == 3  # dlq list: reason in the groups; reason and url
    assert json.loads(results[2].out)["entries"][0]["reason"] == evil  # valid JSON, same text
    assert json.loads(results[3].out)["letter"]["detail"] == evil
    assert "\\u001b[2J" in results[3].out


# -- long-running commands ------------------------------------------------------------------------


async def test_up_starts_every_service_and_sigint_stops_them_all(settings: Settings, env: dict[str, str]) -> None:
    labels = ("governor", "fetcher.1", "fetcher.2", "proxy-manager", "parser", "storer")
    process = await start(env, "up", "--fetchers", "2")
    try:
        assert process.stderr is not None

        def all_ready(lines: list[str]) -> bool:
            ready = {line.split()[0] for line in lines if " ready (broker " in line}
            return ready >= set(labels)

        lines = await read_until(process.stderr, all_ready, timeout=45)
        # One child of `hutch up` per service; the parser's extraction workers are its own.
        started = processes_of(settings.namespace)
        assert len(children_of(process.pid, started)) == len(labels)
        # Every service and every process under it runs SCHED_BATCH (HUTCH_SCHED_POLICY's
        # default): the parser's extraction workers too, started from its forkserver.
        under = [pid for pid in started if pid != process.pid]
        assert len(under) > len(labels)
        assert {pid: os.sched_getscheduler(pid) for pid in under} == {pid: os.SCHED_BATCH for pid in under}
        assert os.sched_getscheduler(process.pid) == os.SCHED_OTHER  # `hutch up` itself is left as it is
        assert all(line.rstrip().endswith(", scheduling batch)") for line in lines if " ready (broker " in line)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(process.communicate(), settings.shutdown_grace + 10)
        assert time.monotonic() - interrupted < settings.shutdown_grace + 5
    finally:
        await stop(process, signal.SIGKILL, grace=5)
    assert process.returncode == 0
    rest = err.decode()
    assert "Traceback" not in rest
    for label in labels:
        service = label.split(".")[0]
        assert re.search(rf"^{re.escape(label)}\s+\| .* {service} stopped$", rest, re.MULTILINE), (label, rest)
    assert processes_of(settings.namespace) == []


@pytest.mark.parametrize(
    ("service", "loop", "policy"), [("fetcher", "asyncio", None), ("governor", "uvloop", "normal")]
)
async def test_serve_runs_one_service_as_its_module_does_and_stops_cleanly_on_sigterm(
    settings: Settings, env: dict[str, str], service: str, loop: str, policy: str | None
) -> None:
    # `hutch serve` (what the image, compose and Kubernetes run) goes through the same entry
    # point as `python -m hutch.services.<name>`: the governor gets its uvloop there too, and
    # each its scheduling policy, SCHED_BATCH unless HUTCH_SCHED_POLICY says `normal`.
    if policy is not None:
        env = {**env, "HUTCH_SCHED_POLICY": policy}
    process = await start(env, "serve", service)
    try:
        assert process.stderr is not None
        lines = await read_until(process.stderr, lambda lines: any(f"{service} ready (broker " in x for x in lines), 30)
        ready = next(line for line in lines if f"{service} ready (broker " in line)
        expected = policy or "batch"
        assert f"event loop {loop}, scheduling {expected})" in ready
        assert os.sched_getscheduler(process.pid) == (os.SCHED_BATCH if expected == "batch" else os.SCHED_OTHER)
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), settings.shutdown_grace + 10)
    finally:
        await stop(process, signal.SIGKILL, grace=5)
    assert process.returncode == 0
    assert f"{service} stopped" in err.decode() and "Traceback" not in err.decode()


async def test_sandbox_writes_its_url_and_proxy_files_and_serves_until_sigterm(
    env: dict[str, str], tmp_path: Path
) -> None:
    urls_out, proxies_out = tmp_path / "out" / "urls.txt", tmp_path / "out" / "proxies.txt"
    process = await start(
        env, "sandbox", "--config", str(SANDBOX_CONFIG), "--urls-out", str(urls_out), "--proxies-out", str(proxies_out)
    )
    try:
        deadline = time.monotonic() + 20
        while not (urls_out.exists() and proxies_out.exists()):
            assert process.returncode is None and time.monotonic() < deadline, "no files from the sandbox"
            await asyncio.sleep(0.1)
        urls = urls_out.read_text().split()
        assert len(urls) == 24 and all(PAGE.match(urlsplit(url).path) for url in urls)
        tiers = [line.split()[1] for line in proxies_out.read_text().splitlines()]
        assert tiers == ["datacenter", "residential"]
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(urls[3])
        assert response.status_code == 200
        assert Selector(response.text).css("title::text").get() == expected_page("north", 3)["title"]
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 10)
    finally:
        await stop(process, signal.SIGKILL, grace=5)
    assert process.returncode == 0, err
    assert out.decode().splitlines()[-1] == "sandbox stopped"
