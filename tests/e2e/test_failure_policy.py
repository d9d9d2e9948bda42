"""Every row of the failure policy, through all five services, proxies and the sandbox's HTTP.

One job holds a URL for each row; it runs once for the module (services, sandbox and
proxies for real), then each test reads where its task ended, the attempts it spent, the
proxy each attempt used and the delay tier each retry went through, from the store (the
attempt events) and from the sandbox's access log.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hutch_sandbox import AccessRecord, Sandbox, expected_page, load_config

from hutch.admin import delete_namespace
from hutch.amqp import Broker
from hutch.services.control.dlq import replay
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.services.proxy_manager.pool import load_pool
from hutch.settings import Settings
from hutch.store import AsyncStore, Store

from ..conftest import OWN_VHOST

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HERE = Path(__file__).parent
MAX_BODY = 100_000


@dataclass
class Outcome:
    """What the store and the sandbox say about one URL of the job."""

    url: str
    state: str
    attempts: int
    events: list[dict[str, Any]]
    dead: dict[str, Any] | None
    item: dict[str, Any] | None

    @property
    def outcomes(self) -> list[str]:
        return [e["outcome"] for e in self.events]

    @property
    def tries(self) -> list[str]:
        """Outcomes of the requests that reached a site (not waits for a proxy or a permit)."""
        skip = {"no_proxy", "proxy_failure", "permit_expired", "permit_late", "redelivered", "no_lease"}
        return [o for o in self.outcomes if o not in skip]

    @property
    def proxies(self) -> list[str | None]:
        return [e["proxy_id"] for e in self.events]


@dataclass
class Run:
    sandbox_log: list[AccessRecord]
    proxy_ids: dict[str, str]  # sandbox proxy name (and "closed") -> proxy id
    sites: dict[str, str]  # site name -> base URL
    results: dict[str, Outcome] = field(default_factory=dict)
    replayed: dict[str, Outcome] = field(default_factory=dict)


ROWS = {
    "hang": "a:/hang",
    "reset": "a:/reset",
    "forbidden": "outside:/page/1",
    "block_403": "blk:/block",
    "challenge_200": "chl:/challenge",
    "throttled_retry_after": "a:/retry-after/1",
    "throttled_no_retry_after": "b:/flaky/t429?fail=1&code=429",
    "server_error": "a:/flaky/t500?fail=2&code=500",
    "not_found": "b:/status/404",
    "too_large": f"a:/big?bytes={MAX_BODY * 2}",
    "redirect_cross_domain": "a:/redirect?to={b}/page/3",
    "redirect_loop": "b:/loop/0",
    "healthy": "a:/page/5",
    "exhausted_then_healed": "b:/flaky/heal?fail=3&code=500",
}


def settings_for(amqp_url: str, data_dir: Path) -> Settings:
    return Settings(
        amqp_url=amqp_url,
        namespace=f"t-policy-{uuid.uuid4().hex[:6]}",
        data_dir=data_dir,
        retry_delays=(0.2, 0.5, 1.0),
        rate=50.0,
        max_attempts=3,
        max_throttles=2,
        max_proxy_failures=5,
        default_pause=0.3,
        max_redirects=3,
        max_body_bytes=MAX_BODY,
        connect_timeout=1.0,
        read_timeout=1.0,
        total_timeout=1.5,
        rpc_timeout=2.0,
        shutdown_grace=2.0,
    )


def snapshot(settings: Settings, job: str, urls: dict[str, str]) -> dict[str, Outcome]:
    store = Store(settings.store_location)
    try:
        tasks = {t["url"]: t for t in store.tasks(job)}
        items = {i["url"]: i for i in store.items(job)}
        dead = {d["url"]: d for d in store.dead_entries(job=job)}
        result = {}
        for row, url in urls.items():
            task = tasks[url]
            events = [e for e in store.attempts(task["id"]) if e["next"] is not None]
            result[row] = Outcome(url, task["state"], task["attempts"], events, dead.get(url), items.get(url))
        return result
    finally:
        store.close()


async def wait_settled(settings: Settings, job: str, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        store = Store(settings.store_location)
        try:
            counts = store.counts(job)
        finally:
            store.close()
        if counts and counts[0].pending == 0:
            return
        await asyncio.sleep(0.25)
    store = Store(settings.store_location)
    try:
        open_tasks = [
            (t["url"], t["state"], [(a["outcome"], a["next"], a["proxy_id"]) for a in store.attempts(t["id"])])
            for t in store.tasks(job)
            if t["state"] not in ("stored", "dead")
        ]
    finally:
        store.close()
    raise AssertionError(f"job {job} not finished after {timeout}s: {open_tasks}")


async def run_job(settings: Settings) -> Run:
    async with Sandbox(load_config(HERE / "sandbox-policy.yaml")) as sandbox:
        sites = {name: site.base_url for name, site in sandbox.sites.items()}
        proxy_file = settings.data_dir / "proxies.txt"
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        proxy_file.write_text(sandbox.proxy_file_text() + "http://127.0.0.1:1 datacenter\n")
        allowed = [t for t in sandbox.allowed_targets() if t != sandbox.sites["outside"].domain]
        env = settings.to_env(os.environ)
        env.update(HUTCH_PROXY_FILE=str(proxy_file), HUTCH_ALLOWED_TARGETS=",".join(allowed))
        # robots.txt has tests of its own; here its fetches would take the first proxy leases.
        env.update(HUTCH_RESPECT_ROBOTS="false")
        urls = {}
        for row, spec in ROWS.items():
            site, path = spec.split(":", 1)
            urls[row] = sites[site] + path.format(b=sites["b"])
        logs = sys.stderr if os.environ.get("HUTCH_TEST_LOGS") else None  # set to see the services' logs
        supervisor = Supervisor(env, fetchers=1, grace=2.0, out=logs)
        await supervisor.start()
        try:
            await supervisor.wait_ready(60)
            broker = await Broker(settings, "test-control").connect()
            store = await AsyncStore(settings.store_location).open()
            try:
                await submit(broker, store, "policy", iter(urls.values()), None)
            finally:
                await store.close()
                await broker.close()
            await wait_settled(settings, "policy", 40)
            run = Run(list(sandbox.log), {}, sites)
            run.results = snapshot(settings, "policy", urls)
            # The flaky page has healed by now: a replay of its dead letter stores it.
            replayed, _ = await replay(settings, {"job": "policy", "reason": "server_error", "domain": None}, True)
            assert replayed == 1
            await wait_settled(settings, "policy", 60)
            run.replayed = snapshot(settings, "policy", {"exhausted_then_healed": urls["exhausted_then_healed"]})
        finally:
            await supervisor.stop()
        for proxy in load_pool(proxy_file):
            name = next((n for n, p in sandbox.proxies.items() if proxy.url.endswith(f":{p.port}")), "closed")
            run.proxy_ids[name] = proxy.id
        run.sandbox_log = list(sandbox.log)
        return run


@pytest.fixture(scope="module")
def run(amqp_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Run]:
    settings = settings_for(amqp_url, tmp_path_factory.mktemp("policy"))
    try:
        yield asyncio.run(run_job(settings))
    finally:
        if not request.config.stash.get(OWN_VHOST, True):  # no vhost of our own: leave nothing behind
            asyncio.run(delete_namespace(settings))


def site_requests(run: Run, path_prefix: str) -> list[AccessRecord]:
    return [r for r in run.sandbox_log if r.kind == "site" and r.path.startswith(path_prefix)]


def test_a_fetch_that_hangs_past_the_deadline_is_retried_then_dead_as_timeout(run: Run) -> None:
    r = run.results["hang"]
    assert r.state == "dead" and r.dead is not None and r.dead["reason"] == "timeout"
    spent = [e for e in r.events if e["outcome"] == "timeout"]
    assert len(spent) == 3 and r.attempts == 3
    assert [e["delay"] for e in spent[:2]] == sorted(e["delay"] for e in spent[:2])
    assert all(e["delay"] in (0.2, 0.5, 1.0) for e in spent[:2])
    assert spent[-1]["next"] == "dead"


def test_a_reset_connection_is_retried_then_dead_as_reset(run: Run) -> None:
    r = run.results["reset"]
    assert r.dead is not None and r.dead["reason"] == "reset"
    assert r.tries == ["reset", "reset", "reset"]
    assert len(site_requests(run, "/reset")) >= 3


def test_a_proxy_failure_spends_nothing_and_the_next_attempt_uses_another_proxy(run: Run) -> None:
    bad = {run.proxy_ids["broken"], run.proxy_ids["closed"]}
    failures = 0
    for r in run.results.values():
        for i, event in enumerate(r.events):
            if event["outcome"] != "proxy_failure":
                continue
            failures += 1
            assert event["proxy_id"] in bad
            assert event["next"] == "frontier" and event["delay"] is None
            later = [e["proxy_id"] for e in r.events[i + 1 :] if e["proxy_id"]]
            assert event["proxy_id"] not in later, r.url
    assert failures > 0
    healthy = run.results["healthy"]
    assert healthy.state == "stored" and healthy.attempts == 1


def test_a_403_block_page_is_retried_on_a_longer_tier_with_a_different_proxy_each_time(run: Run) -> None:
    r = run.results["block_403"]
    assert r.dead is not None and r.dead["reason"] == "blocked"
    blocked = [e for e in r.events if e["outcome"] == "blocked"]
    assert len(blocked) == 3
    assert len({e["proxy_id"] for e in blocked}) == 3
    assert all(e["delay"] >= 0.5 for e in blocked[:2])


def test_a_challenge_page_served_with_200_counts_as_a_block(run: Run) -> None:
    r = run.results["challenge_200"]
    assert r.state == "dead" and r.item is None
    assert r.dead is not None and r.dead["reason"] == "blocked"
    assert {e["status"] for e in r.events if e["outcome"] == "blocked"} == {200}


def test_a_429_with_retry_after_waits_that_long_unspent_up_to_the_cap(run: Run) -> None:
    r = run.results["throttled_retry_after"]
    throttled = [e for e in r.events if e["outcome"] == "throttled"]
    assert all(e["delay"] >= 1.0 for e in throttled if e["next"] == "retry")
    # Two waits free (HUTCH_MAX_THROTTLES=2), then three spent attempts and dead.
    assert len(throttled) == 5
    assert r.attempts == 3 and r.dead is not None and r.dead["reason"] == "throttled"


def test_a_429_without_retry_after_waits_the_default_pause_and_then_succeeds_unspent(run: Run) -> None:
    r = run.results["throttled_no_retry_after"]
    assert r.state == "stored"
    assert r.tries[-2:] == ["throttled", "ok"]
    # The throttle's own event (a wait for a proxy or a permit may come between it and the ok).
    throttled = [e for e in r.events if e["outcome"] == "throttled"]
    assert throttled[-1]["delay"] == 0.5  # default pause 0.3 s -> the 0.5 s tier
    assert r.attempts == 1


def test_a_500_backs_off_exponentially_and_is_stored_when_the_site_recovers(run: Run) -> None:
    r = run.results["server_error"]
    assert r.state == "stored"
    errors = [e for e in r.events if e["outcome"] == "server_error"]
    assert len(errors) == 2 and r.attempts == 3
    assert errors[0]["delay"] <= errors[1]["delay"]


def test_a_404_goes_dead_at_once_after_one_attempt(run: Run) -> None:
    r = run.results["not_found"]
    assert r.dead is not None and r.dead["reason"] == "not_found" and r.attempts == 1
    assert [e["next"] for e in r.events if e["outcome"] == "not_found"] == ["dead"]


def test_an_oversized_body_goes_dead_without_retry(run: Run) -> None:
    r = run.results["too_large"]
    assert r.dead is not None and r.dead["reason"] == "too_large" and r.attempts == 1


def test_a_cross_domain_redirect_becomes_an_attempt_in_the_other_domains_queue(run: Run) -> None:
    r = run.results["redirect_cross_domain"]
    assert r.state == "stored" and r.item is not None
    assert r.tries[-2:] == ["redirect", "ok"]
    redirect = next(e for e in r.events if e["outcome"] == "redirect")
    assert redirect["next"] == "frontier" and redirect["delay"] is None
    assert r.item["title"] == expected_page("b", 3)["title"]
    assert any(rec.path == "/page/3" and rec.site == "b" for rec in run.sandbox_log if rec.kind == "site")
    assert r.attempts == 1  # the redirect spent nothing; the page it led to spent one


def test_a_redirect_loop_goes_dead_after_the_redirect_limit(run: Run) -> None:
    r = run.results["redirect_loop"]
    assert r.dead is not None and r.dead["reason"] == "redirects"
    assert r.tries[-4:] == ["redirect", "redirect", "redirect", "redirects"]  # hop 4 > HUTCH_MAX_REDIRECTS=3
    assert len(site_requests(run, "/loop/")) == 4


def test_a_loopback_port_outside_the_allowlist_is_refused_without_a_request(run: Run) -> None:
    r = run.results["forbidden"]
    assert r.dead is not None and r.dead["reason"] == "forbidden_target" and r.attempts == 1
    assert "loopback" in r.dead["detail"]
    assert not [rec for rec in run.sandbox_log if rec.kind == "site" and rec.site == "outside"]


def test_a_task_that_spent_every_attempt_is_in_the_dlq_with_its_history_and_a_replay_stores_it(run: Run) -> None:
    before = run.results["exhausted_then_healed"]
    assert before.dead is not None and before.dead["reason"] == "server_error"
    assert before.dead["attempts"] == 3
    assert [e["outcome"] for e in before.events] == ["server_error"] * 3 or before.outcomes.count("server_error") == 3
    after = run.replayed["exhausted_then_healed"]
    assert after.state == "stored" and after.item is not None
    assert after.item["title"] is not None
