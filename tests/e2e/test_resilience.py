"""Work survives what kills processes: delayed retries live in the broker, poison is set
aside, and SIGTERM lets in-flight fetches finish."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time

import pytest
from hutch_sandbox import Sandbox

from hutch.amqp import Broker, topology_for
from hutch.models import DeadLetter, decode
from hutch.settings import Settings
from hutch.store import Store
from hutch.topology import outcome_key

from .conftest import Services, drop_connections, submit_urls

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def queue_depth(settings: Settings, queue: str) -> int:
    broker = await Broker(settings, "test-probe").connect(declare=False)
    try:
        channel = await broker.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await broker.close()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # One long tier, so the retries sit in the broker while every service is down. A governor
    # started again waits a permit lifetime before it releases anything: 4 s here, not 10.
    # It also counts each release it reads back from the released log as a fetch in flight
    # until that release's deadline (4 s + the fetch deadline, 14 s), not hearing the outcomes
    # that came before it: limits on fetches in flight above the releases of a test (21 to
    # one domain in the first) let the permit lifetime decide when it resumes, as said above.
    return settings.model_copy(
        update={"retry_delays": (4.0,), "permit_ttl": 4.0, "concurrency_per_domain": 64, "concurrency": 64}
    )


async def test_retries_waiting_in_a_delay_tier_survive_every_service_being_killed(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["alpha"].base_url
    urls = [f"{base}/flaky/tier-{i}?fail=1&code=500" for i in range(20)]
    await submit_urls(settings, "tiers", urls)
    tier_queue = topology_for(settings).tier_exchange(4.0)
    deadline = time.monotonic() + 30
    while await queue_depth(settings, tier_queue) < 20:  # each failed once and waits 4 s in the broker
        assert time.monotonic() < deadline, "the retries never reached the delay tier"
        await asyncio.sleep(0.1)
    tier = services.supervisor
    await tier.stop()  # SIGTERM, and SIGKILL for anything still alive
    # The TTL runs out while nothing runs: the broker moves them home, out of the tier.
    deadline = time.monotonic() + 30
    while await queue_depth(settings, tier_queue) > 0:
        assert time.monotonic() < deadline, "the retries never left the delay tier"
        await asyncio.sleep(0.2)
    restarted = type(tier)(tier.env, fetchers=1, grace=settings.shutdown_grace, out=None)
    await restarted.start()
    try:
        await restarted.wait_ready(60)
        counts = await services.wait_done("tiers", timeout=60)
    finally:
        await restarted.stop()
    assert counts.stored == 20 and counts.dead == 0
    flaky_hits = [r for r in sandbox.site_log("alpha") if r.path.startswith("/flaky/tier-")]
    assert len(flaky_hits) == 40  # each failed once, then succeeded once: nothing fetched twice


async def test_poison_on_every_queue_is_dead_lettered_and_the_job_still_completes(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    broker = await Broker(settings, "test-poison").connect()
    topology = broker.topology
    try:
        domain = sandbox.sites["beta"].domain
        await submit_urls(settings, "poison", sandbox.sites["beta"].urls()[:5])
        await services.wait_for("poison", lambda c: c.stored >= 1, 30)
        for exchange, key in (
            (topology.frontier, topology.shard_key(domain)),
            (topology.work, "fetch.ready"),
            (topology.work, "parse"),
            (topology.work, "store"),
            (topology.events, outcome_key(domain, proxied=True)),  # the proxy-manager hears these too
        ):
            await broker.publish(exchange, key, b"{not json at all")
        counts = await services.wait_done("poison", timeout=60)
        assert counts.stored + counts.dead == 5
        channel = await broker.channel()
        dlq = await channel.get_queue(topology.dlq, ensure=False)
        letters = []
        deadline = time.monotonic() + 20
        # Six consumers get poison: the governor, the fetcher, the parser, the storer (twice:
        # store and events) and the proxy-manager (events).
        while len([x for x in letters if x.reason == "decode"]) < 6 and time.monotonic() < deadline:
            message = await dlq.get(fail=False, no_ack=True)
            if message is None:
                await asyncio.sleep(0.1)
                continue
            letters.append(decode(message.body, DeadLetter))
        poison = [x for x in letters if x.reason == "decode"]
        assert len(poison) == 6
        assert {x.stage for x in poison} >= {"governor", "fetch", "parse", "store"}
        assert all(x.raw == "{not json at all" for x in poison)
    finally:
        await broker.close()
    store = Store(settings.store_location)
    try:
        assert len([d for d in store.dead_entries() if d["reason"] == "decode"]) == 6
    finally:
        store.close()


async def test_sigterm_lets_in_flight_fetches_finish_before_the_fetcher_exits(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    base = sandbox.sites["gamma"].base_url
    await submit_urls(settings, "drain", [f"{base}/page/{i}" for i in range(40)])
    await services.wait_for("drain", lambda c: c.stored >= 3, 30)
    fetcher = services.supervisor.child("fetcher.1")
    assert fetcher.process is not None
    old = fetcher.process
    sent = time.time()
    services.supervisor.signal("fetcher.1", signal.SIGTERM)
    code = await asyncio.wait_for(old.wait(), settings.shutdown_grace + 5)
    assert code == 0
    # Every request the site received before the SIGTERM got its answer, none was cut off.
    before = [r for r in sandbox.site_log("gamma") if r.ts < sent]
    assert before and all(r.status == 200 or r.fault for r in before)
    counts = await services.wait_done("drain", timeout=60)
    assert counts.stored + counts.dead == 40


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to drop connections")
async def test_every_service_reconnects_when_the_broker_drops_all_connections_mid_job(
    settings: Settings, sandbox: Sandbox, services: Services
) -> None:
    urls = sandbox.sites["delta"].urls() + sandbox.sites["alpha"].urls()
    await submit_urls(settings, "dropped", urls)
    await services.wait_for("dropped", lambda c: c.stored >= 20, 60)
    await drop_connections(settings, "test: broker going away")
    counts = await services.wait_done("dropped", timeout=120)
    assert counts.stored + counts.dead == len(urls)
    # No service had to be restarted: each reconnected on its own.
    assert all(child.restarts == 0 for child in services.supervisor.children)
