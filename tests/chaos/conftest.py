"""Chaos fixtures: the five services on a RabbitMQ node of these tests' own, and the job checks.

Each chaos test breaks something under a running job (the broker, the network to it, the
store) and then demands what users rely on: every URL stored or dead, 0 pending, and no
duplicate item. The services are those of tests/e2e (`services`, `submit_urls`), pointed at
`amqp_url`, which here is a node started for these tests (tests/brokers.py) and never the
machine's shared broker: it is the one thing these tests stop, kill and wipe.

The node is started once for the package (a start costs ~5 s of the 2 cores) and restarted
for a test that finds it down, so a test that failed half-way through a restart does not
fail the next. It is killed and its folder removed at the end whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hutch_sandbox import Sandbox, expected_page, load_config

from hutch.models import FieldRule, Spec
from hutch.settings import Settings
from hutch.store import JobCounts, sqlite_path

from ..brokers import BrokerNode, available
from ..e2e import conftest as e2e
from ..e2e.conftest import Services, submit_urls

HERE = Path(__file__).parent
SPEC = Spec(
    fields={
        "title": FieldRule(kind="css", expr="title::text"),
        "h1": FieldRule(kind="xpath", expr="//h1/text()"),
        "price": FieldRule(kind="css", expr="span.price::text"),
    }
)
PAGE = re.compile(r"^/page/(\d+)$")

# The five services of the end-to-end tests, on this package's `amqp_url` and `sandbox`.
services = e2e.services
extra_env = e2e.extra_env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: breaks a RabbitMQ node of its own, the network or the store mid-job")


@pytest.fixture(scope="package")
def broker_node() -> Iterator[BrokerNode]:
    why = available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    node = BrokerNode()
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


@pytest.fixture
def node(broker_node: BrokerNode) -> BrokerNode:
    broker_node.start()  # no-op when it runs; a test that left it down gets it back
    return broker_node


@pytest.fixture
def amqp_url(node: BrokerNode) -> str:
    """The broker the services and `settings` use: the test's own node (a module may proxy it)."""
    return node.url


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox.yaml")) as box:
        yield box


async def submit_job(settings: Settings, job: str, urls: list[str]) -> None:
    await submit_urls(settings, job, urls, SPEC)


async def wait_for_progress(running: Services, job: str, stored: int, timeout: float = 60) -> JobCounts:
    """Wait until `stored` tasks of `job` are stored: the job is really under way."""
    return await running.wait_for(job, lambda c: c.stored >= stored, timeout)


def check_job(settings: Settings, sandbox: Sandbox, job: str, urls: list[str]) -> JobCounts:
    """Every URL stored or dead, none pending; one item per stored task, each its URL's page.

    Returns the job's counts. The items table is keyed by task id, so duplicates would show as
    items of tasks that are not `stored`, as two tasks of one URL, or as an item whose fields
    are another page's.
    """
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, url, state FROM tasks WHERE job = ?", (job,))
        tasks = {task_id: (url, state) for task_id, url, state in rows}
        items = db.execute("SELECT task_id, url, fields FROM items WHERE job = ?", (job,)).fetchall()
    finally:
        db.close()
    states = [state for _, state in tasks.values()]
    counts = JobCounts(
        job, len(tasks), states.count("stored"), states.count("dead"), states.count("in_flight"),
        len(tasks) - states.count("stored") - states.count("dead"),
    )  # fmt: skip
    assert sorted(url for url, _ in tasks.values()) == sorted(set(urls)), "tasks are not the URLs submitted"
    assert counts.pending == 0, f"{counts.pending} pending: {counts}"
    assert len(items) == counts.stored, f"{len(items)} items for {counts.stored} stored tasks"
    assert len({url for _, url, _ in items}) == len(items), "two items for one URL"
    sites = {site.port: name for name, site in sandbox.sites.items()}
    for task_id, url, fields in items:
        assert task_id in tasks and tasks[task_id] == (url, "stored"), f"item of a task not stored: {url}"
        parts = urlsplit(url)
        page = PAGE.match(parts.path)
        assert page and parts.port in sites, url
        expected = expected_page(sites[parts.port], int(page.group(1)))
        found = json.loads(fields)
        assert {k: found.get(k) for k in SPEC.fields} == {k: expected[k] for k in SPEC.fields}, url
    return counts


def dead_reasons(settings: Settings, job: str) -> dict[str, int]:
    db = sqlite3.connect(f"file:{sqlite_path(settings.store_location)}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT last_outcome, COUNT(*) FROM tasks WHERE job = ? AND state = 'dead' GROUP BY last_outcome", (job,)
        ).fetchall()
    finally:
        db.close()
    return {str(reason): count for reason, count in rows}


async def in_thread(operation: Callable[[], None]) -> None:
    """Run a blocking node operation off the loop, so the sandbox and proxies keep serving."""
    await asyncio.to_thread(operation)
