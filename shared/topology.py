"""The one place that names and declares Hutch's exchanges, queues and bindings.

RabbitMQ refuses to redeclare a queue with other arguments (PRECONDITION_FAILED) and
silently ignores a misspelt `x-dead-letter-exchange`, so the topology is data here and
every service declares it, idempotently, at start (`Broker.declare_topology` in the AMQP
layer). Names carry the namespace (tests isolate on it) and a version (`v3`), so a change of
arguments is a new name rather than a clash with queues already on a broker; `hutch.migrate`
moves what waits in the previous version's queues into the new ones.

Versions: `v2` had delivery limits on the quorum work queues only and an unbounded `dlq`;
`v3` gives every quorum queue a consumer can return a message to an explicit
`x-delivery-limit` and a dead-letter target (the frontier's shards too, with a high limit,
since returns are republishes now), and bounds the `dlq` (`HUTCH_DLQ_MAX_LENGTH`,
oldest dropped: the storer's ledger is the record).

Shape (see the design card):
- `frontier` (direct, alternate exchange `frontier.unrouted`): key `s.<n>`, a fixed number of
  durable shard queues `frontier.s.<n>` (`HUTCH_FRONTIER_SHARDS`); a domain's tasks all go
  to the shard its name hashes to (`shard_key`), whatever the number of domains. A key no
  shard is bound to falls through to `frontier.unrouted`, and the governor routes it again.
  (Before the shards, a queue per domain, `frontier.d.<domain>`, recorded in a `domains`
  stream: `domain_queue` still names them, for `hutch.migrate` to empty them.)
- `frontier.paused`: tasks of paused jobs; `jobs`: a stream of job controls;
  `released.log`: a stream of the `released` event batches, kept an hour.
- `work` (direct): `fetch.ready`, `parse`, `store` and `intake` queues under their own names
  as keys (`intake`: submissions, which the storer records before it publishes their tasks).
  A page of a job that keeps its pages goes under `parse.archive`, which both `parse` and
  `archive` (the storer's, for the page archive) are bound to.
- `retry.<delay>`: a fanout exchange and a queue per delay tier with a fixed TTL that
  dead-letters into `frontier` with no dead-letter routing key, so an expired retry re-enters
  its own shard under its original key. No consumers: the broker holds the delay.
- `park.<delay>`: the same ladder again, for the governor's parks alone. A park may carry
  its own shorter expiration (the exact time its turn comes): the broker expires a message
  only at a queue's head, so the governor keeps each park queue's expirations in order, and
  no retry (which always waits its tier's whole TTL) may sit in front of one.
- `dead` (fanout): to `dlq` (kept for inspection and replay) and `dead.ledger` (the storer).
- `events` (topic): `released` (batches), `outcome.<domain>` (the storer keeps task state
  and attempt history from them; the proxy-manager learns proxy health from outcomes),
  `robots.<domain>` and `fetcher.heartbeat` (for the governors, which each bind their own
  exclusive queue: their state is in memory and rebuilt on start).
- `rpc.proxy`: the proxy-manager's lease requests; each caller names its own exclusive reply
  queue (`rpc.reply.<service>.<id>`) and matches answers by correlation id.
- `rpc.stored`: the storers' answers to "is this task stored?", asked by a fetcher before it
  fetches again a task a fetcher died holding.
- `alive`: one transient message, by which a storer tells that the broker lost its transient
  messages (`hutch.services.storer.lost`).
- Routing keys: every one is named below (`FETCH_KEY`, `RELEASED`, `outcome_key`...), and
  each governor's own event queue is `governor_events`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from hutch.domains import amqp_name

VERSION = "v3"
PREVIOUS_VERSIONS = ("v2",)  # whose queues `hutch.migrate` empties into this version's
# Backstops on quorum queues: the AMQP layer counts crashes and failures itself and returns
# messages by republishing (a new message, counted from zero), so the broker's count only
# grows with nack-requeues and closed channels of one copy. RabbitMQ 4.x would otherwise
# apply a default of 20.
WORK_DELIVERY_LIMIT = 1000
# A domain queue's held task comes back each time a governor stops or dies holding it.
FRONTIER_DELIVERY_LIMIT = 10_000
ExchangeType = Literal["direct", "fanout", "topic"]


# -- routing keys ------------------------------------------------------------------
# Every key a service publishes with or binds to is named here.

FETCH_KEY = "fetch.ready"  # work: a released task, for the fetchers
PARSE_KEY = "parse"  # work: a fetched page, for the parsers
ARCHIVE_KEY = "parse.archive"  # work: a fetched page of a job that keeps its pages: parsers and archive
STORE_KEY = "store"  # work: an item, for the storer
INTAKE_KEY = "intake"  # work: a submission from any producer, for the storer to record and publish
RELEASED = "released"  # events: a governor's batch of `released` events
HEARTBEAT = "fetcher.heartbeat"  # events: a fetcher's slots and how many are busy
STATUS = "governor.status"  # events: a status request; every governor answers its reply-to
PROXIED_OUTCOMES = "outcome.proxied.#"  # the binding of the outcomes the proxy-manager hears
# What each governor's own event queue is bound to: outcomes, robots.txt, heartbeats, rescues, status.
GOVERNOR_EVENTS = ("outcome.#", "robots.#", HEARTBEAT, "rescued.#", STATUS)
GOVERNOR_EVENTS_MAX = 200_000  # a governor that cannot keep up loses the oldest events, not the broker's memory


def routing_key(domain: str) -> str:
    """The frontier routing key of a domain before the shards (`d.<domain>`, hashed when too long)."""
    return amqp_name(f"d.{domain}")


def event_key(kind: str, domain: str) -> str:
    """The events-exchange key of a domain's event (`outcome.<domain>`, `robots.<domain>`)."""
    return amqp_name(f"{kind}.{domain}")


def outcome_key(domain: str, proxied: bool) -> str:
    """The key of an attempt's outcome event: `outcome.proxied.<domain>` when it went
    through a proxy, `outcome.<domain>` otherwise. Every outcome matches `outcome.#` (the
    governors, the storer); only proxied ones reach the proxy-manager, which learns nothing
    from the rest, so a fleet without a pool sends it nothing per page."""
    return event_key("outcome.proxied" if proxied else "outcome", domain)


def robots_key(domain: str) -> str:
    """The key of a domain's robots.txt result, for the governors."""
    return event_key("robots", domain)


def rescued_key(domain: str) -> str:
    """The key of the storer's word that a task was rescued (a new incarnation is out)."""
    return event_key("rescued", domain)


@dataclass(frozen=True)
class ExchangeSpec:
    name: str
    type: ExchangeType
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: tuple[tuple[str, str], ...] = ()  # (exchange, routing key)
    exclusive: bool = False  # one connection's own queue, deleted with it (not durable)


def tier_label(delay: float) -> str:
    """`1s`, `30s`, `2m`, `1h`, `500ms`: the delay as it appears in a tier's name."""
    ms = round(delay * 1000)
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


LADDER_RATIO = 2.5  # no delay tier more than this many times the one below it


def park_ladder(retry_delays: tuple[float, ...]) -> tuple[float, ...]:
    """The retry delays with tiers added between any two more than `LADDER_RATIO` apart
    (doubling from the lower one).

    The governor parks a domain's backlog in the longest tier that brings each task back
    before its turn; with the retries' own tiers alone (1, 5, 30, 120 s...), a task whose turn
    is 25 s away goes to the 5 s tier five times over. With a ladder no step above 2.5x, a task
    is parked a handful of times at most, whatever its wait. The retry policy still picks from
    `retry_delays` alone."""
    ladder: list[float] = []
    for delay in retry_delays:
        while ladder and delay > ladder[-1] * LADDER_RATIO:
            ladder.append(ladder[-1] * 2)
        ladder.append(delay)
    return tuple(ladder)


class Topology:
    """All names and arguments for one namespace; pure data, no broker."""

    def __init__(
        self,
        namespace: str,
        queue_type: Literal["classic", "quorum"] = "classic",
        retry_delays: Iterable[float] = (1, 5, 30, 120, 600, 3600),
        dlq_max_length: int = 100_000,
        version: str = VERSION,
        shards: int = 16,
    ) -> None:
        self.namespace = namespace
        self.shards = shards
        self.queue_type = queue_type
        self.retry_delays = tuple(sorted(set(float(d) for d in retry_delays)))
        self.delays = park_ladder(self.retry_delays)  # every delay tier: the retries' and between them
        self.dlq_max_length = dlq_max_length
        self.version = version  # another than VERSION only to name an old version's queues
        p = f"{namespace}.{version}."
        self.prefix = p
        self.frontier = p + "frontier"
        self.unrouted = p + "frontier.unrouted"
        self.work = p + "work"
        self.dead = p + "dead"
        self.events = p + "events"
        self.fetch_ready = p + "fetch.ready"
        self.parse = p + "parse"
        self.archive = p + "archive"
        self.store = p + "store"
        self.intake = p + "intake"
        self.dlq = p + "dlq"
        self.ledger = p + "dead.ledger"
        self.domains = p + "domains"
        self.events_storer = p + "events.storer"
        self.events_proxy = p + "events.proxy-manager"
        self.rpc_proxy = p + "rpc.proxy"
        self.rpc_stored = p + "rpc.stored"
        self.paused = p + "frontier.paused"
        self.jobs = p + "jobs"
        self.released_log = p + "released.log"
        self.proxy_state = p + "proxy-state"
        self.alive = p + "alive"

    # -- arguments -----------------------------------------------------------------

    def _durable_args(self, *, delivery_limit: int | None = None, dead_letter_to_dlq: bool = False) -> dict[str, Any]:
        """A durable queue's arguments; `delivery_limit` for a queue a consumer may return to.

        On quorum, such a queue gets an explicit `x-delivery-limit` and a dead-letter target,
        so nothing past the limit is dropped unseen: the dead exchange (the `dlq` and the
        ledger), or for the ledger itself the `dlq` alone, so the ledger never feeds itself.
        A message the broker dead-letters this way is the raw message, not a `DeadLetter`:
        the `dlq` keeps it (with its `x-death` history); the ledger's consumer logs its id and
        drops it. It is a backstop: the AMQP layer's counts end a message long before.
        Classic queues have no delivery limit: the AMQP layer's counts bound them.
        """
        if self.queue_type == "classic":
            # Version 2 of the classic queue's index and store (RabbitMQ 3.10+, opt-in there):
            # measured on the governor's hot path (bench/governor_permits.py), the broker
            # spends about a fifth less CPU per task than with version 1. On 3.10, a small
            # persistent message delivered at once costs a version 2 queue more (1.6 times,
            # bench/hop_floor.py), but version 1 is gone from RabbitMQ 4.0 (the argument is
            # ignored) and refused by 4.3: the work queues stay on 2 (docs/benchmarks.md,
            # twentieth round).
            return {"x-queue-type": "classic", "x-queue-version": 2}
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if delivery_limit is not None:
            args["x-delivery-limit"] = delivery_limit
            if dead_letter_to_dlq:
                args["x-dead-letter-exchange"] = ""  # the default exchange: by queue name
                args["x-dead-letter-routing-key"] = self.dlq
            else:
                args["x-dead-letter-exchange"] = self.dead
        return args

    def domain_queue(self, domain: str) -> QueueSpec:
        """A domain's frontier queue of before the shards (migrations empty them), as declared then.

        Single active consumer: every governor consumes every domain queue and the broker
        lets one of them at a time release that domain's tasks (standby takes over).
        """
        args = self._durable_args(delivery_limit=FRONTIER_DELIVERY_LIMIT)
        args["x-single-active-consumer"] = True
        return QueueSpec(
            # A valid AMQP name for any domain and namespace: a long one ends in a hash.
            name=amqp_name(f"{self.frontier}.d.{domain}"),
            arguments=args,
            bindings=((self.frontier, routing_key(domain)),),
        )

    def shard_of(self, domain: str) -> int:
        """The frontier shard a domain's tasks wait in: fixed by the domain's name."""
        return zlib.crc32(domain.encode()) % self.shards

    def shard_key(self, domain: str) -> str:
        """The routing key a task of `domain` is published to the frontier (or a tier) with."""
        return f"s.{self.shard_of(domain)}"

    def shard_queue(self, shard: int) -> QueueSpec:
        """One frontier shard: the tasks of every domain hashed to it, in arrival order.

        Single active consumer: every governor consumes every shard and the broker lets one
        of them at a time release its domains, so each domain has one governor deciding.
        """
        args = self._durable_args(delivery_limit=FRONTIER_DELIVERY_LIMIT)
        args["x-single-active-consumer"] = True
        return QueueSpec(f"{self.frontier}.s.{shard}", args, ((self.frontier, f"s.{shard}"),))

    @property
    def shard_queues(self) -> tuple[QueueSpec, ...]:
        return tuple(self.shard_queue(n) for n in range(self.shards))

    def tier_exchange(self, delay: float) -> str:
        return f"{self.prefix}retry.{tier_label(delay)}"

    def park_exchange(self, delay: float) -> str:
        return f"{self.prefix}park.{tier_label(delay)}"

    @property
    def delay_queues(self) -> tuple[str, ...]:
        """Every delay queue's name (each its exchange's too): the retry tiers, then the park queues."""
        return tuple(name(d) for name in (self.tier_exchange, self.park_exchange) for d in self.delays)

    def tier_for(self, wanted: float) -> float:
        """The smallest configured delay tier at least `wanted` long (the longest if none is)."""
        for delay in self.retry_delays:
            if delay >= wanted:
                return delay
        return self.retry_delays[-1]

    # -- the static topology --------------------------------------------------------

    @property
    def exchanges(self) -> tuple[ExchangeSpec, ...]:
        tiers = tuple(ExchangeSpec(name, "fanout") for name in self.delay_queues)
        return (
            ExchangeSpec(self.unrouted, "fanout"),
            ExchangeSpec(self.frontier, "direct", {"alternate-exchange": self.unrouted}),
            ExchangeSpec(self.work, "direct"),
            ExchangeSpec(self.dead, "fanout"),
            ExchangeSpec(self.events, "topic"),
            *tiers,
        )

    @property
    def queues(self) -> tuple[QueueSpec, ...]:
        work = self._durable_args(delivery_limit=WORK_DELIVERY_LIMIT)
        ledger = self._durable_args(delivery_limit=WORK_DELIVERY_LIMIT, dead_letter_to_dlq=True)
        plain = self._durable_args()
        tiers = []
        for delay, name in zip(self.delays * 2, self.delay_queues, strict=True):
            args = dict(plain)
            args["x-message-ttl"] = round(delay * 1000)
            # No x-dead-letter-routing-key: the expired message keeps its own key
            # (`d.<domain>`) and so lands back in its own domain queue.
            args["x-dead-letter-exchange"] = self.frontier
            if self.queue_type == "quorum":
                # At-least-once dead-lettering: a retry must not be lost on its way back.
                args["x-dead-letter-strategy"] = "at-least-once"
                args["x-overflow"] = "reject-publish"
            tiers.append(QueueSpec(name, args, ((name, ""),)))
        return (
            QueueSpec(self.unrouted, work, ((self.unrouted, ""),)),
            QueueSpec(self.fetch_ready, work, ((self.work, FETCH_KEY),)),
            QueueSpec(self.parse, work, ((self.work, PARSE_KEY), (self.work, ARCHIVE_KEY))),
            # The pages of jobs whose spec says `archive: true`: the storer keeps their bodies.
            QueueSpec(self.archive, work, ((self.work, ARCHIVE_KEY),)),
            QueueSpec(self.store, work, ((self.work, STORE_KEY),)),
            # Submissions from any producer: the storer records them, then publishes their tasks.
            QueueSpec(self.intake, work, ((self.work, INTAKE_KEY),)),
            # Kept for a look with the broker's tools, bounded: the ledger is the record.
            QueueSpec(
                self.dlq,
                {**plain, "x-max-length": self.dlq_max_length, "x-overflow": "drop-head"},
                ((self.dead, ""),),
            ),
            QueueSpec(self.ledger, ledger, ((self.dead, ""),)),
            QueueSpec(self.events_storer, work, ((self.events, f"{RELEASED}.#"), (self.events, "outcome.#"))),
            # Durable, so proxy health hears of outcomes across a manager restart; capped
            # (oldest dropped), since stale health reports are worth little. No dead-letter
            # target: each overflow would become a dead letter.
            QueueSpec(
                self.events_proxy,
                {
                    **plain,
                    **({"x-delivery-limit": WORK_DELIVERY_LIMIT} if self.queue_type == "quorum" else {}),
                    "x-max-length": 100_000,
                    "x-single-active-consumer": True,
                },
                ((self.events, PROXIED_OUTCOMES),),
            ),
            # One proxy-manager answers at a time (its caps and bans are in its memory); a
            # second one waits as standby and takes over when the first goes away.
            QueueSpec(self.rpc_proxy, {**work, "x-single-active-consumer": True}),
            # Any storer answers: the store is shared.
            QueueSpec(self.rpc_stored, work),
            # One transient marker, no more (a second is refused): gone, the broker lost its
            # transient messages (hutch.services.storer.lost).
            QueueSpec(self.alive, {**plain, "x-max-length": 1, "x-overflow": "reject-publish"}),
            # Tasks of paused jobs, every job in one queue: no consumer until a job resumes
            # or is cancelled, then the governors sort it through once.
            QueueSpec(self.paused, work),
            # Every job's state changes, read whole by each governor and the storer.
            QueueSpec(self.jobs, {"x-queue-type": "stream", "x-max-length-bytes": 64 * 1024 * 1024}),
            # The active proxy-manager's snapshots (bans, dead proxies, learned tiers): a manager
            # started anywhere, or a standby taking over, reads the newest. Small segments, so
            # retention drops old snapshots soon.
            QueueSpec(
                self.proxy_state,
                {
                    "x-queue-type": "stream",
                    "x-max-length-bytes": 16 * 1024 * 1024,
                    "x-stream-max-segment-size-bytes": 1024 * 1024,
                },
            ),
            # The released events of the last while: a governor that starts reads the last
            # permit lifetimes of releases before it releases anything (see the governor).
            QueueSpec(
                self.released_log,
                {
                    "x-queue-type": "stream",
                    "x-max-length-bytes": 256 * 1024 * 1024,
                    "x-stream-max-segment-size-bytes": 8 * 1024 * 1024,
                    "x-max-age": "1h",
                },
                ((self.events, RELEASED),),
            ),
            *self.shard_queues,
            *tiers,
        )

    def governor_events(self, governor_id: str) -> QueueSpec:
        """A governor's own event queue: its state is in memory and rebuilt at start, so the
        queue is exclusive to its connection and goes with it."""
        return QueueSpec(
            f"{self.prefix}governor.{governor_id}",
            {"x-max-length": GOVERNOR_EVENTS_MAX},
            tuple((self.events, key) for key in GOVERNOR_EVENTS),
            exclusive=True,
        )

    def queue(self, name: str) -> QueueSpec:
        for spec in self.queues:
            if spec.name == name:
                return spec
        raise KeyError(f"no queue {name!r} in the topology")

    def all_queue_names(self, domains: Iterable[str] = ()) -> list[str]:
        return [q.name for q in self.queues] + [self.domain_queue(d).name for d in domains]
