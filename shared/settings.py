"""One settings object for every Hutch process.

All settings live in one flat model so that each has exactly one `HUTCH_` variable, one
default and one line in the README (a test holds the README to this model). A service
builds it once in `main` and passes it down; nothing reads the environment at import time.

Every value must fit in one environment variable, since services start as child processes
with the settings in their environment (`to_env`): Linux refuses to start a program with a
variable over 128 KiB (`NAME=value`, its terminating byte included), with an error that
names no variable. A longer value is refused here, naming the variable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from hutch.targets import allowed_table, resolve_table, split_entries

DEFAULT_RETRY_DELAYS = (1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
# Linux's MAX_ARG_STRLEN: the longest `NAME=value` string (with its NUL) execve passes on.
MAX_ENV_BYTES = 128 * 1024
_WILDCARD_HINTS = {
    "allowed_targets": "; one wildcard entry such as *.shop.test:8443 covers every host under shop.test",
    "resolve": "; one wildcard entry such as *.shop.test:8443:127.0.0.1 covers every host under shop.test",
}


class Settings(BaseSettings):
    """Every tunable of Hutch; the field name upper-cased after `HUTCH_` is its variable."""

    model_config = SettingsConfigDict(env_prefix="HUTCH_", extra="ignore", frozen=True)

    # Broker and naming
    amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ URL (credentials never logged); a cluster's nodes comma separated, tried in turn",
    )
    # AMQP caps exchange names at 127 characters: 100 leave room for the longest suffix.
    namespace: str = Field(
        "hutch",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="prefix of every exchange and queue name",
    )
    queue_type: Literal["classic", "quorum"] = Field("classic", description="classic on one node, quorum on a cluster")
    publish_timeout: float = Field(10.0, description="seconds to wait for a publisher confirm")
    rpc_timeout: float = Field(
        5.0, description="seconds to wait for an RPC answer (a proxy lease; whether a crashed task is stored)"
    )
    shutdown_grace: float = Field(10.0, description="seconds in-flight work may finish after SIGTERM")
    log_level: str = Field("INFO", description="logging level of every service")
    gc_threshold: int = Field(
        10_000, ge=0,
        description="allocations between the garbage collector's young passes once a service is ready, "
        "what it built by then frozen out of every pass; 0: Python's own collector, untouched",
    )
    sched_policy: Literal["batch", "normal"] = Field(
        "batch",
        description="Linux scheduling policy of every service process: `batch` (SCHED_BATCH), a woken "
        "service waits for the running process's slice instead of preempting it; `normal`: left as started",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="`json`: one JSON object a line, with the job, task, domain and trace id of the work"
    )
    max_crashes: int = Field(
        3, ge=1, description="redeliveries (a consumer died holding it) before a message is dead as `crashed`"
    )
    max_failures: int = Field(
        3, ge=1, description="handler errors on one message before it is dead as `error`, per stage"
    )
    dlq_max_length: int = Field(
        100_000, ge=1, description="dead letters kept in the `dlq` queue (oldest dropped; the ledger is the record)"
    )
    # The API service (`hutch serve api`) and the CLI or client that go through it.
    api_host: str = Field("127.0.0.1", description="address the API listens on; any but loopback needs HUTCH_API_TOKEN")
    api_port: int = Field(8080, ge=0, le=65535, description="the API's port (it serves its /metrics there too)")
    api_token: SecretStr | None = Field(
        None, description="bearer token the API requires (and the CLI and client send); never logged"
    )
    api_url: str | None = Field(
        None, description="with it set, the CLI's job commands go through this API (no store or broker needed)"
    )
    # A URL file is the largest body a client has cause to send: 64 MiB holds some 700,000 URLs
    # of 90 bytes, while every upload in progress spools up to this much to the API's disk (and
    # a JSON submission is read whole into memory; its 100,000 URLs at most take some 10 MB).
    api_max_body_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="largest request body the API reads (a URL file, a JSON submission); more is 413",
    )
    api_body_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="seconds a request body may take to arrive whole; longer is 408"
    )
    # Metrics: each service serves /metrics, /healthz and /readyz on a port of its own
    # (0: any free port, logged at start).
    metrics: bool = Field(True, description="serve /metrics, /healthz and /readyz on each service's metrics port")
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics ports listen on (0.0.0.0 in a container, for scrapes and probes)"
    )
    governor_metrics_port: int = Field(9101, ge=0, le=65535, description="the governor's metrics port")
    proxy_manager_metrics_port: int = Field(9102, ge=0, le=65535, description="the proxy-manager's metrics port")
    parser_metrics_port: int = Field(9103, ge=0, le=65535, description="the parser's metrics port")
    storer_metrics_port: int = Field(9104, ge=0, le=65535, description="the storer's metrics port")
    fetcher_metrics_port: int = Field(
        9110, ge=0, le=65535, description="a fetcher's metrics port; under `hutch up` fetcher N takes this + N - 1"
    )
    metrics_domains: int = Field(
        50, ge=0, description="domains that get a metric label of their own (the busiest); the rest are `other`"
    )
    metrics_interval: float = Field(
        5.0, gt=0, description="seconds between two readings of the queue depths the governor exports"
    )
    # hutch watch: when it flags the article's four conditions and the broker's trouble
    watch_under_for: float = Field(
        60.0, gt=0, description="seconds the demand must stay above 0 before `hutch watch` flags under-provisioned"
    )
    watch_spike_ratio: float = Field(
        0.2, gt=0, description="retries per fetch over the window above which a domain's retries count as a spike"
    )
    watch_spike_min: int = Field(5, ge=1, description="fewest retries in the window for a spike")
    watch_stale_after: float = Field(
        900.0, gt=0, description="seconds a task of a running job may go without moving before it is flagged stale"
    )
    watch_broker_headroom: float = Field(
        0.8, gt=0, le=1, description="share of the broker's descriptors or memory in use that `hutch watch` flags"
    )
    broker_metrics_url: str = Field(
        "http://127.0.0.1:15692/metrics",
        description="RabbitMQ's own metrics (the rabbitmq_prometheus plugin), read by `hutch watch`",
    )
    compress_above: int = Field(
        0, ge=0, description="message bodies over this many bytes cross the broker zlib-compressed; 0: never"
    )
    persist_pages: bool = Field(
        False,
        description="pages to the parsers and items to the storer as persistent messages; off: transient "
        "on classic queues, and tasks whose page or item a broker loses are fetched again",
    )
    max_inflated_bytes: int | None = Field(
        None, ge=1, description="largest size a compressed message body may inflate to; default 4 x max_body_bytes"
    )

    # Store
    data_dir: Path = Field(Path("hutch-data"), description="folder of the embedded SQLite store")
    store_url: str | None = Field(
        None,
        description="store location: sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB; "
        "default sqlite:///<data_dir>/hutch.sqlite3",
    )
    store_retry_seconds: float = Field(
        30.0, gt=0, description="how long the storer retries a failing store write before requeueing it"
    )
    store_batch: int = Field(256, ge=1, description="most messages the storer commits in one transaction")
    # 25 ms rather than 5: a group of about a dozen messages instead of three on small pages,
    # so fewer commits and acks in bursts (docs/benchmarks.md, eleventh round).
    store_batch_wait: float = Field(
        0.025, ge=0, description="seconds the storer waits for more messages to commit together"
    )
    reconcile_interval: float = Field(
        30.0, gt=0, description="seconds between two sweeps of the reconciler for lost tasks"
    )
    reconcile_margin: float = Field(
        120.0, ge=0, description="seconds past its deadline before a silent task counts as lost"
    )
    max_rescues: int = Field(3, ge=0, description="rescues of a lost task before it goes dead (stalled)")
    archive_retention: float = Field(
        0.0, ge=0, description="seconds an archived page body is kept (spec archive: true); 0: as long as its job"
    )
    retention: float = Field(
        0.0, ge=0, description="seconds after its last task finished that a done job is removed from the store; 0: kept"
    )

    # Governor
    rate: float = Field(2.0, description="default fetches per second per domain")
    burst: int = Field(1, description="token bucket size per domain")
    permit_ttl: float = Field(30.0, description="seconds a fetch permit stays valid")
    permit_lateness: float = Field(
        0.05, gt=0, description="seconds later than its quickest a permit may reach a fetcher and still be used"
    )
    permit_lead: float = Field(
        0.25, ge=0, description="seconds before its token is due a permit may be issued; the fetcher holds it till then"
    )
    max_ready: int = Field(200, description="governor stops releasing while fetch.ready holds this many tasks")
    max_hold: float = Field(
        5.0, description="longest a governor waits holding one frontier message before returning it"
    )
    concurrency_per_domain: int = Field(8, ge=1, description="fetches in flight per domain, fleet-wide")
    frontier_shards: int = Field(
        16, ge=1, le=256, description="queues the frontier is hashed into, whatever the number of domains"
    )
    frontier_window: int = Field(
        256, ge=1, le=10_000, description="frontier messages a governor holds unacked per shard"
    )
    hold_horizon: float = Field(
        5.0, gt=0, description="seconds of a domain's rate a governor holds per job; the rest waits parked"
    )
    domain_idle: float = Field(300.0, gt=0, description="seconds after which a governor forgets an idle domain's state")
    rate_for: str | None = Field(
        None, description="per-domain rates, `domain=R/s` comma separated (wins over the limits file)"
    )
    limits_file: Path | None = Field(None, description="YAML of per-domain rate, burst and concurrency")
    domain_key: Literal["host", "registrable"] = Field(
        "host", description="what a limit applies to: the host, or its registrable domain"
    )
    public_suffix_file: Path | None = Field(
        None, description="public-suffix list for `registrable`; default the bundled copy"
    )
    respect_robots: bool = Field(True, description="fetch robots.txt first and obey it")
    robots_ttl: float = Field(3600.0, gt=0, description="seconds a robots.txt stays cached")
    robots_retry: float = Field(
        10.0, gt=0, description="seconds before retrying a robots.txt that failed (5xx, no answer); doubles"
    )
    robots_attempts: int = Field(
        3, ge=1, description="robots.txt failures in a row after which the origin is disallowed"
    )
    aimd_decrease: float = Field(0.5, gt=0, lt=1, description="factor a 429/503 streak multiplies the rate by")
    aimd_increase: float = Field(0.05, ge=0, description="fetches/s a success adds back, up to the ceiling")
    aimd_streak: int = Field(2, ge=1, description="429/503 answers in a row that lower a domain's rate")
    min_rate: float = Field(0.05, gt=0, description="lowest rate the adaptive rate goes down to")
    heartbeat_timeout: float = Field(
        3.0, gt=0, description="seconds after its last heartbeat a fetcher's capacity stops counting"
    )

    # Fetcher
    concurrency: int = Field(16, description="concurrent fetches per fetcher process")
    connect_timeout: float = Field(5.0, description="seconds to open a TCP connection")
    read_timeout: float = Field(10.0, description="seconds between two reads of a response")
    total_timeout: float = Field(30.0, description="seconds one fetch may take in all")
    adaptive_timeouts: bool = Field(
        True, description="wait on each domain about as long as its answers take (up to the timeouts above)"
    )
    adaptive_timeout_floor: float = Field(
        2.0, gt=0, description="shortest read timeout and total deadline the adaptive timeouts set"
    )
    adaptive_timeout_k: float = Field(
        4.0, ge=0, description="mean deviations of a domain's answer times added to their mean (TCP's K)"
    )
    adaptive_timeout_samples: int = Field(
        5, ge=1, description="answers from a domain before its adaptive timeout replaces the configured one"
    )
    user_agent: str = Field(
        "Hutch/0.1 (scraping job system)",
        description="User-Agent sent with every request",
    )
    max_body_bytes: int = Field(5 * 1024 * 1024, description="largest decoded response body accepted")
    max_content_encodings: int = Field(
        2, ge=0, description="content encodings stacked on one body that are undone; more is bad_encoding"
    )
    ca_file: Path | None = Field(
        None, description="PEM file of the only CAs fetches trust over TLS; default certifi's bundle"
    )
    max_redirects: int = Field(5, description="redirects followed per task, each a new attempt")
    max_url_bytes: int = Field(
        8192, ge=64, description="longest URL accepted, in bytes: each URL submitted and each redirect target"
    )
    max_attempts: int = Field(5, description="attempts a task may spend before it goes dead")
    max_pause: float = Field(600.0, description="longest site-requested wait (Retry-After) that spends no attempt")
    default_pause: float = Field(30.0, description="wait after a 429/503 that gives no Retry-After")
    max_throttles: int = Field(10, description="429/503 waits per task that spend no attempt")
    max_proxy_failures: int = Field(5, description="proxy failures per task that spend no attempt")
    max_proxy_waits: int = Field(
        30, description="waits for a usable proxy per task before it goes dead (reason no_proxy)"
    )
    max_returns: int = Field(
        100,
        ge=1,
        description="times a task may go back to the frontier unsent (its permit expired or came late, no proxy"
        " lease) before it goes dead (reason never_sent)",
    )
    policy_file: Path | None = Field(None, description="YAML overriding the failure policy and block patterns")
    allowed_targets: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="host:port list the SSRF guard lets through (comma separated; *.suffix and port * allowed)"
    )
    allow_private_networks: bool = Field(
        False, description="fetch loopback, private and link-local addresses (no SSRF guard)"
    )
    resolve: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="host:port:address entries answered before DNS, like curl --resolve (*.suffix, * allowed)"
    )
    retry_delays: Annotated[tuple[float, ...], NoDecode] = Field(
        DEFAULT_RETRY_DELAYS, description="delay tiers in seconds, comma separated"
    )
    use_proxy_manager: bool = Field(True, description="ask the proxy-manager for a lease on every attempt")

    # Proxy manager
    proxy_file: Path | None = Field(
        None, description="proxy pool: `URL [tier [cost]]` a line, or YAML; reloaded when it changes"
    )
    proxy_rate_fraction: float = Field(
        0.5, gt=0, description="per-(proxy, domain) rate cap as a fraction of HUTCH_RATE"
    )
    proxy_domain_rate: float | None = Field(
        None, gt=0, description="requests/s one proxy may send one domain; default rate x proxy_rate_fraction"
    )
    proxy_ban_seconds: float = Field(
        60.0, gt=0, description="first ban of a proxy on a domain after a block; doubles with each repeat"
    )
    proxy_ban_max: float = Field(3600.0, gt=0, description="longest ban of a proxy on a domain")
    proxy_dead_after: int = Field(
        3, ge=1, description="proxy failures in a row that ban a proxy on a domain, or mark it dead"
    )
    proxy_dead_domains: int = Field(
        2, ge=1, description="different domains a streak of proxy failures must span to mark a proxy dead"
    )
    proxy_probe_url: str | None = Field(
        None, description="URL fetched through a dead proxy to bring it back; unset = retry it after a while"
    )
    proxy_probe_interval: float = Field(30.0, gt=0, description="seconds between probes of a dead proxy")
    proxy_escalate_blocks: int = Field(
        3, ge=1, description="blocks on a domain within the window that move it to a costlier tier"
    )
    proxy_escalate_window: float = Field(60.0, gt=0, description="seconds over which those blocks count")
    proxy_tier_probe_interval: float = Field(
        600.0, gt=0, description="seconds before an escalated domain tries the cheaper tier again"
    )
    proxy_deescalate_after: int = Field(
        10, ge=1, description="successes in a row on the cheaper tier that bring a domain back down"
    )
    proxy_tier_floors: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="domain=tier entries: the cheapest tier each domain may use (comma separated)"
    )
    proxy_reload_interval: float = Field(2.0, gt=0, description="seconds between checks of the proxy file")
    direct_lease_seconds: float = Field(
        10.0,
        ge=0,
        description="with no pool configured: seconds a fetcher goes direct before asking again (0: every attempt)",
    )

    @field_validator("amqp_url")
    @classmethod
    def _one_cluster(cls, value: str) -> str:
        """Several nodes share everything but host and port: one user, vhost, scheme, options."""
        urls = [url.strip() for url in value.split(",") if url.strip()]
        if not urls:
            raise ValueError("no URL given")
        first = urlsplit(urls[0])
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("amqp", "amqps"):
                raise ValueError(f"{redact_url(url)}: not an amqp:// or amqps:// URL")
            same = (parts.scheme, parts.username, parts.password, parts.path, parts.query)
            if same != (first.scheme, first.username, first.password, first.path, first.query):
                raise ValueError(
                    "the nodes of a cluster differ only in host and port: same scheme, user, password, vhost and "
                    f"options as the first ({redact_url(urls[0])}), not {redact_url(url)}"
                )
        return value

    @field_validator("proxy_tier_floors", mode="before")
    @classmethod
    def _split_tier_floors(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    # Parser
    parse_workers: int = Field(
        2, ge=1, description="worker processes that run extraction, each killed and replaced past its time limit"
    )
    parse_timeout: float = Field(
        10.0, gt=0, description="seconds extraction of one page may take before it goes dead (parse_timeout)"
    )
    max_item_bytes: int = Field(
        1024 * 1024, gt=0, description="largest item, as JSON of its fields; over it (item_too_large)"
    )
    parse_memory_mb: int = Field(
        512, ge=0, description="MiB of address space a parse worker may add to its own (parse_memory); 0 = no cap"
    )
    max_links_per_page: int = Field(
        1000, ge=1, le=100_000,
        description="links a crawled page may offer (after its follow: rules, once each); the rest are left out",
    )  # fmt: skip

    @field_validator("retry_delays", mode="before")
    @classmethod
    def _split_delays(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(float(part) for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="before")
    @classmethod
    def _fits_in_environment(cls, data: Any) -> Any:
        """Refuse a value longer than one environment variable may be, before it is parsed."""
        if isinstance(data, Mapping):
            for name, value in data.items():
                check_env_size(str(name), value)
        return data

    @field_validator("allowed_targets", "resolve", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return split_entries(value)
        return value

    @field_validator("allowed_targets")
    @classmethod
    def _valid_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        allowed_table(value)  # raises naming the first bad entry
        return value

    @field_validator("resolve")
    @classmethod
    def _valid_resolve(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        resolve_table(value)  # raises naming the first bad entry
        return value

    @field_validator("retry_delays")
    @classmethod
    def _sorted_delays(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(not math.isfinite(delay) or delay <= 0 for delay in value):
            raise ValueError("retry_delays needs at least one positive delay, all finite")
        return tuple(sorted(set(value)))

    @property
    def inflate_limit(self) -> int:
        """Bytes a compressed message body may inflate to: room for a page of `max_body_bytes`
        as JSON-escaped text, with its task."""
        return self.max_inflated_bytes or 4 * self.max_body_bytes

    @property
    def store_location(self) -> str:
        return self.store_url or f"sqlite:///{self.data_dir / 'hutch.sqlite3'}"

    def metrics_port(self, service: str) -> int:
        """The metrics port of `service` (`proxy-manager` or `proxy_manager`)."""
        port: int = getattr(self, f"{service.replace('-', '_')}_metrics_port")
        return port

    @property
    def safe_amqp_url(self) -> str:
        return ",".join(redact_url(url) for url in self.amqp_urls)

    @property
    def amqp_urls(self) -> list[str]:
        """The nodes of `amqp_url`, each a whole URL (`amqp://u:p@a:5672/v,amqp://u:p@b:5672/v`)."""
        return [url.strip() for url in self.amqp_url.split(",") if url.strip()]

    @property
    def amqp_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of each node, in the order given."""
        nodes = []
        for url in self.amqp_urls:
            parts = urlsplit(url)
            nodes.append((parts.hostname or "127.0.0.1", parts.port or (5671 if parts.scheme == "amqps" else 5672)))
        return nodes

    def to_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with every HUTCH_ variable replaced by these settings: a child's environment.

        ValueError if a value is over MAX_ENV_BYTES (`model_copy` does not validate).
        """
        env = {k: v for k, v in base.items() if not k.startswith("HUTCH_")}
        for name, value in self.model_dump().items():
            text = env_text(value)
            if text is not None:
                check_env_size(name, text)
                env[f"HUTCH_{name.upper()}"] = text
        return env


def problems(exc: ValidationError) -> str:
    """A settings error as one line, each bad variable by name with pydantic's message alone:
    never the value given, which may hold a password."""
    return "; ".join(
        f"HUTCH_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']}" for error in exc.errors()
    )


def env_text(value: object) -> str | None:
    """A setting's value as its environment variable holds it (None: left unset)."""
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def check_env_size(name: str, value: object) -> None:
    """ValueError when `HUTCH_<NAME>=value` is over MAX_ENV_BYTES as UTF-8 (with its NUL)."""
    text = env_text(value)
    if text is None:
        return
    variable = f"HUTCH_{name.upper()}"
    size = len(variable) + 1 + len(text.encode("utf-8", "surrogatepass")) + 1
    if size > MAX_ENV_BYTES:
        raise ValueError(
            f"{variable} would be {size:,} bytes, over the {MAX_ENV_BYTES:,} (128 KiB) one environment "
            f"variable may hold{_WILDCARD_HINTS.get(name.lower(), '')}"
        )


def redact_url(url: str) -> str:
    """The URL with any password replaced, for logs and error messages."""
    parts = urlsplit(url)
    # libpq also takes the password as a parameter (postgresql://u@h/db?password=...).
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    if parts.password is None:
        # Untouched unless a password parameter was hidden: urlunsplit would turn sqlite:///x
        # into sqlite:/x.
        return url if query == parts.query else url.replace("?" + parts.query, "?" + query, 1)
    host = parts.netloc.rpartition("@")[2]  # keeps IPv6 brackets and the port as written
    netloc = f"{parts.username}:***@{host}" if parts.username else host
    return urlunsplit(parts._replace(netloc=netloc, query=query))
