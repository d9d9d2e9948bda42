"""Many host names on one sandbox port through wildcard entries, fetched for real.

One site of the sandbox stands for every host under `wide.test`: `HUTCH_RESOLVE` sends
`*.wide.test` (and, as a catch-all, `*.test`) to its port and `HUTCH_ALLOWED_TARGETS` lets
only `*.wide.test` through. Host names are drawn at random for each run, one of them
non-ASCII (fetched as its A-label). Hosts under `wide.test` must come back with the site's
page, counted by the sandbox under their own Host header; `wide.test` itself and
`evilwide.test` resolve (through `*.test`) but must be refused by the guard, and never reach
the site.

The first test uses the fetcher's own client, guard and resolver (no broker); the second
runs a job through all five services and RabbitMQ.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hutch_sandbox import Sandbox, WildcardEntries, expected_page, load_config
from parsel import Selector

from hutch.services.control.supervisor import Supervisor
from hutch.services.fetcher.fetch import fetch, make_client
from hutch.services.fetcher.guard import TargetGuard, parse_overrides
from hutch.services.fetcher.policy import load_policy
from hutch.settings import Settings
from hutch.store import Store
from hutch.targets import BadEntry
from hutch.urls import check_url

from ..conftest import service_env
from .conftest import Services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HERE = Path(__file__).parent
SUFFIX = "wide.test"
OUTSIDE = ["wide.test", "evilwide.test"]  # the bare suffix, and a name that only ends alike
JOB = "wildcard-hosts"


def random_hosts() -> list[str]:
    """Five names under SUFFIX, new each run: one label, two labels, one non-ASCII."""
    tokens = [secrets.token_hex(4) for _ in range(5)]
    return [
        f"d{tokens[0]}.{SUFFIX}",
        f"d{tokens[1]}.{SUFFIX}",
        f"shop-{tokens[2]}.{SUFFIX}",
        f"a.b{tokens[3]}.{SUFFIX}",
        f"b\u00fccher-{tokens[4]}.{SUFFIX}",
    ]


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(load_config(HERE / "sandbox-cli.yaml")) as box:  # two well-behaved sites
        yield box


def wildcard_settings(sandbox: Sandbox, base: Settings | None = None) -> Settings:
    """Settings whose two lists hold only wildcard entries, read as a service would read them."""
    entries = sandbox.wildcard_entries(SUFFIX, site="north")
    catch_all = f"*.test:{sandbox.sites['north'].port}:127.0.0.1"
    update = {"resolve": f"{entries.resolve},{catch_all}", "allowed_targets": entries.allowed}
    return Settings.model_validate({**(base.model_dump() if base else {}), **update})


def host_key(url: str) -> str:
    """The Host header a request for `url` carries: the A-label host and the port."""
    return url.split("/")[2]


async def test_wildcard_entries_send_a_suffix_to_one_site_port_and_refuse_a_bad_suffix(sandbox: Sandbox) -> None:
    port = sandbox.sites["south"].port
    assert sandbox.wildcard_entries(SUFFIX, site="south") == WildcardEntries(
        resolve=f"*.{SUFFIX}:{port}:127.0.0.1", allowed=f"*.{SUFFIX}:{port}"
    )
    with pytest.raises(BadEntry, match="leftmost label"):
        sandbox.wildcard_entries("wide.*.test")


async def test_the_fetchers_client_fetches_random_hosts_under_a_wildcard_and_refuses_the_rest(
    sandbox: Sandbox,
) -> None:
    settings = wildcard_settings(sandbox)
    site = sandbox.sites["north"]
    # Wired as the fetcher wires it (services/fetcher/app.py).
    guard = TargetGuard(settings.allowed_targets, settings.allow_private_networks, parse_overrides(settings.resolve))
    policy = load_policy(None, max_attempts=3, max_pause=10, default_pause=1, max_throttles=3, max_proxy_failures=3)
    client = make_client(proxy=None, guard=guard, user_agent="test", connect_timeout=2, read_timeout=5)
    hosts = random_hosts()
    results = {}
    async with client:
        for i, host in enumerate(hosts + OUTSIDE):
            checked = check_url(site.host_url(host, f"/page/{i}"))
            results[host] = (checked, await fetch(
                client, checked.url, domain=checked.domain, guard=guard, proxy=None, policy=policy,
                total_timeout=10, max_body_bytes=1 << 20,
            ))
    counts = sandbox.host_stats()
    for i, host in enumerate(hosts):
        checked, result = results[host]
        assert (result.outcome, result.status) == ("ok", 200), (host, result.detail)
        assert result.body is not None
        title = Selector(result.body.decode("utf-8")).css("title::text").get()
        assert title == expected_page("north", i)["title"]
        assert counts[host_key(checked.url)].total == 1
    assert host_key(results[hosts[-1]][0].url).startswith("xn--")  # the non-ASCII name went as its A-label
    for host in OUTSIDE:
        checked, result = results[host]
        assert result.outcome == "forbidden_target", (host, result.outcome, result.detail)
        assert f"{host}:{site.port} resolves to 127.0.0.1" in result.detail
        assert host_key(checked.url) not in counts
    assert {record.host for record in sandbox.site_log("north")} == {host_key(results[h][0].url) for h in hosts}


async def test_a_job_over_random_hosts_under_a_wildcard_is_stored_and_hosts_outside_it_end_forbidden(
    settings: Settings, sandbox: Sandbox
) -> None:
    settings = wildcard_settings(sandbox, settings.model_copy(update={"respect_robots": False}))
    site = sandbox.sites["north"]
    hosts = random_hosts()
    urls = {host: check_url(site.host_url(host, f"/page/{i}")).url for i, host in enumerate(hosts + OUTSIDE)}
    # Only the wildcard entries: not the sandbox's own 127.0.0.1:PORT, which would let any name through.
    env = service_env(settings)
    assert env["HUTCH_ALLOWED_TARGETS"] == f"*.{SUFFIX}:{site.port}"
    supervisor = Supervisor(env, fetchers=1, grace=settings.shutdown_grace,
                            out=sys.stderr if os.environ.get("HUTCH_TEST_LOGS") else None)
    await supervisor.start()
    try:
        await supervisor.wait_ready(timeout=60)
        await submit_urls(settings, JOB, list(urls.values()))
        counts = await Services(settings, supervisor).wait_done(JOB, timeout=90)
    finally:
        await supervisor.stop()
    assert (counts.total, counts.pending) == (len(urls), 0)
    store = Store(settings.store_location)
    try:
        tasks = {task["url"]: task for task in store.tasks(JOB)}
        items = {item["url"]: item for item in store.items(JOB)}
        dead = {entry["url"]: entry for entry in store.dead_entries(job=JOB)}
    finally:
        store.close()
    seen = sandbox.host_stats()
    for i, host in enumerate(hosts):
        url = urls[host]
        assert tasks[url]["state"] == "stored", (host, tasks[url], dead.get(url))
        assert items[url]["title"] == expected_page("north", i)["title"]
        assert seen[host_key(url)].total == 1
    for host in OUTSIDE:
        url = urls[host]
        assert (tasks[url]["state"], dead[url]["reason"]) == ("dead", "forbidden_target"), (host, tasks[url])
        assert host_key(url) not in seen
