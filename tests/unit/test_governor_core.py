"""The governor's decisions with a fake clock: pauses, AIMD, leases, robots, takeover, capacity."""

from __future__ import annotations

import pytest

from hutch.models import Event, FetcherHeartbeat, RobotsFetched, Task
from hutch.services.governor.capacity import FleetCapacity
from hutch.services.governor.core import Core, CoreConfig, robots_task_id
from hutch.services.governor.limits import DomainLimit, Limits
from hutch.services.governor.robots import RobotsCache
from hutch.services.governor.suffixes import key_function

from .clock import FakeClock

UA = "Hutch/0.1"
D = "a.example"




def make_core(
    clock: FakeClock,
    *,
    rate: float = 4.0,
    burst: int = 1,
    concurrency: int = 8,
    robots: bool = False,
    capacity: FleetCapacity | None = None,
    key: str = "host",
    **config: float,
) -> Core:
    cache = RobotsCache(UA, ttl=3600, retry=10, attempts=3, fetch_deadline=60) if robots else None
    core = Core(
        "gov-a",
        Limits(DomainLimit(rate, burst, concurrency)),
        clock=clock,
        config=CoreConfig(permit_ttl=30.0, fetch_deadline=40.0, **config),  # type: ignore[arg-type]
        key_of=key_function(key),
        robots=cache,
        capacity=capacity or FleetCapacity(fallback=100),
    )
    return core


def task(n: int = 0, domain: str = D, **fields: object) -> Task:
    return Task(id=f"t{n}", job="j", url=f"http://{domain}/page/{n}", domain=domain, **fields)  # type: ignore[arg-type]


def outcome(t: Task, outcome: str, clock: FakeClock, **fields: object) -> Event:
    permit = t.permit.id if t.permit else None
    return Event(kind="outcome", task_id=t.id, job=t.job, domain=t.domain, attempt=1, outcome=outcome,
                 permit_id=permit, at=clock.now, **fields)  # type: ignore[arg-type]


def released_by(governor: str, n: int, domain: str, clock: FakeClock) -> Event:
    return Event(kind="released", task_id=f"x{n}", job="j", domain=domain, attempt=0,
                 permit_id=f"{governor}.{n}", at=clock.now)


def new_domain(core: Core, domain: str = D) -> None:
    core.activate(domain)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


# -- pacing -------------------------------------------------------------------------------


def test_a_brand_new_domain_releases_at_its_rate_from_an_empty_bucket(clock: FakeClock) -> None:
    core = make_core(clock, rate=2.0)  # a token every 0.5 s; issued up to 0.25 s ahead
    new_domain(core)
    verdict = core.check(task(), D)
    assert (verdict.action, verdict.reason) == ("wait", "rate")
    assert verdict.until == pytest.approx(clock.now + 0.25)
    clock.advance(0.25)
    assert core.check(task(), D).action == "release"
    released = core.commit(task(), D)
    assert released.permit is not None
    assert released.permit.not_before == pytest.approx(clock.now + 0.25)  # the token's moment
    assert released.permit.expires == pytest.approx(clock.now + 30.0)
    assert core.check(task(1), D).until == pytest.approx(clock.now + 0.5)  # the next at +0.75


def test_permits_issued_ahead_keep_the_buckets_spacing_however_late_the_governor_woke(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0)
    new_domain(core)
    start = clock.now
    moments = []
    for n, woke_late in enumerate([0.0, 0.2, 0.01, 0.15, 0.0, 0.24]):
        verdict = core.check(task(n), D)
        if verdict.action == "wait":
            clock.now = verdict.until
        clock.advance(woke_late)  # the governor's own lateness, below the lead
        assert core.check(task(n), D).action == "release"
        permit = core.commit(task(n), D).permit
        assert permit is not None
        moments.append(permit.not_before if permit.not_before is not None else permit.issued)
    assert moments == pytest.approx([start + 0.25 * k for k in range(1, 7)])


def test_with_no_lead_a_permit_is_issued_when_its_token_is_due_and_carries_no_moment(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0, permit_lead=0.0)
    new_domain(core)
    assert core.check(task(), D).until == pytest.approx(clock.now + 0.25)
    clock.advance(0.25)
    permit = core.commit(task(), D).permit
    assert permit is not None and permit.not_before is None


def test_permit_ids_are_unique_and_name_the_governor(clock: FakeClock) -> None:
    core = make_core(clock)
    new_domain(core)
    ids = set()
    for n in range(5):
        clock.advance(1)
        released = core.commit(task(n), D)
        assert released.permit is not None
        ids.add(released.permit.id)
    assert len(ids) == 5
    assert all(i.startswith("gov-a.") for i in ids)


# -- fleet-wide pushback --------------------------------------------------------------------


def test_a_429_with_retry_after_pauses_the_domain_for_that_long(clock: FakeClock) -> None:
    core = make_core(clock)
    new_domain(core)
    clock.advance(1)
    t = core.commit(task(), D)
    core.on_outcome(outcome(t, "throttled", clock, status=429, retry_after=7.0))
    verdict = core.check(task(1), D)
    assert (verdict.action, verdict.reason) == ("wait", "pause")
    assert verdict.until == pytest.approx(clock.now + 7.0)
    assert "Retry-After 7s" in verdict.why
    clock.advance(7.0)
    assert core.check(task(1), D).action == "release"


def test_a_429_without_retry_after_pauses_for_the_default(clock: FakeClock) -> None:
    core = make_core(clock, default_pause=12.0)
    new_domain(core)
    core.on_outcome(outcome(task(), "throttled", clock, status=503))
    assert core.check(task(1), D).until == pytest.approx(clock.now + 12.0)


def test_a_huge_retry_after_is_capped(clock: FakeClock) -> None:
    core = make_core(clock, max_pause=60.0)
    new_domain(core)
    core.on_outcome(outcome(task(), "throttled", clock, status=429, retry_after=86400.0))
    assert core.check(task(1), D).until == pytest.approx(clock.now + 60.0)


def test_a_pause_seen_by_any_fetcher_applies_to_tasks_another_fetcher_would_get(clock: FakeClock) -> None:
    # The pause is the domain's, not the fetcher's: the event names no fetcher that matters.
    core = make_core(clock)
    new_domain(core)
    core.on_outcome(outcome(task(), "throttled", clock, status=429, retry_after=3.0, fetcher="f2"))
    assert core.check(task(1), D).action == "wait"
    other = "b.example"
    new_domain(core, other)
    clock.advance(1)
    assert core.check(task(2, other), other).action == "release"  # other domains go on


def test_a_429_streak_lowers_the_rate_and_successes_bring_it_back(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0, aimd_streak=2, aimd_increase=0.5)
    new_domain(core)
    core.on_outcome(outcome(task(1), "throttled", clock, status=429, retry_after=1.0))
    core.on_outcome(outcome(task(2), "throttled", clock, status=429, retry_after=1.0))
    ks = core.keys[D]
    assert ks.aimd.rate == 2.0
    assert ks.bucket.rate == 2.0
    for n in range(4):
        core.on_outcome(outcome(task(10 + n), "ok", clock, status=200))
    assert ks.aimd.rate == 4.0
    assert ks.bucket.rate == 4.0


# -- in flight ------------------------------------------------------------------------------


def test_the_concurrency_cap_holds_until_an_outcome_frees_a_slot(clock: FakeClock) -> None:
    core = make_core(clock, rate=100.0, concurrency=2)
    new_domain(core)
    held = []
    for n in range(2):
        clock.advance(0.1)
        held.append(core.commit(task(n), D))
    clock.advance(0.1)
    verdict = core.check(task(2), D)
    assert (verdict.action, verdict.reason, verdict.in_flight) == ("wait", "concurrency", True)
    assert verdict.why == "2 fetches in flight"
    core.on_outcome(outcome(held[0], "ok", clock))
    assert core.check(task(2), D).action == "release"


def test_the_lease_of_a_fetcher_that_died_expires(clock: FakeClock) -> None:
    core = make_core(clock, rate=100.0, concurrency=1)
    new_domain(core)
    clock.advance(0.1)
    core.commit(task(0), D)
    clock.advance(0.1)
    verdict = core.check(task(1), D)
    assert verdict.until == pytest.approx(clock.now - 0.1 + 30.0 + 40.0)
    clock.advance(70.0)
    assert core.expire() == {D}
    assert core.check(task(1), D).action == "release"


def test_releases_stop_while_outstanding_permits_fill_the_fleets_capacity(clock: FakeClock) -> None:
    capacity = FleetCapacity(stale_after=3.0)
    core = make_core(clock, rate=100.0, capacity=capacity)
    core.on_heartbeat(FetcherHeartbeat(fetcher="f1", concurrency=2, busy=0, at=clock.now))
    domains = [f"d{i}.example" for i in range(3)]
    for d in domains:
        new_domain(core, d)
    clock.advance(0.1)
    released = [core.commit(task(i, d), d) for i, d in enumerate(domains[:2])]
    verdict = core.check(task(2, domains[2]), domains[2])
    assert (verdict.action, verdict.reason, verdict.gate) == ("wait", "capacity", True)
    core.on_outcome(outcome(released[0], "ok", clock))
    assert core.check(task(2, domains[2]), domains[2]).action == "release"


def test_no_heartbeat_falls_back_to_one_fetchers_worth(clock: FakeClock) -> None:
    core = make_core(clock, rate=100.0, capacity=FleetCapacity(fallback=1))
    for d in ("a.example", "b.example"):
        new_domain(core, d)
    clock.advance(0.1)
    core.commit(task(0, "a.example"), "a.example")
    assert core.check(task(1, "b.example"), "b.example").gate is True


def test_fetch_ready_backlog_stops_releases(clock: FakeClock) -> None:
    core = make_core(clock, rate=100.0, max_ready=5)
    new_domain(core)
    clock.advance(0.1)
    core.saw_ready_depth(5)
    assert core.check(task(), D).gate is True
    core.saw_ready_depth(3)
    assert core.check(task(), D).action == "release"
    core.commit(task(), D)
    core.commit(task(1), D)  # releases since the last look count as waiting there
    assert core.check(task(2), D).gate is True


def test_an_idle_domain_no_one_released_lately_is_forgotten_unless_kept(clock: FakeClock) -> None:
    core = make_core(clock)
    for d in ("a.example", "b.example", "c.example"):
        core.queue(d)
    clock.advance(100.0)
    core.on_released(released_by("gov-b", 1, "c.example", clock))  # c: released lately elsewhere
    core.forget_idle({"b.example"}, idle_after=60.0, now=clock.now)
    assert set(core.queues) == {"b.example", "c.example"}


# -- several governors ------------------------------------------------------------------------


def test_another_governors_releases_spend_this_governors_tokens(clock: FakeClock) -> None:
    core = make_core(clock, rate=2.0)
    new_domain(core)
    clock.advance(0.5)
    core.on_released(released_by("gov-b", 1, D, clock))
    assert core.check(task(), D).until == pytest.approx(clock.now + 0.5)
    assert core.leases.count(D) == 1


def test_the_echo_of_our_own_release_is_not_counted_again(clock: FakeClock) -> None:
    core = make_core(clock)
    new_domain(core)
    clock.advance(1)
    t = core.commit(task(), D)
    assert t.permit is not None
    core.on_released(Event(kind="released", task_id=t.id, job="j", domain=D, attempt=0, permit_id=t.permit.id))
    assert core.leases.total == 1


def test_a_restarted_governor_waits_one_permit_lifetime_after_a_release_it_read_in_the_log(
    clock: FakeClock,
) -> None:
    core = make_core(clock)
    core.on_released(released_by("gov-before-restart", 1, D, clock))  # read back from released.log
    assert core.activate(D) == pytest.approx(clock.now + 30.0)
    clock.advance(29.0)
    verdict = core.check(task(), D)
    assert (verdict.action, verdict.reason) == ("wait", "takeover")
    clock.advance(1.0)
    assert core.check(task(), D).action == "release"


def test_a_domain_no_one_released_lately_needs_no_takeover_wait(clock: FakeClock) -> None:
    core = make_core(clock)
    assert core.activate(D) <= clock.now


def test_a_standby_takes_over_one_permit_lifetime_after_the_last_release_it_heard(clock: FakeClock) -> None:
    core = make_core(clock)
    clock.advance(100.0)  # the standby has been listening longer than a permit lifetime
    core.queue(D)
    core.on_released(released_by("gov-a-old", 1, D, clock))
    last = clock.now
    clock.advance(5.0)  # the active governor died; the broker hands the queue over
    assert core.activate(D) == pytest.approx(last + 30.0)
    assert core.keys[D].bucket.tokens <= 0  # an empty bucket: no burst at takeover


def test_a_standby_that_heard_no_release_takes_over_at_once(clock: FakeClock) -> None:
    core = make_core(clock)
    clock.advance(100.0)
    core.queue(D)
    assert core.activate(D) <= clock.now


def test_a_domain_is_activated_once_until_its_consumer_is_paused(clock: FakeClock) -> None:
    core = make_core(clock)
    core.queue(D)
    first = core.activate(D)
    clock.advance(5)
    assert core.activate(D) == first
    core.deactivate(D)
    core.on_released(released_by("gov-b", 1, D, clock))
    assert core.activate(D) == pytest.approx(clock.now + 30.0)  # anew: another governor released it


# -- robots.txt -------------------------------------------------------------------------------


def test_robots_txt_is_fetched_first_with_the_domains_token_and_pages_wait_for_it(clock: FakeClock) -> None:
    core = make_core(clock, robots=True)
    new_domain(core)
    clock.advance(0.25)
    verdict = core.check(task(), D)
    assert (verdict.action, verdict.robots) == ("release", "http://a.example")
    robots_task = core.robots_task(verdict.robots, D)
    assert (robots_task.url, robots_task.purpose) == ("http://a.example/robots.txt", "robots")
    released = core.commit(robots_task, D)
    assert released.permit is not None
    assert core.check(task(), D).action == "wait"
    core.on_robots(RobotsFetched(domain=D, url=released.url, status=200, text="User-agent: *\nDisallow: /page/1\n",
                                 outcome="ok"))
    assert core.leases.total == 0
    clock.advance(0.25)
    assert core.check(task(0), D).action == "release"
    dead = core.check(task(1), D)
    assert (dead.action, dead.why) == ("dead", "disallowed by robots.txt")


def test_pages_wait_for_a_robots_fetch_in_flight_not_for_its_deadline(clock: FakeClock) -> None:
    core = make_core(clock, robots=True)
    new_domain(core)
    clock.advance(0.25)
    core.commit(core.robots_task("http://a.example", D), D)
    waiting = core.check(task(), D)
    assert (waiting.action, waiting.reason, waiting.in_flight) == ("wait", "robots", True)  # held, not parked
    core.on_robots(RobotsFetched(domain=D, url=f"http://{D}/robots.txt", status=500, outcome="server_error"))
    failing = core.check(task(), D)
    assert (failing.action, failing.in_flight) == ("wait", False)  # a retry later: a long wait, parked


def test_crawl_delay_lowers_the_domains_rate(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0, robots=True)
    new_domain(core)
    core.on_robots(RobotsFetched(domain=D, url=f"http://{D}/robots.txt", status=200,
                                 text="User-agent: *\nCrawl-delay: 2\n", outcome="ok"))
    ks = core.keys[D]
    assert (ks.aimd.ceiling, ks.bucket.rate) == (0.5, 0.5)


def test_a_robots_task_no_longer_needed_is_dropped(clock: FakeClock) -> None:
    core = make_core(clock, robots=True)
    new_domain(core)
    core.on_robots(RobotsFetched(domain=D, url=f"http://{D}/robots.txt", status=404, outcome="not_found"))
    stale = Task(id=robots_task_id(f"http://{D}"), job="_robots", url=f"http://{D}/robots.txt", domain=D,
                 purpose="robots")
    assert core.check(stale, D).action == "drop"


def test_robots_are_ignored_when_the_setting_says_so(clock: FakeClock) -> None:
    core = make_core(clock, robots=False)
    new_domain(core)
    clock.advance(0.25)
    assert core.check(task(), D).robots is None


# -- domain keys --------------------------------------------------------------------------------


def test_subdomains_share_one_limit_with_registrable_keys(clock: FakeClock) -> None:
    core = make_core(clock, rate=1.0, key="registrable")
    for d in ("a.example.com", "b.example.com"):
        new_domain(core, d)
    clock.advance(1.0)
    assert core.check(task(0, "a.example.com"), "a.example.com").action == "release"
    core.commit(task(0, "a.example.com"), "a.example.com")
    assert core.check(task(1, "b.example.com"), "b.example.com").why == "rate"
    assert core.keys["example.com"].queues == {"a.example.com", "b.example.com"}


def test_the_snapshot_shows_rate_pause_and_in_flight(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0)
    new_domain(core)
    clock.advance(1)
    t = core.commit(task(), D)
    core.on_outcome(outcome(task(9), "throttled", clock, status=429, retry_after=5.0))
    (row,) = core.snapshot()
    assert row["domain"] == D
    assert row["rate"] == 4.0
    assert row["in_flight"] == 1
    assert row["paused_for"] == pytest.approx(5.0)
    assert t.permit is not None


def test_an_idle_domain_is_forgotten_whole_and_comes_back_from_its_limit(clock: FakeClock) -> None:
    core = make_core(clock, robots=True)
    cache = core.robots
    assert cache is not None
    t = core.commit(task(), D)
    core.on_robots(RobotsFetched(domain=D, url=f"http://{D}/robots.txt", status=404, outcome="ok"))
    assert not core.idle(D)  # a fetch in flight
    core.on_outcome(outcome(t, "ok", clock))
    assert core.idle(D)
    core.forget(D)
    assert D not in core.queues and core.key_of(D) not in core.keys
    assert f"http://{D}" not in cache.origins  # robots.txt is asked again when it comes back
    again = core.commit(task(1), D).permit  # its bucket starts anew, empty
    assert again is not None and again.not_before == pytest.approx(clock.now + 0.25)
    clock.advance(1.0)
    assert core.check(task(1), D).robots == f"http://{D}"


def test_a_paused_domain_is_not_idle(clock: FakeClock) -> None:
    core = make_core(clock)
    t = core.commit(task(), D)
    core.on_outcome(outcome(t, "throttled", clock, retry_after=60.0))
    assert not core.idle(D)
    clock.advance(61)
    assert core.idle(D)


# -- the demand signal ---------------------------------------------------------------------


def test_demand_is_the_slots_the_limits_fill_over_domains_with_backlog_minus_those_in_flight(clock: FakeClock) -> None:
    core = make_core(clock, rate=4.0, concurrency=3)
    for domain in ("a.example", "b.example", "c.example", "d.example"):
        new_domain(core, domain)
    # a: measured 0.5 s a fetch -> 4/s x 0.5 s = 2 slots; b: 2 s a fetch -> capped at 3;
    # c: one task waiting -> 1; d: paused by a 429 -> none.
    for domain, elapsed in (("a.example", 0.5), ("b.example", 2.0), ("c.example", 0.1)):
        core.on_outcome(outcome(task(0, domain), "ok", clock, elapsed=elapsed))
    core.on_outcome(outcome(task(0, "d.example"), "throttled", clock, status=429, retry_after=60.0))
    released = core.commit(task(1, "a.example"), "a.example")  # one fetch in flight in a
    assert released.permit is not None
    backlog = {"a.example": 50, "b.example": 50, "c.example": 1, "d.example": 50, "e.example": 0}
    wanted, in_flight = core.demand(backlog)
    assert wanted == pytest.approx(2.0 + 3.0 + 0.4)  # c: 4/s x 0.1 s = 0.4 of a slot, under its backlog of 1
    assert in_flight == 1


def test_a_domain_with_no_fetch_measured_counts_a_second_a_fetch(clock: FakeClock) -> None:
    core = make_core(clock, rate=2.0, concurrency=8)
    new_domain(core)
    assert core.demand({D: 100}) == (pytest.approx(2.0), 0)
