"""A job's request options through the five services, a real RabbitMQ and the sandbox.

What the sites saw is read from the sandbox's access log (each record carries the request's
headers): a job's headers and its cookies (one Cookie header) on every attempt of its pages,
retries and redirect hops included; its credentials (Cookie, Authorization) not sent to
another host after a redirect; nothing of them on another job's requests or on robots.txt.
The values are never in the services' logs, their metrics, `hutch status`, `hutch trace` or
`hutch dlq show`.

A job with a proxy budget, on a pool of residential proxies with a known cost per request,
pauses once its spend reaches the budget: `hutch status` says why, its remaining tasks are
not fetched, `hutch resume` alone is refused, and `hutch resume --budget` lets it finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import httpx
import pytest
from hutch_sandbox import AccessRecord, Sandbox, SandboxConfig, load_config

from hutch.amqp import Broker, queue_depth
from hutch.models import FieldRule, Spec
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import Store

from ..conftest import service_env
from .conftest import Services, on_ports, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HERE = Path(__file__).parent
FIELDS = {"title": FieldRule(kind="css", expr="title::text")}
SCRIPT = Path(sys.executable).with_name("hutch")
HUTCH = (
    [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-c", "from hutch.services.control.cli import main; main()"]
)


@dataclass
class Finished:
    code: int
    out: str
    err: str


async def hutch(settings: Settings, *args: str, timeout: float = 60.0) -> Finished:
    """`hutch ARGS` as a user runs it, on these settings."""
    process = await asyncio.create_subprocess_exec(
        *HUTCH, *args, env=service_env(settings), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Finished(process.returncode, out.decode(), err.decode())


class Tee(io.StringIO):
    """The services' output, kept for the test and shown as usual."""

    def __init__(self, shown: TextIO) -> None:
        super().__init__()
        self.shown = shown

    def write(self, text: str) -> int:
        self.shown.write(text)
        return super().write(text)


@contextlib.asynccontextmanager
async def services_on(settings: Settings, env: dict[str, str], logs: TextIO = sys.stderr) -> AsyncIterator[Services]:
    """The five services (one fetcher) on these settings and variables; their output in `logs`."""
    supervisor = Supervisor(service_env(settings, **env), fetchers=1, grace=settings.shutdown_grace, out=logs)
    await supervisor.start()
    try:
        await supervisor.wait_ready(timeout=60)
        yield Services(settings, supervisor)
    finally:
        await supervisor.stop()


@pytest.fixture
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    """The two clean sites, or the configuration a test names (`indirect`)."""
    config = SandboxConfig.model_validate(request.param) if hasattr(request, "param") else None
    async with Sandbox(config or load_config(HERE / "sandbox-clean.yaml")) as box:
        yield box


def key(url: str) -> tuple[int | None, str]:
    parts = urlsplit(url)
    return parts.port, parts.path + (f"?{parts.query}" if parts.query else "")


def records(sandbox: Sandbox, urls: list[str]) -> list[AccessRecord]:
    wanted = {key(url) for url in urls}
    return [r for r in sandbox.log if r.kind == "site" and (r.port, r.path) in wanted]


# -- headers and cookies --------------------------------------------------------------------------


async def test_a_jobs_headers_and_cookies_go_with_each_of_its_attempts_and_nowhere_else(
    settings: Settings, sandbox: Sandbox, metrics_ports: dict[str, int]
) -> None:
    settings = on_ports(settings, metrics_ports)
    logs = Tee(sys.stderr)
    token, session = f"Bearer tok-{secrets.token_hex(8)}", f"sess-{secrets.token_hex(8)}"
    secret_values = (token.split()[1], session)
    spec = Spec(
        fields=FIELDS,
        headers={"Accept-Language": "fr-CH", "X-Job": "catalogue", "Authorization": token, "User-Agent": "cat-bot/2"},
        cookies={"sid": session, "consent": "yes"},
    )
    north, south = sandbox.sites["north"], sandbox.sites["south"]
    pages = [north.page_url(i) for i in range(5)]
    flaky = f"{north.base_url}/flaky/opt-{secrets.token_hex(3)}?fail=1&code=500"  # one retry
    away = f"{north.base_url}/redirect?to=http://localhost:{south.port}/page/7"  # to another host
    within = f"{north.base_url}/redirect?to=/page/9"  # the same host
    gone = f"{north.base_url}/status/404"  # dead at once: a letter to show
    plain = [north.page_url(i) for i in range(20, 25)] + [south.page_url(i) for i in range(20, 23)]

    # `localhost` is another host name for the `south` site: a redirect there from `127.0.0.1`
    # goes to another host, as far as credentials are concerned.
    env = {
        "HUTCH_ALLOWED_TARGETS": ",".join([*sandbox.allowed_targets(), f"localhost:{south.port}"]),
        "HUTCH_RESOLVE": f"localhost:{south.port}:127.0.0.1",
        "HUTCH_LOG_LEVEL": "DEBUG",
    }
    async with services_on(settings, env, logs) as services:
        await asyncio.gather(
            submit_urls(settings, "with-options", [*pages, flaky, away, within, gone], spec),
            submit_urls(settings, "plain", plain, Spec(fields=FIELDS)),
        )
        done = await services.wait_done("with-options", timeout=90)
        assert (done.stored, done.dead) == (8, 1), done
        assert (await services.wait_done("plain", timeout=60)).stored == len(plain)
        async with httpx.AsyncClient(timeout=5) as client:
            metrics = [(await client.get(f"http://127.0.0.1:{port}/metrics")).text for port in metrics_ports.values()]

    everything = {"accept-language": "fr-CH", "x-job": "catalogue", "authorization": token, "user-agent": "cat-bot/2",
                  "cookie": f"sid={session}; consent=yes"}  # fmt: skip
    sent = records(sandbox, [*pages, flaky, away, within, gone, north.page_url(9)])
    assert len(sent) == len(pages) + 2 + 1 + 1 + 1 + 1  # the flaky page twice; each redirect hop
    for record in sent:
        assert record.headers is not None
        assert {name: record.headers.get(name) for name in everything} == everything, record.path
    assert [r.status for r in records(sandbox, [flaky])] == [500, 200]
    (hop,) = records(sandbox, [south.page_url(7)])
    assert hop.host == f"localhost:{south.port}" and hop.headers is not None
    assert (hop.headers["accept-language"], hop.headers["x-job"], hop.headers["user-agent"]) == (
        "fr-CH", "catalogue", "cat-bot/2",
    )  # fmt: skip
    assert "cookie" not in hop.headers and "authorization" not in hop.headers

    others = records(sandbox, plain) + [r for r in sandbox.log if r.path == "/robots.txt"]
    assert len(others) >= len(plain)
    for record in others:
        assert record.headers is not None
        assert not {"cookie", "authorization", "x-job", "accept-language"} & set(record.headers), record.path
        assert record.headers["user-agent"] == settings.user_agent

    # Nowhere a person or a scraper reads: logs, metrics, status, trace, the dead letter.
    store = Store(settings.store_location)
    try:
        (letter,) = store.dead_entries(job="with-options")
    finally:
        store.close()
    shown = [
        await hutch(settings, "status", "--json"),
        await hutch(settings, "dlq", "show", str(letter["id"])),
        await hutch(settings, "trace", "--job", "with-options", "--url", flaky, "--json"),
    ]
    assert all(found.code == 0 for found in shown), shown
    dead = json.loads(shown[1].out)
    assert dead["letter"]["task"]["spec"]["cookies"] == {"sid": "[redacted]", "consent": "[redacted]"}
    assert dead["letter"]["task"]["spec"]["headers"]["Authorization"] == "[redacted]"
    assert "DEBUG" in logs.getvalue()  # the services did log, and at length
    for text in [logs.getvalue(), *metrics, *(found.out + found.err for found in shown)]:
        for secret in secret_values:
            assert secret not in text


# -- a proxy budget -------------------------------------------------------------------------------

PROXY_CONFIG = {
    "seed": 11,
    "sites": [{"name": "shop", "pages": 60, "latency_ms": [5, 15]}],
    "proxies": [
        {"name": "res1", "tier": "residential", "source": "127.0.2.1"},
        {"name": "res2", "tier": "residential", "source": "127.0.2.2"},
    ],
}
COST = 0.01  # per request through either proxy
BUDGET = 0.1  # ten requests


def budget_env(sandbox: Sandbox, settings: Settings) -> dict[str, str]:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    pool = settings.data_dir / "proxies.txt"
    pool.write_text("".join(f"{proxy.url} residential {COST}\n" for proxy in sandbox.proxies.values()))
    # 4/s at the site (2/s through each proxy): the job would take 15 s, so it is caught midway.
    return {"HUTCH_PROXY_FILE": str(pool), "HUTCH_RATE": "4", "HUTCH_RESPECT_ROBOTS": "false"}


async def paused_depth(settings: Settings) -> int:
    broker = await Broker(settings, "test-depth").connect(declare=False)
    try:
        depth = await queue_depth(await broker.channel(), broker.topology.paused)
    finally:
        await broker.close()
    assert depth is not None
    return depth[0]


@pytest.mark.parametrize("sandbox", [PROXY_CONFIG], indirect=True, ids=["two-residential-proxies"])
async def test_a_job_that_spends_its_proxy_budget_pauses_says_why_and_fetches_no_more(
    settings: Settings, sandbox: Sandbox
) -> None:
    env = {"HUTCH_ALLOWED_TARGETS": ",".join(sandbox.allowed_targets()), **budget_env(sandbox, settings)}
    async with services_on(settings, env) as running:
        await spend_the_budget_then_raise_it(settings, sandbox, running)


async def spend_the_budget_then_raise_it(settings: Settings, sandbox: Sandbox, running: Services) -> None:
    urls = sandbox.sites["shop"].urls()
    await submit_urls(settings, "budgeted", urls, Spec(fields=FIELDS, budget=BUDGET))
    paused = await running.wait_for("budgeted", lambda c: c.state == "paused", timeout=60)
    assert paused.reason == "budget" and paused.spent >= BUDGET

    await asyncio.sleep(3.0)  # what was in flight when it paused lands
    fetched = len(records(sandbox, urls))
    await asyncio.sleep(3.0)
    assert len(records(sandbox, urls)) == fetched  # nothing more reaches the site
    counts = running.counts("budgeted")
    # Reached, then overshot by at most what was in flight: here a few requests at 4/s
    # (the bound is the fleet's concurrency times the dearest tier's cost).
    assert BUDGET <= counts.spent <= BUDGET + running.settings.concurrency * COST
    assert round(counts.spent / COST) == fetched  # every request through a proxy, each counted once
    assert counts.pending == len(urls) - counts.stored > 20
    store = Store(settings.store_location)
    try:
        waiting = [t["url"] for t in store.tasks("budgeted") if t["state"] not in ("stored", "dead")]
    finally:
        store.close()
    assert not records(sandbox, waiting)  # its remaining tasks were never fetched
    assert await paused_depth(settings) == len(waiting)  # they wait aside, no message held

    status = await hutch(settings, "status", "budgeted")
    assert status.code == 0
    assert f"job budgeted: paused: proxy budget 0.1 spent ({counts.spent:.4g})" in status.out, status.out
    assert "paused: budget" in status.out

    refused = await hutch(settings, "resume", "budgeted")
    assert refused.code == 2
    assert "has spent its proxy budget" in refused.err and "--budget" in refused.err

    resumed = await hutch(settings, "resume", "budgeted", "--budget", "5")
    assert resumed.code == 0, resumed.err
    done = await running.wait_done("budgeted", timeout=90)
    assert done.stored == len(urls) and (done.state, done.reason, done.budget) == ("running", None, 5.0)
    assert len(records(sandbox, urls)) == len(urls)  # each page fetched once in all
    assert round(done.spent / COST) == len(urls)
