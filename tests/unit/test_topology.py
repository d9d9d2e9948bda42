"""The topology as data: names, tiers, and the x-arguments RabbitMQ would refuse or ignore if wrong."""

from __future__ import annotations

import pytest

from hutch.topology import VERSION, QueueSpec, Topology, tier_label

DELAYS = (1, 5, 30, 120, 600, 3600)


@pytest.fixture
def classic() -> Topology:
    return Topology("acme", "classic", DELAYS)


@pytest.fixture
def quorum() -> Topology:
    return Topology("acme", "quorum", DELAYS)


def tier_queues(topology: Topology) -> list[QueueSpec]:
    names = {topology.tier_exchange(delay) for delay in topology.delays}
    return [q for q in topology.queues if q.name in names]


def park_queues(topology: Topology) -> list[QueueSpec]:
    names = {topology.park_exchange(delay) for delay in topology.delays}
    return [q for q in topology.queues if q.name in names]


# -- names ---------------------------------------------------------------------------------------


def test_every_exchange_and_queue_name_carries_the_namespace_and_the_version(classic: Topology) -> None:
    names = [e.name for e in classic.exchanges] + [q.name for q in classic.queues]
    names.append(classic.domain_queue("example.com").name)
    assert VERSION == "v3"
    for name in names:
        assert name.startswith("acme.v3."), name


def test_two_namespaces_share_no_name() -> None:
    a, b = Topology("team-a"), Topology("team-b")
    names_a = set(a.all_queue_names(["example.com"])) | {e.name for e in a.exchanges}
    names_b = set(b.all_queue_names(["example.com"])) | {e.name for e in b.exchanges}
    assert not names_a & names_b


def test_the_fixed_names_are_the_documented_ones(classic: Topology) -> None:
    assert classic.frontier == "acme.v3.frontier"
    assert classic.unrouted == "acme.v3.frontier.unrouted"
    assert classic.fetch_ready == "acme.v3.fetch.ready"
    assert classic.parse == "acme.v3.parse"
    assert classic.store == "acme.v3.store"
    assert classic.dlq == "acme.v3.dlq"
    assert classic.ledger == "acme.v3.dead.ledger"
    assert classic.rpc_proxy == "acme.v3.rpc.proxy"


def test_a_domain_queue_is_named_after_its_domain_under_the_frontier(classic: Topology) -> None:
    assert classic.domain_queue("127.0.0.1:8001").name == "acme.v3.frontier.d.127.0.0.1:8001"


def test_queue_names_are_unique(quorum: Topology) -> None:
    names = quorum.all_queue_names(["a.example", "b.example"])
    assert len(names) == len(set(names))


def test_all_queue_names_adds_one_queue_per_domain(classic: Topology) -> None:
    static = classic.all_queue_names()
    with_domains = classic.all_queue_names(["a.example", "b.example"])
    assert with_domains[: len(static)] == static
    assert with_domains[len(static) :] == ["acme.v3.frontier.d.a.example", "acme.v3.frontier.d.b.example"]


def test_queue_looks_a_queue_up_by_name(classic: Topology) -> None:
    assert classic.queue(classic.parse).bindings == ((classic.work, "parse"), (classic.work, "parse.archive"))


def test_an_archived_page_reaches_the_parsers_and_the_archive_an_ordinary_one_the_parsers_only(
    classic: Topology,
) -> None:
    assert classic.queue(classic.archive).bindings == ((classic.work, "parse.archive"),)


def test_queue_refuses_a_name_not_in_the_topology(classic: Topology) -> None:
    with pytest.raises(KeyError, match="nope"):
        classic.queue("nope")


# -- tiers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "label"),
    [
        (0.5, "500ms"),
        (0.25, "250ms"),
        (1, "1s"),
        (30, "30s"),
        (90, "90s"),
        (60, "1m"),
        (120, "2m"),
        (600, "10m"),
        (3600, "1h"),
        (7200, "2h"),
        (5400, "90m"),
        (1.5, "1500ms"),
    ],
)
def test_tier_label_uses_the_largest_unit_that_divides_the_delay(delay: float, label: str) -> None:
    assert tier_label(delay) == label


def test_tier_exchange_names_carry_the_label(classic: Topology) -> None:
    assert classic.tier_exchange(30) == "acme.v3.retry.30s"
    assert classic.tier_exchange(3600) == "acme.v3.retry.1h"


def test_retry_delays_are_sorted_and_deduplicated() -> None:
    assert Topology("x", retry_delays=[30, 1, 5, 1.0]).retry_delays == (1.0, 5.0, 30.0)


def test_parking_tiers_fill_every_gap_wider_than_two_and_a_half_times_between_the_retry_tiers() -> None:
    topology = Topology("x", retry_delays=DELAYS)
    assert topology.delays == (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 600.0, 1200.0, 2400.0, 3600.0)
    assert set(topology.retry_delays) <= set(topology.delays)
    assert all(b <= a * 2.5 for a, b in zip(topology.delays, topology.delays[1:], strict=False))
    assert Topology("x", retry_delays=(0.5, 1, 2, 5)).delays == (0.5, 1.0, 2.0, 5.0)


def test_every_tier_is_declared_with_its_own_ttl_and_leads_back_to_the_frontier(classic: Topology) -> None:
    tiers = tier_queues(classic)
    assert [q.arguments["x-message-ttl"] for q in tiers] == [round(d * 1000) for d in classic.delays]
    assert all(q.arguments["x-dead-letter-exchange"] == classic.frontier for q in tiers)


@pytest.mark.parametrize(
    ("wanted", "tier"),
    [(0, 1), (0.2, 1), (1, 1), (1.01, 5), (5, 5), (6, 30), (29.9, 30), (121, 600), (3600, 3600)],
)
def test_tier_for_picks_the_smallest_tier_at_least_as_long_as_wanted(
    classic: Topology, wanted: float, tier: float
) -> None:
    assert classic.tier_for(wanted) == tier


def test_tier_for_picks_the_longest_tier_when_none_is_long_enough(classic: Topology) -> None:
    assert classic.tier_for(86_400) == 3600


def test_there_is_one_fanout_exchange_and_one_queue_per_tier(classic: Topology) -> None:
    exchanges = {e.name: e for e in classic.exchanges}
    for delay in DELAYS:
        name = classic.tier_exchange(delay)
        assert exchanges[name].type == "fanout"
        assert classic.queue(name).bindings == ((name, ""),)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_tier_queues_hold_a_fixed_ttl_in_milliseconds(queue_type: str) -> None:
    topology = Topology("acme", queue_type, (0.5, 1, 30, 3600))  # type: ignore[arg-type]
    ttls = [q.arguments["x-message-ttl"] for q in tier_queues(topology)]
    assert ttls == [round(d * 1000) for d in topology.delays]
    assert {500, 1000, 30_000, 3_600_000} <= set(ttls)
    assert all(isinstance(ttl, int) for ttl in ttls)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_tier_queues_dead_letter_into_the_frontier_without_a_routing_key(queue_type: str) -> None:
    topology = Topology("acme", queue_type, DELAYS)  # type: ignore[arg-type]
    queues = tier_queues(topology)
    assert len(queues) == len(topology.delays)
    for q in queues:
        assert q.arguments["x-dead-letter-exchange"] == topology.frontier
        assert "x-dead-letter-routing-key" not in q.arguments


def test_no_queue_but_the_ledger_overrides_the_dead_letter_routing_key(quorum: Topology) -> None:
    for q in quorum.queues:
        if q.name != quorum.ledger:
            assert "x-dead-letter-routing-key" not in q.arguments, q.name


def test_quorum_tier_queues_dead_letter_at_least_once_and_reject_publish_on_overflow(
    quorum: Topology,
) -> None:
    for q in tier_queues(quorum):
        assert q.arguments["x-dead-letter-strategy"] == "at-least-once"
        assert q.arguments["x-overflow"] == "reject-publish"


def test_classic_tier_queues_carry_no_quorum_only_arguments(classic: Topology) -> None:
    for q in tier_queues(classic):
        assert "x-dead-letter-strategy" not in q.arguments
        assert "x-overflow" not in q.arguments


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_park_queues_are_the_tiers_again_under_their_own_names(queue_type: str) -> None:
    # The governor's parks wait behind no retry: a park may expire before its tier's TTL,
    # and the broker expires a message only at its queue's head.
    topology = Topology("acme", queue_type, DELAYS)  # type: ignore[arg-type]
    exchanges = {e.name: e for e in topology.exchanges}
    parks, tiers = park_queues(topology), tier_queues(topology)
    assert [q.name for q in parks] == [topology.park_exchange(d) for d in topology.delays]
    assert topology.park_exchange(30) == "acme.v3.park.30s"
    assert [q.arguments for q in parks] == [q.arguments for q in tiers]
    for q in parks:
        assert exchanges[q.name].type == "fanout" and q.bindings == ((q.name, ""),)


def test_no_queue_other_than_a_tier_has_a_ttl(quorum: Topology) -> None:
    tiers = {q.name for q in tier_queues(quorum) + park_queues(quorum)}
    for q in quorum.queues:
        if q.name not in tiers:
            assert "x-message-ttl" not in q.arguments, q.name
            assert q.arguments.get("x-dead-letter-exchange") != quorum.frontier, q.name


def test_classic_queues_other_than_tiers_have_no_dead_letter_target(classic: Topology) -> None:
    tiers = {q.name for q in tier_queues(classic) + park_queues(classic)}
    for q in classic.queues:
        if q.name not in tiers:
            assert "x-dead-letter-exchange" not in q.arguments, q.name
    assert "x-dead-letter-exchange" not in classic.domain_queue("a.example").arguments


# -- queue types and delivery limits -------------------------------------------------------------


def test_classic_queues_declare_their_type(classic: Topology) -> None:
    for q in classic.queues:
        if q.arguments["x-queue-type"] != "stream":
            assert q.arguments["x-queue-type"] == "classic", q.name
    assert classic.domain_queue("a.example").arguments["x-queue-type"] == "classic"


def test_quorum_queues_declare_their_type(quorum: Topology) -> None:
    for q in quorum.queues:
        if q.arguments["x-queue-type"] != "stream":
            assert q.arguments["x-queue-type"] == "quorum", q.name
    assert quorum.domain_queue("a.example").arguments["x-queue-type"] == "quorum"


def consumed(topology: Topology) -> list[QueueSpec]:
    """Every queue a consumer acks, and so may return a message to."""
    names = (
        topology.unrouted, topology.fetch_ready, topology.parse, topology.store, topology.ledger,
        topology.events_storer, topology.events_proxy, topology.rpc_proxy,
        topology.rpc_stored,
    )  # fmt: skip
    return [topology.queue(name) for name in names] + [topology.domain_queue("example.com")]


def test_every_quorum_queue_a_consumer_can_return_to_has_an_explicit_delivery_limit(quorum: Topology) -> None:
    for q in consumed(quorum):
        limit = q.arguments["x-delivery-limit"]
        assert isinstance(limit, int) and limit >= 1000, q.name


def test_past_its_delivery_limit_a_quorum_queue_dead_letters_to_the_dead_exchange(quorum: Topology) -> None:
    for q in consumed(quorum):
        if q.name in (quorum.ledger, quorum.events_proxy):
            continue
        assert q.arguments["x-dead-letter-exchange"] == quorum.dead, q.name


def test_the_ledger_dead_letters_to_the_dlq_alone_so_it_never_feeds_itself(quorum: Topology) -> None:
    args = quorum.queue(quorum.ledger).arguments
    assert args["x-dead-letter-exchange"] == ""  # the default exchange routes by queue name
    assert args["x-dead-letter-routing-key"] == quorum.dlq


def test_the_capped_proxy_events_queue_has_no_dead_letter_target(quorum: Topology) -> None:
    # Its overflow drops the oldest reports; with a target each would become a dead letter.
    assert "x-dead-letter-exchange" not in quorum.queue(quorum.events_proxy).arguments


def test_quorum_domain_queues_have_a_higher_limit_than_work_queues(quorum: Topology) -> None:
    # A governor that stops holding a domain's task returns it: those returns must not kill it.
    domain = quorum.domain_queue("example.com").arguments["x-delivery-limit"]
    assert domain > quorum.queue(quorum.fetch_ready).arguments["x-delivery-limit"]


def test_quorum_tier_and_dlq_queues_have_no_delivery_limit(quorum: Topology) -> None:
    for name in [q.name for q in tier_queues(quorum)] + [quorum.dlq]:
        assert "x-delivery-limit" not in quorum.queue(name).arguments, name


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_dlq_is_bounded_dropping_its_oldest(queue_type: str) -> None:
    topology = Topology("acme", queue_type, DELAYS, dlq_max_length=1234)  # type: ignore[arg-type]
    args = topology.queue(topology.dlq).arguments
    assert args["x-max-length"] == 1234
    assert args["x-overflow"] == "drop-head"
    assert "x-dead-letter-exchange" not in args


def test_an_old_version_names_its_queues_under_its_own_version() -> None:
    old = Topology("acme", version="v2")
    assert old.fetch_ready == "acme.v2.fetch.ready"
    assert old.domain_queue("a.example").name.startswith("acme.v2.frontier.d.")


def test_classic_queues_never_have_a_delivery_limit(classic: Topology) -> None:
    for q in classic.queues:
        assert "x-delivery-limit" not in q.arguments, q.name
    assert "x-delivery-limit" not in classic.domain_queue("example.com").arguments


# -- domain queues -------------------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_domain_queue_has_a_single_active_consumer(queue_type: str) -> None:
    q = Topology("acme", queue_type).domain_queue("example.com")  # type: ignore[arg-type]
    assert q.arguments["x-single-active-consumer"] is True


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_domain_queue_has_no_ttl_expiry_or_length_limit(queue_type: str) -> None:
    args = Topology("acme", queue_type).domain_queue("example.com").arguments  # type: ignore[arg-type]
    for forbidden in ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow"):
        assert forbidden not in args


def test_a_domain_queue_is_bound_to_the_frontier_by_its_routing_key(classic: Topology) -> None:
    assert classic.domain_queue("example.com:8080").bindings == ((classic.frontier, "d.example.com:8080"),)


def test_domain_queue_arguments_are_not_shared_between_domains(classic: Topology) -> None:
    first = classic.domain_queue("a.example")
    first.arguments["x-mutated"] = True
    assert "x-mutated" not in classic.domain_queue("b.example").arguments


# -- exchanges and bindings ----------------------------------------------------------------------


def test_the_frontier_is_direct_with_the_unrouted_fanout_as_alternate_exchange(classic: Topology) -> None:
    exchanges = {e.name: e for e in classic.exchanges}
    frontier = exchanges[classic.frontier]
    assert frontier.type == "direct"
    assert frontier.arguments == {"alternate-exchange": classic.unrouted}
    assert exchanges[classic.unrouted].type == "fanout"


def test_the_unrouted_queue_collects_everything_the_frontier_could_not_route(classic: Topology) -> None:
    assert classic.queue(classic.unrouted).bindings == ((classic.unrouted, ""),)


def test_exchange_types_match_the_design(classic: Topology) -> None:
    types = {e.name: e.type for e in classic.exchanges}
    assert types[classic.work] == "direct"
    assert types[classic.dead] == "fanout"
    assert types[classic.events] == "topic"


def test_work_queues_are_bound_to_the_work_exchange_under_their_own_names(classic: Topology) -> None:
    assert classic.queue(classic.fetch_ready).bindings == ((classic.work, "fetch.ready"),)
    assert classic.queue(classic.parse).bindings == ((classic.work, "parse"), (classic.work, "parse.archive"))
    assert classic.queue(classic.store).bindings == ((classic.work, "store"),)


def test_dead_letters_reach_both_the_dlq_and_the_ledger(classic: Topology) -> None:
    assert classic.queue(classic.dlq).bindings == ((classic.dead, ""),)
    assert classic.queue(classic.ledger).bindings == ((classic.dead, ""),)


def test_the_storer_hears_releases_and_outcomes_but_not_heartbeats(classic: Topology) -> None:
    bindings = classic.queue(classic.events_storer).bindings
    assert bindings == ((classic.events, "released.#"), (classic.events, "outcome.#"))


def test_the_proxy_manager_hears_every_proxied_outcome_on_a_durable_queue(classic: Topology) -> None:
    spec = classic.queue(classic.events_proxy)
    assert spec.bindings == ((classic.events, "outcome.proxied.#"),)
    assert "x-expires" not in spec.arguments


def test_the_jobs_and_released_logs_are_size_capped_streams_whatever_the_queue_type(quorum: Topology) -> None:
    for name in (quorum.jobs, quorum.released_log):
        args = quorum.queue(name).arguments
        assert args["x-queue-type"] == "stream"
        assert args["x-max-length-bytes"] > 0
    assert ("acme.v3.events", "released") in quorum.queue(quorum.released_log).bindings


def test_the_frontier_is_a_fixed_number_of_shards_whatever_the_domains() -> None:
    topology = Topology("acme", "quorum", DELAYS, shards=8)
    shards = [q for q in topology.queues if q.name.startswith("acme.v3.frontier.s.")]
    assert [q.name for q in shards] == [f"acme.v3.frontier.s.{n}" for n in range(8)]
    for q in shards:
        assert q.arguments["x-single-active-consumer"] is True
        assert q.arguments["x-delivery-limit"] > 0
        assert q.bindings == (("acme.v3.frontier", q.name.removeprefix("acme.v3.frontier.")),)
    keys = {topology.shard_key(f"site{n}.example") for n in range(1000)}
    assert keys == {f"s.{n}" for n in range(8)}  # every shard gets domains
    assert topology.shard_key("a.example") == topology.shard_key("a.example")


def test_every_binding_names_an_exchange_of_the_topology(quorum: Topology) -> None:
    exchanges = {e.name for e in quorum.exchanges}
    for q in [*quorum.queues, quorum.domain_queue("example.com")]:
        for exchange, _ in q.bindings:
            assert exchange in exchanges, (q.name, exchange)


def test_every_dead_letter_exchange_is_an_exchange_of_the_topology_or_the_default_one(quorum: Topology) -> None:
    exchanges = {e.name for e in quorum.exchanges} | {""}
    for q in [*quorum.queues, quorum.domain_queue("example.com")]:
        if "x-dead-letter-exchange" in q.arguments:
            assert q.arguments["x-dead-letter-exchange"] in exchanges
            if q.arguments["x-dead-letter-exchange"] == "":
                assert q.arguments["x-dead-letter-routing-key"] in quorum.all_queue_names(), q.name


def test_classic_queues_use_version_2_of_the_classic_queue_and_quorum_queues_do_not(
    classic: Topology, quorum: Topology
) -> None:
    plain = [q for q in classic.queues if q.arguments.get("x-queue-type") == "classic"]
    assert plain and all(q.arguments["x-queue-version"] == 2 for q in plain)
    assert classic.domain_queue("a.example").arguments["x-queue-version"] == 2
    assert all("x-queue-version" not in q.arguments for q in quorum.queues)
    assert "x-queue-version" not in quorum.domain_queue("a.example").arguments
