"""Choosing a proxy per attempt, with a fake clock and no broker: exclusions, bans, dead
proxies, the per-(proxy, domain) rate cap, health and LRU preference, tiers and floors."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from hutch.models import Event, Lease, LeaseRequest
from hutch.services.proxy_manager.health import HealthConfig
from hutch.services.proxy_manager.leases import CAP_MARGIN, Selector, SelectorConfig
from hutch.services.proxy_manager.pool import PoolConfig, Proxy
from hutch.services.proxy_manager.tiers import TierConfig

from .clock import FakeClock


def pool(dc: int = 3, res: int = 0, mobile: int = 0, floors: dict[str, str] | None = None) -> PoolConfig:
    proxies = [Proxy(f"dc{i}", f"http://u:pw@10.0.1.{i}:8080", "datacenter", 0.0001) for i in range(dc)]
    proxies += [Proxy(f"res{i}", f"http://u:pw@10.0.2.{i}:8080", "residential", 0.001) for i in range(res)]
    proxies += [Proxy(f"mob{i}", f"http://u:pw@10.0.3.{i}:8080", "mobile", 0.003) for i in range(mobile)]
    return PoolConfig(tuple(proxies), floors or {})


def selector(
    clock: FakeClock,
    the_pool: PoolConfig | None = None,
    *,
    cap: float = 1e6,
    floors: dict[str, str] | None = None,
    dead_after: int = 3,
    active_probe: bool = True,
    blocks: int = 3,
    trial_interval: float = 600.0,
    deescalate_after: int = 3,
) -> Selector:
    config = SelectorConfig(
        rate_cap=cap,
        tier_floors=floors,
        health=HealthConfig(
            ban_seconds=60, ban_max=3600, dead_after=dead_after, probe_interval=30, active_probe=active_probe
        ),
        tiers=TierConfig(
            escalate_blocks=blocks, window=60, trial_interval=trial_interval, deescalate_after=deescalate_after
        ),
    )
    s = Selector(config, clock)
    s.set_pool(the_pool or pool())
    return s


def ask(
    s: Selector, domain: str = "shop", task: str = "t1", exclude: tuple[str, ...] = (), floor: str | None = None
) -> Lease:
    """A lease request, one millisecond after the previous one (so the default cap never binds)."""
    assert isinstance(s.clock, FakeClock)
    s.clock.advance(0.001)
    return s.lease(LeaseRequest(task_id=task, domain=domain, exclude=list(exclude), tier_floor=floor))


def report(s: Selector, lease: Lease, outcome: str, domain: str = "shop", task: str = "t1") -> None:
    s.report(
        Event(
            kind="outcome",
            task_id=task,
            job="j",
            domain=domain,
            attempt=1,
            outcome=outcome,
            proxy_id=lease.proxy_id,
            tier=lease.tier,
            cost=lease.cost,
        )
    )


# -- the lease itself ----------------------------------------------------------------------------


def test_a_lease_names_the_proxy_its_url_tier_and_cost() -> None:
    lease = ask(selector(FakeClock(1_000_000.0)))
    assert lease.proxy_id == "dc0"
    assert lease.url == "http://u:pw@10.0.1.0:8080"
    assert (lease.tier, lease.cost, lease.direct, lease.retry_in) == ("datacenter", 0.0001, False, None)


def test_an_empty_pool_never_goes_direct_but_says_when_to_ask_again() -> None:
    s = selector(FakeClock(1_000_000.0), PoolConfig())
    lease = ask(s)
    assert lease.direct is False and lease.proxy_id is None
    assert lease.retry_in is not None and lease.retry_in > 0


# -- exclusions ----------------------------------------------------------------------------------


def test_a_retry_never_gets_a_proxy_that_failed_this_task() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock)
    for _ in range(20):
        clock.advance(1)
        lease = ask(s, exclude=("dc0", "dc2"))
        assert lease.proxy_id == "dc1"


def test_an_exclusion_applies_only_to_the_task_that_carries_it() -> None:
    s = selector(FakeClock(1_000_000.0))
    assert ask(s, task="a", exclude=("dc0",)).proxy_id == "dc1"
    assert ask(s, task="b").proxy_id == "dc0"


def test_when_every_datacenter_proxy_failed_the_task_it_gets_a_residential_one() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=2, res=1))
    lease = ask(s, exclude=("dc0", "dc1"))
    assert (lease.proxy_id, lease.tier) == ("res0", "residential")


def test_when_every_proxy_failed_the_task_the_exclusion_is_dropped_rather_than_stall() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=2))
    lease = ask(s, exclude=("dc0", "dc1"))
    assert lease.proxy_id in ("dc0", "dc1")


def test_unknown_ids_in_the_exclusion_do_not_matter() -> None:
    assert ask(selector(FakeClock(1_000_000.0)), exclude=("px-gone",)).proxy_id == "dc0"


# -- least recently used, healthy first ------------------------------------------------------------


def test_leases_go_round_the_pool_least_recently_used_first() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock)
    chosen = []
    for _ in range(6):
        clock.advance(0.01)
        chosen.append(ask(s).proxy_id)
    assert chosen == ["dc0", "dc1", "dc2", "dc0", "dc1", "dc2"]


def test_least_recently_used_counts_leases_on_every_domain() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock)
    assert ask(s, domain="a").proxy_id == "dc0"
    clock.advance(0.01)
    assert ask(s, domain="b").proxy_id == "dc1"


def test_an_unhealthy_proxy_is_used_only_when_no_healthy_one_is_free() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2), cap=1.0)
    bad = Lease(proxy_id="dc0", tier="datacenter")
    for _ in range(6):
        report(s, bad, "timeout")  # health well under 0.5 on shop
    assert s.health.score("dc0", "shop") < 0.5
    clock.advance(10)
    assert ask(s, task="a").proxy_id == "dc1"
    clock.advance(0.01)
    # dc1 is at its cap now; dc0 is unhealthy but free: better than no lease.
    assert ask(s, task="b").proxy_id == "dc0"


# -- bans per domain -------------------------------------------------------------------------------


def test_a_blocked_proxy_is_banned_on_that_domain_only() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2))
    first = ask(s, domain="shop")
    assert first.proxy_id == "dc0"
    report(s, first, "blocked", domain="shop")
    for _ in range(10):
        clock.advance(1)
        assert ask(s, domain="shop").proxy_id == "dc1"
    clock.advance(1)
    assert {ask(s, domain="news", task=f"n{i}").proxy_id for i in range(4)} == {"dc0", "dc1"}


def test_a_ban_ends_after_its_cooldown() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1))
    report(s, ask(s), "blocked")
    clock.advance(59)
    assert ask(s).proxy_id is None
    clock.advance(2)
    assert ask(s).proxy_id == "dc0"


def test_the_cooldown_doubles_with_each_repeated_block() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), blocks=100)
    durations = []
    for _ in range(4):
        report(s, ask(s), "blocked")
        started = clock.now
        while ask(s).proxy_id is None:
            clock.advance(1)
        durations.append(round(clock.now - started))
    assert durations == [60, 120, 240, 480]


def test_a_block_reported_during_a_ban_does_not_lengthen_it() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1))
    lease = ask(s)
    report(s, lease, "blocked")
    report(s, lease, "blocked")  # a request sent before the ban, answered late
    clock.advance(61)
    assert ask(s).proxy_id == "dc0"


def test_when_every_proxy_is_banned_the_lease_says_when_the_first_ban_ends() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2), blocks=100)
    report(s, ask(s, task="a"), "blocked")
    clock.advance(10)
    report(s, ask(s, task="b"), "blocked")
    lease = ask(s, task="c")
    assert lease.proxy_id is None
    assert lease.retry_in == pytest.approx(50, abs=0.01)


def test_a_ban_of_some_proxies_of_a_tier_does_not_move_the_domain_to_a_costlier_tier() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=3, res=1), blocks=100)
    report(s, ask(s, task="a"), "blocked")
    report(s, ask(s, task="b"), "blocked")
    assert [ask(s, task=f"c{i}").proxy_id for i in range(3)] == ["dc2"] * 3


def test_when_every_proxy_of_the_tier_is_banned_on_a_domain_it_moves_to_the_next_tier() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2, res=1), blocks=3)  # two proxies can never collect three blocks
    report(s, ask(s, task="a"), "blocked")
    report(s, ask(s, task="b"), "blocked")
    assert ask(s, task="c").tier == "residential"
    assert ask(s, domain="news", task="d").tier == "datacenter"
    clock.advance(3600)  # the bans are over; the learned tier stays until a trial says otherwise
    assert ask(s, task="e").tier == "datacenter"  # ... which is due now: one trial lease
    assert ask(s, task="f").tier == "residential"


def test_with_no_costlier_tier_every_proxy_banned_means_waiting_for_the_first_ban_to_end() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2), blocks=100)
    report(s, ask(s, task="a"), "blocked")
    report(s, ask(s, task="b"), "blocked")
    lease = ask(s, task="c")
    assert lease.proxy_id is None and lease.retry_in == pytest.approx(60, abs=0.01)


# -- the rate cap per (proxy, domain) --------------------------------------------------------------


def test_one_proxy_never_exceeds_its_cap_on_one_domain() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), cap=2.0)
    granted = []
    for step in range(1000):  # 10 s asked every 10 ms
        clock.now = 1_000_000.0 + step * 0.01
        if ask(s, task=f"t{step}").proxy_id:
            granted.append(clock.now)
    gaps = [b - a for a, b in pairwise(granted)]
    assert min(gaps) >= 0.5 * CAP_MARGIN - 1e-9
    assert 17 <= len(granted) <= 19  # 2/s with a 10% margin over 10 s


def test_at_its_cap_the_lease_says_when_the_proxy_is_free_again() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), cap=2.0)
    assert ask(s).proxy_id == "dc0"
    clock.advance(0.2)
    lease = ask(s)
    assert lease.proxy_id is None
    assert lease.retry_in == pytest.approx(0.5 * CAP_MARGIN - 0.2 - 0.001)


def test_the_cap_is_per_domain_so_one_proxy_serves_many_domains_at_once() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=1), cap=1.0)
    assert [ask(s, domain=d).proxy_id for d in ("a", "b", "c")] == ["dc0", "dc0", "dc0"]


def test_the_fleet_rate_to_one_domain_spreads_over_the_proxies() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=4), cap=1.0)
    used: Counter[str] = Counter()
    for step in range(400):  # 4 requests a second for 100 s
        clock.now = 1_000_000.0 + step * 0.25
        lease = ask(s, task=f"t{step}")
        if lease.proxy_id:
            used[lease.proxy_id] += 1
    assert set(used) == {"dc0", "dc1", "dc2", "dc3"}
    assert max(used.values()) <= 100 / CAP_MARGIN + 1


# -- dead proxies ----------------------------------------------------------------------------------


def test_repeated_proxy_failures_mark_a_proxy_dead_and_it_gets_no_lease() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2), dead_after=3)
    dead = Lease(proxy_id="dc0", tier="datacenter")
    for domain in ("a", "b", "c"):  # from several domains: the proxy, not one site
        report(s, dead, "proxy_failure", domain=domain)
    for i in range(10):
        clock.advance(1)
        assert ask(s, domain=f"d{i}").proxy_id == "dc1"


def test_a_success_between_proxy_failures_resets_the_count() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=1), dead_after=3)
    lease = Lease(proxy_id="dc0", tier="datacenter")
    for outcome in ("proxy_failure", "proxy_failure", "ok", "proxy_failure", "proxy_failure"):
        report(s, lease, outcome)
    assert not s.health.is_dead("dc0")


def test_a_dead_proxy_comes_back_only_after_a_successful_probe() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), dead_after=1, active_probe=True)
    report(s, Lease(proxy_id="dc0", tier="datacenter"), "proxy_failure")
    assert ask(s).proxy_id is None
    assert s.due_for_probe() == []
    clock.advance(31)
    assert [p.id for p in s.due_for_probe()] == ["dc0"]
    s.probed("dc0", ok=False)
    assert ask(s).proxy_id is None
    assert s.due_for_probe() == []
    clock.advance(31)
    s.probed("dc0", ok=True)
    assert ask(s).proxy_id == "dc0"


def test_without_a_probe_url_a_dead_proxy_gets_one_trial_lease_per_interval() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), dead_after=1, active_probe=False)
    report(s, Lease(proxy_id="dc0", tier="datacenter"), "proxy_failure")
    assert ask(s).proxy_id is None
    clock.advance(31)
    trial = ask(s)
    assert trial.proxy_id == "dc0"
    assert ask(s, task="other").proxy_id is None  # one trial at a time
    report(s, trial, "ok")
    clock.advance(1)
    assert ask(s, task="other").proxy_id == "dc0"


def test_every_proxy_dead_means_asking_again_when_the_first_is_probed() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1), dead_after=1)
    report(s, Lease(proxy_id="dc0", tier="datacenter"), "proxy_failure")
    clock.advance(10)
    lease = ask(s)
    assert lease.proxy_id is None and lease.retry_in == pytest.approx(20, abs=0.01)


def test_when_every_datacenter_proxy_is_dead_a_residential_one_carries_the_work() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=1, res=1), dead_after=1)
    report(s, Lease(proxy_id="dc0", tier="datacenter"), "proxy_failure")
    assert ask(s).proxy_id == "res0"


# -- tiers and floors -----------------------------------------------------------------------------


def test_a_domain_starts_on_the_cheapest_tier() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=1, res=1, mobile=1))
    assert ask(s).tier == "datacenter"


def test_k_blocks_in_the_window_move_the_domain_to_residential_and_others_stay() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=4, res=2), blocks=3)
    for i in range(3):
        clock.advance(1)
        report(s, ask(s, task=f"t{i}"), "blocked", task=f"t{i}")
    for i in range(10):
        clock.advance(1)
        assert ask(s, task=f"u{i}").tier == "residential"
        assert ask(s, domain="news", task=f"n{i}").tier == "datacenter"


def test_blocks_spread_wider_than_the_window_do_not_escalate() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=4, res=1), blocks=3)
    for i in range(6):
        clock.advance(31)
        report(s, ask(s, task=f"t{i}"), "blocked", task=f"t{i}")
    clock.advance(1)
    assert s.tiers.level("shop") == 0


def test_a_job_floor_raises_the_tier_for_its_tasks_only() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=1, res=1))
    assert ask(s, task="a", floor="residential").tier == "residential"
    assert ask(s, task="b").tier == "datacenter"


def test_a_domain_floor_from_the_settings_or_the_pool_file_raises_the_tier() -> None:
    floors = {"bank": "mobile"}
    s = selector(FakeClock(1_000_000.0), pool(dc=1, res=1, mobile=1, floors=floors), floors={"shop": "residential"})
    assert ask(s, domain="shop").tier == "residential"
    assert ask(s, domain="bank").tier == "mobile"
    assert ask(s, domain="news").tier == "datacenter"


def test_a_floor_no_proxy_in_the_pool_meets_waits_rather_than_use_a_cheaper_tier() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=2))
    lease = ask(s, floor="residential")
    assert lease.proxy_id is None and lease.retry_in is not None


def test_an_escalated_domain_tries_the_cheaper_tier_once_per_interval_with_one_lease_at_a_time() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=4, res=2), blocks=3, trial_interval=600, deescalate_after=3)
    for i in range(3):
        report(s, ask(s, task=f"t{i}"), "blocked", task=f"t{i}")
    clock.advance(599)
    assert ask(s, task="x").tier == "residential"
    clock.advance(2)
    trial = ask(s, task="trial1")
    assert trial.tier == "datacenter"
    assert ask(s, task="other").tier == "residential"  # while the trial lease is out
    report(s, trial, "blocked", task="trial1")
    blocks = 1
    while True:
        clock.advance(1)
        lease = ask(s, task=f"trial{blocks + 1}")
        if lease.tier != "datacenter":
            break
        report(s, lease, "blocked", task=f"trial{blocks + 1}")
        blocks += 1
    assert blocks == 3  # the trial ended after K blocks
    clock.advance(300)
    assert ask(s, task="later").tier == "residential"  # no new trial before another interval


def test_a_run_of_successes_on_the_cheaper_tier_brings_the_domain_back_down() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2, res=2), blocks=3, trial_interval=600, deescalate_after=3)
    for i in range(3):
        report(s, ask(s, task=f"t{i}"), "blocked", task=f"t{i}")
    clock.advance(601)
    for i in range(3):
        trial = ask(s, task=f"ok{i}")
        assert trial.tier == "datacenter"
        report(s, trial, "ok", task=f"ok{i}")
        clock.advance(1)
    assert all(ask(s, task=f"after{i}").tier == "datacenter" for i in range(5))


def test_a_late_block_from_before_the_escalation_is_not_counted_again() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=4, res=2, mobile=1), blocks=3)
    early = [ask(s, task=f"t{i}") for i in range(4)]
    for i, lease in enumerate(early):
        report(s, lease, "blocked", task=f"t{i}")  # the fourth arrives after the escalation
    assert s.tiers.level("shop") == 1


def test_the_proxy_pool_reload_keeps_health_and_tiers_of_proxies_kept() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2, res=1), blocks=1)
    report(s, ask(s), "blocked")
    assert s.tiers.level("shop") == 1
    s.set_pool(pool(dc=3, res=1))
    assert ask(s).tier == "residential"
    assert s.health.banned_until("dc0", "shop", clock.now) is not None


def test_a_learned_tier_gone_from_the_pool_falls_back_to_what_the_pool_has() -> None:
    s = selector(FakeClock(1_000_000.0), pool(dc=2, res=1), blocks=1)
    report(s, ask(s), "blocked")
    s.set_pool(pool(dc=2))
    assert ask(s).tier == "datacenter"


def test_events_without_a_proxy_change_nothing() -> None:
    s = selector(FakeClock(1_000_000.0))
    before = s.version
    for outcome in ("permit_expired", "permit_late", "no_lease", "no_proxy", "redelivered"):
        s.report(Event(kind="outcome", task_id="t", job="j", domain="shop", attempt=0, outcome=outcome))
    assert s.version == before


def test_a_block_reported_long_after_it_happened_starts_no_ban_that_would_have_ended() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=1))
    lease = ask(s)
    clock.advance(120)  # the manager was down; the report waited in the durable events queue
    s.report(
        Event(
            kind="outcome", task_id="t1", job="j", domain="shop", attempt=1, at=clock.now - 119,
            outcome="blocked", proxy_id=lease.proxy_id, tier=lease.tier,
        )
    )
    assert ask(s).proxy_id == "dc0"


def test_a_domain_whose_floor_tier_is_blocked_too_moves_to_the_next_tier() -> None:
    clock = FakeClock(1_000_000.0)
    s = selector(clock, pool(dc=2, res=3, mobile=1, floors={"bank": "residential"}), blocks=3)
    for i in range(3):
        lease = ask(s, domain="bank", task=f"t{i}")
        assert lease.tier == "residential"
        report(s, lease, "blocked", domain="bank", task=f"t{i}")
    assert ask(s, domain="bank", task="after").tier == "mobile"
    assert ask(s, domain="news", task="other").tier == "datacenter"
