"""Proxy health from outcome reports: EWMAs, when a proxy is dead, and bans per domain (for
blocks, and for proxy failures on one domain only)."""

from __future__ import annotations

from hutch.models import OUTCOMES, Event, LeaseRequest
from hutch.services.proxy_manager.health import NO_ANSWER, SAMPLES, Health, HealthConfig
from hutch.services.proxy_manager.leases import Selector, SelectorConfig
from hutch.services.proxy_manager.pool import PoolConfig, Proxy

from .clock import FakeClock


def health(dead_after: int = 3) -> Health:
    return Health(HealthConfig(ban_seconds=60, ban_max=3600, dead_after=dead_after, probe_interval=30))


def test_the_ewma_of_a_proxy_falls_with_failures_and_recovers_with_successes() -> None:
    h = health()
    for _ in range(5):
        h.report("p", "d", "timeout", 1.0)
    low = h.score("p", "d")
    assert low < 0.5
    for _ in range(10):
        h.report("p", "d", "ok", 2.0)
    assert h.score("p", "d") > 0.8 > low


def test_a_block_hurts_the_proxy_on_that_domain_and_not_elsewhere() -> None:
    h = health()
    for _ in range(5):
        h.report("p", "shop", "blocked", 1.0)
    assert h.score("p", "shop") < 0.5
    assert h.score("p", "news") == 1.0


def test_proxy_failures_in_a_row_mark_a_proxy_dead() -> None:
    h = health(dead_after=3)
    changes = [c.kind for i in range(3) for c in h.report("p", f"d{i}", "proxy_failure", float(i))]
    assert changes == ["dead"]
    assert h.is_dead("p") and not h.usable("p", 10.0)


def test_a_proxy_that_only_resets_while_the_same_sites_answer_others_is_dead() -> None:
    h = health(dead_after=2)
    for i in range(4):
        h.report("good", "shop", "ok", 1.0 + i)
        h.report("bad", "shop", "reset", 1.5 + i)
    assert h.is_dead("bad") and not h.is_dead("good")


def test_a_site_that_hangs_for_everyone_kills_no_proxy() -> None:
    h = health(dead_after=2)
    for i in range(10):
        for proxy in ("a", "b"):
            h.report(proxy, "hangs", "timeout", float(i))
    assert not h.is_dead("a") and not h.is_dead("b")


def test_an_http_answer_ends_the_streak_of_silence() -> None:
    h = health(dead_after=2)
    h.report("other", "shop", "ok", 0.5)
    for i in range(3):
        h.report("p", "shop", "reset", 1.0 + i)
    h.report("p", "shop", "server_error", 5.0)  # a 5xx is an answer: the proxy works
    h.report("other", "shop", "ok", 6.0)
    for i in range(3):
        h.report("p", "shop", "reset", 7.0 + i)
    assert not h.is_dead("p")


def test_health_reads_only_the_outcomes_an_attempt_can_have() -> None:
    assert set(SAMPLES) <= set(OUTCOMES) and set(NO_ANSWER) <= set(SAMPLES)


def test_a_ban_then_a_success_leaves_the_ban_in_place() -> None:
    h = health()
    h.report("p", "shop", "blocked", 100.0)
    h.report("p", "shop", "ok", 101.0)  # an answer to a request sent before the block
    assert h.banned_until("p", "shop", 102.0) == 160.0


def test_repeats_are_forgotten_after_ban_max_without_a_block() -> None:
    h = health()
    h.report("p", "shop", "blocked", 0.0)
    h.report("p", "shop", "blocked", 100.0)  # second ban: 120 s
    assert h.banned_until("p", "shop", 101.0) == 220.0
    h.report("p", "shop", "blocked", 100.0 + 3601)
    assert h.banned_until("p", "shop", 3702.0) == 3701.0 + 60


def test_bans_are_capped_at_ban_max() -> None:
    h = Health(HealthConfig(ban_seconds=60, ban_max=200))
    now = 0.0
    for _ in range(5):
        h.report("p", "shop", "blocked", now)
        until = h.banned_until("p", "shop", now)
        assert until is not None and until - now <= 200
        now = until + 1


def test_pruning_forgets_idle_pairs_but_keeps_bans() -> None:
    h = health()
    h.report("p", "quiet", "ok", 0.0)
    h.report("p", "shop", "blocked", 0.0)
    h.prune(10.0)
    assert ("p", "shop") in h.pairs
    h.prune(5000.0)
    assert h.pairs == {}


# -- proxy failures count per (proxy, domain) first ------------------------------------------------


def test_proxy_failures_on_one_domain_ban_the_proxy_there_and_kill_it_nowhere() -> None:
    clock = FakeClock(1000.0)
    h = health(dead_after=3)
    changes = [c for _ in range(3) for c in h.report("p", "hostile", "proxy_failure", clock())]
    assert [(c.kind, c.domain, c.seconds) for c in changes] == [("banned", "hostile", 60)]
    assert not h.is_dead("p") and h.usable("p", clock())
    assert h.banned_until("p", "hostile", clock()) == 1060.0
    assert h.banned_until("p", "books", clock()) is None


def test_a_proxy_that_keeps_failing_on_one_domain_is_banned_there_longer_each_time() -> None:
    clock = FakeClock(1000.0)
    h = health(dead_after=3)
    for _ in range(3):
        h.report("p", "hostile", "proxy_failure", clock())
    clock.advance(61)  # the ban is over; the next failure there is a repeat
    (change,) = h.report("p", "hostile", "proxy_failure", clock())
    assert (change.kind, change.seconds) == ("banned", 120)
    assert not h.is_dead("p")


def test_proxy_failures_in_a_row_from_two_domains_mark_the_proxy_dead() -> None:
    clock = FakeClock(1000.0)
    h = health(dead_after=3)
    kinds = [c.kind for d in ("a", "a", "b") for c in h.report("p", d, "proxy_failure", clock())]
    assert kinds == ["dead"]
    assert h.is_dead("p")


def test_an_answer_on_a_domain_clears_that_pairs_streak() -> None:
    clock = FakeClock(1000.0)
    h = health(dead_after=3)
    h.report("p", "shop", "proxy_failure", clock())
    h.report("p", "shop", "proxy_failure", clock())
    h.report("p", "shop", "not_found", clock())  # an HTTP answer through the proxy
    assert [c.kind for c in h.report("p", "shop", "proxy_failure", clock())] == []
    assert h.banned_until("p", "shop", clock()) is None


def test_the_pair_streak_survives_a_restart() -> None:
    clock = FakeClock(1000.0)
    h = health(dead_after=3)
    for _ in range(2):
        h.report("p", "hostile", "proxy_failure", clock())
    restored = health(dead_after=3)
    restored.restore(h.snapshot(clock()))
    (change,) = restored.report("p", "hostile", "proxy_failure", clock())
    assert change.kind == "banned"


def test_one_hostile_domain_cannot_empty_the_pool_for_other_domains() -> None:
    clock = FakeClock(1_000_000.0)
    s = Selector(
        SelectorConfig(rate_cap=1e6, health=HealthConfig(ban_seconds=60, ban_max=3600, dead_after=3)), clock
    )
    s.set_pool(PoolConfig(tuple(Proxy(f"dc{i}", f"http://10.0.1.{i}:8080") for i in range(3))))
    for round_ in range(3):
        for proxy in ("dc0", "dc1", "dc2"):
            clock.advance(0.01)
            s.report(Event(kind="outcome", task_id=f"t{round_}", job="j", domain="hostile", attempt=1,
                           outcome="proxy_failure", proxy_id=proxy, tier="datacenter"))
    assert not any(s.health.is_dead(p) for p in ("dc0", "dc1", "dc2"))
    clock.advance(0.01)
    assert s.lease(LeaseRequest(task_id="x", domain="hostile")).proxy_id is None  # all banned there
    clock.advance(0.01)
    assert s.lease(LeaseRequest(task_id="y", domain="books")).proxy_id is not None


def test_proxy_failures_on_one_domain_that_answers_other_proxies_meanwhile_mark_the_proxy_dead() -> None:
    # The site is up (another proxy got its answer after this proxy's streak began): the
    # failures are this proxy's own, such as a proxy that refuses every connection.
    clock = FakeClock(1000.0)
    h = health(dead_after=2)
    h.report("down", "open", "proxy_failure", clock())
    clock.advance(0.1)
    h.report("good", "open", "ok", clock())
    clock.advance(0.1)
    changes = h.report("down", "open", "proxy_failure", clock())
    assert [(c.kind, c.proxy_id) for c in changes] == [("dead", "down")]
