"""`hutch watch`'s flags as a function of readings: each condition, and what must not trip it."""

from __future__ import annotations

from hutch.services.control.watch import Reading, Samples, Thresholds, flags, parse, summary

T = Thresholds(under_for=10.0, spike_ratio=0.2, spike_min=5, stale_after=60.0, headroom=0.8)


def reading(at: float, samples: Samples | None = None, **kw: object) -> Reading:
    return Reading(at=at, samples=samples or {}, reached=["m"], missed=[], **kw)  # type: ignore[arg-type]


def counters(fetched: dict[str, float], retried: dict[str, float], dead: dict[str, float] | None = None) -> Samples:
    return {
        "hutch_fetches_total": [({"domain": d, "outcome": "ok"}, n) for d, n in fetched.items()],
        "hutch_retries_total": [({"domain": d, "reason": "blocked"}, n) for d, n in retried.items()],
        "hutch_dead_letters_total": [
            ({"domain": d, "stage": "fetch", "reason": "not_found"}, n) for d, n in (dead or {}).items()
        ],
    }


def kinds(found: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(f.kind, f.subject) for f in found]


def test_demand_above_zero_for_the_whole_span_is_under_provisioned() -> None:
    demand = [reading(t, {"hutch_fetch_demand": [({}, 3.0)]}) for t in range(0, 13, 2)]
    assert kinds(flags(demand, T, 30)) == [("under_provisioned", "fetchers")]


def test_demand_that_touched_zero_or_readings_shorter_than_the_span_are_not() -> None:
    dipped = [reading(t, {"hutch_fetch_demand": [({}, 0.0 if t == 8 else 3.0)]}) for t in range(0, 13, 2)]
    assert flags(dipped, T, 30) == []
    short = [reading(t, {"hutch_fetch_demand": [({}, 3.0)]}) for t in range(0, 8, 2)]
    assert flags(short, T, 30) == []


def test_one_domain_retrying_while_the_others_stay_flat_is_a_spike() -> None:
    first = reading(0, counters({"a": 100, "b": 100}, {"a": 2, "b": 1}))
    last = reading(10, counters({"a": 120, "b": 150}, {"a": 12, "b": 2}))  # a: 10 in 20; b: 1 in 50
    found = flags([first, last], T, 30)
    assert kinds(found) == [("retry_spike", "a")]
    assert "10 retries in 20 fetches (50%)" in found[0].detail


def test_every_domain_retrying_alike_is_no_spike_nor_a_few_retries() -> None:
    first = reading(0, counters({"a": 0, "b": 0}, {"a": 0, "b": 0}))
    alike = reading(10, counters({"a": 20, "b": 20}, {"a": 10, "b": 8}))
    assert flags([first, alike], T, 30) == []
    few = reading(10, counters({"a": 4, "b": 20}, {"a": 3, "b": 0}))  # 75 %, but 3 retries < 5
    assert flags([first, few], T, 30) == []


def test_a_counter_that_reset_counts_from_zero() -> None:
    first = reading(0, counters({"a": 500}, {"a": 400}))
    last = reading(10, counters({"a": 20}, {"a": 10}))  # the fetcher restarted
    assert kinds(flags([first, last], T, 30)) == [("retry_spike", "a")]


def test_dead_letters_growing_are_flagged_with_the_worst_domain_first() -> None:
    first = reading(0, counters({}, {}, {"a": 5, "b": 1}))
    last = reading(10, counters({}, {}, {"a": 5, "b": 4, "c": 1}))
    found = flags([first, last], T, 30)
    assert kinds(found) == [("dead_letters", "b")]
    assert found[0].detail.startswith("4 dead letters in the last 10s (b: 3, c: 1")
    assert flags([first, first], T, 30) == []


def test_only_readings_inside_the_window_count_for_growth() -> None:
    old = reading(0, counters({}, {}, {"a": 0}))
    mid = reading(50, counters({}, {}, {"a": 9}))
    last = reading(60, counters({}, {}, {"a": 9}))
    assert flags([old, mid, last], T, 20) == []  # all nine were before the window


def test_a_task_that_has_not_moved_for_too_long_is_stale() -> None:
    now = 10_000.0
    found = flags([reading(now, waiting=[("slow", 3, now - 61), ("fine", 9, now - 5)])], T, 30)
    assert kinds(found) == [("stale", "slow")]
    assert "3 task(s) waiting" in found[0].detail


def test_without_a_store_the_governors_oldest_task_age_says_stale() -> None:
    samples = {"hutch_oldest_task_age_seconds": [({"domain": "slow"}, 120.0), ({"domain": "fine"}, 1.0)]}
    assert kinds(flags([reading(0, samples)], T, 30)) == [("stale", "slow")]


def test_the_broker_near_its_descriptor_or_memory_limit_is_flagged() -> None:
    broker = parse(
        "rabbitmq_process_open_fds 900\nrabbitmq_process_max_fds 1024\n"
        "rabbitmq_process_resident_memory_bytes 100\nrabbitmq_resident_memory_limit_bytes 1000\n"
    )
    found = flags([reading(0, broker=broker)], T, 30)
    assert kinds(found) == [("broker_descriptors", "rabbitmq")]
    assert "88% of its file descriptors" in found[0].detail


def test_the_summary_shows_domains_queues_and_sources() -> None:
    samples = {
        **counters({"a": 10}, {"a": 0}),
        "hutch_queue_depth": [({"queue": "parse"}, 3.0), ({"queue": "parse"}, 4.0)],  # two governors
        "hutch_domain_backlog": [({"domain": "a"}, 7.0)],
    }
    view = summary([reading(0, counters({"a": 0}, {"a": 0})), reading(5, samples)], T, 30)
    assert view["queues"] == {"parse": 4.0}
    assert view["domains"][0]["domain"] == "a" and view["domains"][0]["fetches"] == 10
    assert view["domains"][0]["backlog"] == 7.0
    assert view["sources"] == {"metrics": ["m"], "unreachable": [], "store": False, "broker": False}
