"""The metrics as a real Prometheus sees them: every service scraped during a sandbox job.

Prometheus (Debian's package, on loopback) runs the scrape configuration the project ships
for `hutch up` (`deploy/prometheus/hutch-up.yml`), its targets moved to the free ports this
test gives the services. Its query API must then return the four signals with the values
the job implies: a queue that filled and emptied, retries on the faulty site only, dead
letters on the failing one, a permit per page. `promtool check metrics` passes on every
endpoint, and `/healthz` and `/readyz` answer on the same ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig

from hutch.settings import Settings
from hutch.store import Store

from .conftest import METRICS_SERVICES as SERVICES
from .conftest import free_port, on_ports, running_services, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "deploy" / "prometheus" / "hutch-up.yml"
GOOD, FLAKY, FAILING = 30, 6, 4


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def ports(metrics_ports: dict[str, int]) -> dict[str, int]:
    return metrics_ports


@pytest.fixture
def settings(settings: Settings, ports: dict[str, int]) -> Settings:
    # The governor holds a second of each domain's rate and parks the rest in a delay tier,
    # so a queue fills and empties while the job lasts a few scrapes. The shortest tier is
    # 3 s: with the tests' 0.2-1 s tiers a park stayed one scrape or two, and a loaded CI
    # machine saw the queues empty at every scrape.
    return on_ports(settings, ports, rate=5.0, hold_horizon=1.0, metrics_interval=0.5, retry_delays=(3.0, 10.0))


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {
            "host": "127.0.0.1",
            "seed": 3,
            "sites": [
                {"name": "good", "port": 0, "pages": GOOD},
                {"name": "flaky", "port": 0, "pages": 1},
                {"name": "failing", "port": 0, "pages": 1},
            ],
        }
    )
    async with Sandbox(config) as box:
        yield box


@pytest.fixture
def prometheus(tmp_path: Path, ports: dict[str, int]) -> Iterator[str]:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        why = "Debian's prometheus package is not installed (make tools installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    config = yaml.safe_load(SHIPPED.read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(SHIPPED.parent / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        service = job["static_configs"][0]["labels"]["service"]
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{ports[service]}"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(f"{base}/-/ready", 1.0)[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus not ready after 30 s"
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def query(base: str, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    """An instant query's result: labels (without __name__) -> value."""
    status, body = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, body[:500]
    found = json.loads(body)["data"]["result"]
    return {
        tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1]) for r in found
    }


def one(base: str, expr: str) -> float:
    found = query(base, expr)
    assert len(found) == 1, (expr, found)
    return next(iter(found.values()))


async def test_prometheus_scrapes_the_four_signals_from_every_service_during_a_job(
    settings: Settings, sandbox: Sandbox, prometheus: str, ports: dict[str, int]
) -> None:
    good, flaky, failing = (sandbox.sites[n].base_url for n in ("good", "flaky", "failing"))
    domain = {n: urllib.parse.urlsplit(sandbox.sites[n].base_url).netloc for n in ("good", "flaky", "failing")}
    urls = (
        [f"{good}/page/{n}" for n in range(GOOD)]
        + [f"{flaky}/flaky/m{n}?fail=1&code=500" for n in range(FLAKY)]
        + [f"{failing}/status/404?n={n}" for n in range(FAILING)]
    )
    async with running_services(settings, sandbox, {}) as services:
        for name, port in ports.items():  # ready: connected and consuming
            assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200, name
            assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200, name
        await submit_urls(settings, "watched", urls)
        counts = await services.wait_done("watched", timeout=120)
        assert (counts.stored, counts.dead) == (GOOD + FLAKY, FAILING)
        await asyncio.sleep(4.0)  # the governor's next depth reading, and two more scrapes
        for name, port in ports.items():
            status, body = get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200, name
            lint = await asyncio.to_thread(
                subprocess.run, ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30
            )
            assert lint.returncode == 0, (name, lint.stdout.decode()[-1500:], lint.stderr.decode()[-1500:])
        up = query(prometheus, "up")
        assert len(up) == len(SERVICES) and set(up.values()) == {1.0}, up

        # Queue depth: something filled up while the job ran (the governor parks what its
        # hold horizon cannot cover at 5/s), and every work queue is empty now.
        peak = one(prometheus, 'max_over_time(sum(hutch_queue_depth{queue!~"dlq|dead.ledger"})[5m:1s])')
        assert peak > 0
        now = query(prometheus, 'hutch_queue_depth{queue!~"dlq|dead.ledger"}')
        assert now and set(now.values()) == {0.0}, now
        assert one(prometheus, 'hutch_queue_depth{queue="dlq"}') == FAILING

        # Task age: every fetch observed; retries on the faulty site, none elsewhere.
        assert one(prometheus, "sum(hutch_task_age_seconds_count)") >= GOOD + FLAKY + FAILING
        retries = query(prometheus, "sum by (domain, reason) (hutch_retries_total)")
        assert retries == {(("domain", domain["flaky"]), ("reason", "server_error")): float(FLAKY)}, retries
        # Dead letters: the failing site's, named by stage and reason.
        dead = query(prometheus, "hutch_dead_letters_total")
        assert {dict(k)["domain"]: (dict(k)["stage"], dict(k)["reason"], v) for k, v in dead.items()} == {
            domain["failing"]: ("fetch", "not_found", float(FAILING))
        }
        # Permits: one per fetch of a good page at least; the rate a domain runs at.
        assert one(prometheus, f'hutch_permits_total{{domain="{domain["good"]}"}}') >= GOOD
        assert one(prometheus, f'hutch_domain_rate{{domain="{domain["good"]}"}}') == pytest.approx(5.0)
        fetched = query(prometheus, "sum by (outcome) (hutch_fetches_total)")
        assert fetched[(("outcome", "ok"),)] >= GOOD + FLAKY
        assert fetched[(("outcome", "server_error"),)] == FLAKY
        assert one(prometheus, 'sum(hutch_fetch_duration_seconds_count{tier="direct"})') >= GOOD
        assert one(prometheus, "hutch_fetch_demand") <= 0  # nothing waits now
        assert one(prometheus, "hutch_items_stored_total") == GOOD + FLAKY
        assert one(prometheus, 'hutch_pages_parsed_total{outcome="ok"}') == GOOD + FLAKY
        assert one(prometheus, "hutch_parse_duration_seconds_count") == GOOD + FLAKY

        # Every query of the shipped dashboard is valid PromQL on these series.
        dashboard = json.loads((REPO / "deploy" / "grafana" / "hutch.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                query(prometheus, target["expr"])

    store = Store(settings.store_location)
    try:
        assert len(store.dead_entries(job="watched")) == FAILING
    finally:
        store.close()
