"""Redirects to targets Hutch must refuse, and a host name as long as DNS allows, end to end.

Each hostile route of the sandbox (hutch_sandbox.hostile.urls) answers a redirect whose
target breaks one rule: a malformed or over-long host, a `file:` URL, the cloud metadata
address, a terminal escape. Before the URL validator, the four malformed hosts reached the
resolver, which raised where nothing expected it, and their tasks stayed in flight for ever.
One job holds a URL for each row plus the redirect loop and a page on a 253-byte host name
(resolved to the sandbox with HUTCH_RESOLVE); it runs once for the module through all five
services and RabbitMQ, under the longest namespace allowed (100 characters) so that every domain-derived queue
name and routing key is at the AMQP limit. Each test then reads where its task ended.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hutch_sandbox import Sandbox, load_config
from hutch_sandbox.hostile.urls import TARGETS

from hutch.admin import delete_namespace
from hutch.amqp import Broker
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import AsyncStore, JobCounts, Store
from hutch.topology import routing_key
from hutch.urls import check_url

from ..conftest import OWN_VHOST

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HERE = Path(__file__).parent
JOB = "hostile-urls"
SETTLE = 90.0  # seconds: every task must be stored or dead by then
# 4 labels of 60 + 3 dots + ".test" = 248 bytes; with a port the domain key is 254 bytes.
LONG_HOST = ".".join(f"{c}" * 60 for c in "wxyz") + ".test"
ROWS = {name: f"/hostile/{name}" for name in TARGETS} | {
    "loop": "/loop/0",
    "long_host": "/page/1",
    "mapped_submit": "/page/1",
    "mapped_redirect": "/page/2",
}
# Hosts valid only through UTS 46 mapping; httpx alone (IDNA 2008, no mapping) refuses both.
FULL_WIDTH = "\uff53\uff48\uff4f\uff50.test"  # full-width "shop": maps to shop.test
ORDINAL = "\u00aashop.test"  # feminine ordinal a: maps to ashop.test


@dataclass
class Result:
    url: str
    state: str
    dead: dict[str, Any] | None
    item: dict[str, Any] | None


@dataclass
class Run:
    counts: JobCounts
    results: dict[str, Result]
    long_domain: str
    long_queue: str
    long_queue_depth: int | None  # None: the queue does not exist


def settings_for(amqp_url: str, data_dir: Path) -> Settings:
    namespace = f"t-urls-{uuid.uuid4().hex[:6]}-" + "n" * 86  # 100 characters, the longest allowed
    return Settings(
        amqp_url=amqp_url,
        namespace=namespace,
        data_dir=data_dir,
        retry_delays=(0.2, 0.5, 1.0),
        rate=50.0,
        max_attempts=3,
        max_redirects=3,
        connect_timeout=1.0,
        read_timeout=1.0,
        total_timeout=1.5,
        rpc_timeout=2.0,
        shutdown_grace=2.0,
    )


def counts(settings: Settings) -> JobCounts:
    store = Store(settings.store_location)
    try:
        found = store.counts(JOB)
    finally:
        store.close()
    return found[0] if found else JobCounts(JOB, 0, 0, 0, 0, 0)


async def wait_settled(settings: Settings, timeout: float) -> JobCounts:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = counts(settings)
        if found.total and found.pending == 0:
            return found
        if asyncio.get_running_loop().time() > deadline:
            return found  # the tests say which tasks did not end
        await asyncio.sleep(0.25)


async def queue_depth(settings: Settings, name: str) -> int | None:
    broker = await Broker(settings, "test-inspect").connect()
    try:
        channel = await broker.channel()
        try:
            queue = await channel.declare_queue(name, passive=True, robust=False)
            return queue.declaration_result.message_count or 0
        except Exception:
            return None
    finally:
        await broker.close()


async def run_job(settings: Settings) -> Run:
    async with Sandbox(load_config(HERE / "sandbox-hostile-urls.yaml")) as sandbox:
        site = sandbox.sites["a"]
        port = site.port
        urls = {row: site.base_url + path for row, path in ROWS.items()}
        urls["long_host"] = f"http://{LONG_HOST}:{port}/page/1"
        urls["mapped_submit"] = f"http://{FULL_WIDTH}:{port}/page/1"
        target = quote(f"http://{ORDINAL}:{port}/page/2", safe="")
        urls["mapped_redirect"] = f"{site.base_url}/hostile/redirect-raw?to={target}"
        env = settings.to_env(os.environ)
        resolve = [f"{host}:{port}:127.0.0.1" for host in (LONG_HOST, "shop.test", "ashop.test")]
        env.update(HUTCH_ALLOWED_TARGETS=",".join(sandbox.allowed_targets()), HUTCH_RESOLVE=",".join(resolve))
        logs = sys.stderr if os.environ.get("HUTCH_TEST_LOGS") else None
        supervisor = Supervisor(env, fetchers=1, grace=2.0, out=logs)
        await supervisor.start()
        try:
            await supervisor.wait_ready(60)
            broker = await Broker(settings, "test-control").connect()
            store = await AsyncStore(settings.store_location).open()
            try:
                await submit(broker, store, JOB, iter(urls.values()), None)
            finally:
                await store.close()
                await broker.close()
            final = await wait_settled(settings, SETTLE)
            long_domain = check_url(urls["long_host"]).domain
            names = Broker(settings, "names").topology
            long_queue = names.shard_queue(names.shard_of(long_domain)).name
            depth = await queue_depth(settings, long_queue)
        finally:
            await supervisor.stop()
    store = Store(settings.store_location)
    try:
        tasks = {t["url"]: t for t in store.tasks(JOB)}
        items = {i["url"]: i for i in store.items(JOB)}
        dead = {d["url"]: d for d in store.dead_entries(job=JOB)}
    finally:
        store.close()
    urls = {row: check_url(url).url for row, url in urls.items()}  # as submit stores them
    results = {
        row: Result(url, tasks[url]["state"], dead.get(url), items.get(url)) for row, url in urls.items()
    }
    return Run(final, results, long_domain, long_queue, depth)


@pytest.fixture(scope="module")
def run(amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Run]:
    settings = settings_for(amqp_url, tmp_path_factory.mktemp("hostile-urls"))
    try:
        yield asyncio.run(run_job(settings))
    finally:
        if not request.config.stash.get(OWN_VHOST, True):
            asyncio.run(delete_namespace(settings))


def dead_reason(run: Run, row: str) -> tuple[str, str | None, str]:
    r = run.results[row]
    return r.state, None if r.dead is None else r.dead["reason"], "" if r.dead is None else r.dead["detail"] or ""


def test_the_job_ends_with_nothing_pending(run: Run) -> None:
    assert run.counts.pending == 0, {row: r.state for row, r in run.results.items()}
    assert run.counts.total == len(ROWS)


@pytest.mark.parametrize(
    "row", ["redirect-empty-label", "redirect-long-label", "redirect-long-host", "redirect-bare-xn"]
)
def test_a_redirect_to_a_malformed_host_is_dead_as_invalid_url(run: Run, row: str) -> None:
    state, reason, detail = dead_reason(run, row)
    assert (state, reason) == ("dead", "invalid_url")
    assert "redirect 1 from" in detail and "not a valid domain name" in detail


def test_a_redirect_to_a_file_url_is_dead_as_invalid_url(run: Run) -> None:
    state, reason, detail = dead_reason(run, "redirect-file")
    assert (state, reason) == ("dead", "invalid_url")
    assert "not an http or https URL" in detail and "file:///etc/passwd" in detail


def test_a_redirect_to_the_cloud_metadata_address_is_dead_as_forbidden_target(run: Run) -> None:
    state, reason, detail = dead_reason(run, "redirect-metadata")
    assert (state, reason) == ("dead", "forbidden_target")
    assert "169.254.169.254" in detail


def test_a_redirect_with_a_terminal_escape_is_dead_as_invalid_url_and_stored_escaped(run: Run) -> None:
    state, reason, detail = dead_reason(run, "redirect-control")
    assert (state, reason) == ("dead", "invalid_url")
    assert "control character" in detail
    assert "\x1b" not in detail and "\\x1b[2J" in detail


def test_a_redirect_loop_is_dead_as_redirects(run: Run) -> None:
    assert dead_reason(run, "loop")[:2] == ("dead", "redirects")


def test_a_host_of_248_bytes_goes_through_its_shard_and_is_stored(run: Run) -> None:
    r = run.results["long_host"]
    assert r.state == "stored" and r.item is not None, (r.state, r.dead)
    assert run.long_domain.startswith(LONG_HOST + ":")
    assert ".frontier.s." in run.long_queue  # a shard's short name, whatever the host's length
    assert len(routing_key(run.long_domain).encode()) <= 255  # its event keys stay valid too
    assert run.long_queue_depth == 0  # drained by the governor


def test_a_submitted_host_valid_only_through_uts46_mapping_is_fetched_in_its_mapped_form(run: Run) -> None:
    r = run.results["mapped_submit"]
    assert r.url.startswith("http://shop.test:")
    assert r.state == "stored" and r.item is not None, (r.state, r.dead)
    assert r.item["url"] == r.url


def test_a_redirect_to_a_host_valid_only_through_uts46_mapping_follows_its_mapped_form(run: Run) -> None:
    r = run.results["mapped_redirect"]
    assert r.state == "stored" and r.item is not None, (r.state, r.dead)


@pytest.mark.parametrize("host", [FULL_WIDTH, ORDINAL])
def test_httpx_alone_would_refuse_those_hosts_so_the_mapping_is_what_made_them_work(host: str) -> None:
    with pytest.raises(httpx.InvalidURL):
        httpx.URL(f"http://{host}/")
