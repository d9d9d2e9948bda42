"""The sandbox's configuration, validated on load so a typo fails loudly instead of silently.

A sandbox is described by one YAML document. Every mapping refuses keys it does not know
(``extra="forbid"``): a misspelt ``eror_500`` would otherwise be ignored and a test would pass
against a server that never misbehaves. Shape, with defaults::

    host: 127.0.0.1            # sites and proxies listen here; must be in 127.0.0.0/8
    seed: 7                    # every random decision is derived from it (reproducible runs)
    access_log: null           # optional JSONL file, one line per request (sites and proxies)
    sites:
      - name: books            # letters, digits, ".", "_", "-"; unique
        port: 0                # 0 = a free port chosen at start
        pages: 100             # serves /page/0 .. /page/99
        latency_ms: [0, 0]     # uniform per request on normal pages; a single number is [n, n]
        page_kb: 0             # above 0: each page is a documentation page of about this many KiB
        robots_txt: null       # body of /robots.txt; null = allow everything
        tls: false             # true: https, with a certificate of the sandbox's test CA (tls.py)
        faults:                # probabilities per normal-page request, drawn independently;
          error_500: 0.0       #   when several fire, the first in this order wins:
          error_503: 0.0       #   reset, hang, trickle, error_500, error_503, rate_429
          reset: 0.0           # close abruptly with a TCP RST, no response
          hang: 0.0            # never answer, until the client leaves or the sandbox stops
          trickle: 0.0         # headers, then the body at 1 byte per second
          rate_429: 0.0
          retry_after: "1"     # Retry-After on 429 and 503; null = no header; or an HTTP date
        politeness:            # optional: more than max_per_second requests from one client IP
          max_per_second: 10   #   within any 1 s window bans that IP for ban_seconds; every
          ban_seconds: 5       #   normal-page request from it then gets 403
        block:                 # optional: requests from datacenter addresses are blocked
          datacenter_probability: 0.6
          style: status_403    # status_403 (403 block page) or challenge_200 (200 challenge page)
    proxies:
      - name: dc1              # unique
        tier: datacenter       # datacenter, residential or mobile: the word in the proxy file
        source: 127.0.1.1      # upstream connections leave from this address (127.0.0.0/8)
        port: 0                # listening port on `host`; 0 = free port
        fail: 0.0              # probability the proxy answers 502 itself
        down: false            # true: listens, but resets every connection
        auth: null             # "user:pass": Proxy-Authorization required, 407 otherwise
    address_tiers:             # which client addresses sites regard as datacenter
      datacenter: [127.0.0.1/32, 127.0.1.0/24]

Convention: 127.0.1.x are datacenter sources, 127.0.2.x residential, and a scraper talking to
a site directly (from 127.0.0.1) looks like a datacenter client.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "AddressTiers",
    "BlockConfig",
    "ConfigError",
    "FaultConfig",
    "PolitenessConfig",
    "ProxyConfig",
    "SandboxConfig",
    "SiteConfig",
    "load_config",
]

LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Port = Annotated[int, Field(ge=0, le=65535)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]


class ConfigError(ValueError):
    """The sandbox configuration is malformed; the message names the file and the bad keys."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _loopback(value: str) -> str:
    address = ipaddress.IPv4Address(value)
    if address not in LOOPBACK:
        raise ValueError(f"{value} is not in 127.0.0.0/8; the sandbox only uses loopback")
    return str(address)


class FaultConfig(_Strict):
    error_500: Probability = 0.0
    error_503: Probability = 0.0
    reset: Probability = 0.0
    hang: Probability = 0.0
    trickle: Probability = 0.0
    rate_429: Probability = 0.0
    retry_after: str | None = "1"

    @field_validator("retry_after", mode="before")
    @classmethod
    def _number_as_text(cls, value: Any) -> Any:
        # YAML reads `retry_after: 1` as an int; the header value is text either way.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value


class PolitenessConfig(_Strict):
    max_per_second: Annotated[int, Field(ge=1)]
    ban_seconds: Annotated[float, Field(gt=0)]


class BlockConfig(_Strict):
    datacenter_probability: Probability
    style: Literal["status_403", "challenge_200"] = "status_403"


class SiteConfig(_Strict):
    name: Name
    port: Port = 0
    pages: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    latency_ms: tuple[int, int] = (0, 0)
    page_kb: Annotated[int, Field(ge=0, le=4096)] = 0
    robots_txt: str | None = None
    tls: bool = False
    faults: FaultConfig = FaultConfig()
    politeness: PolitenessConfig | None = None
    block: BlockConfig | None = None

    @field_validator("latency_ms", mode="before")
    @classmethod
    def _single_latency(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @field_validator("latency_ms")
    @classmethod
    def _ordered_latency(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if low < 0 or high < low:
            raise ValueError("latency_ms must be [low, high] with 0 <= low <= high")
        return value


class ProxyConfig(_Strict):
    name: Name
    tier: Literal["datacenter", "residential", "mobile"]
    source: str
    port: Port = 0
    fail: Probability = 0.0
    down: bool = False
    auth: Annotated[str, Field(pattern=r"^[^:\s]+:\S*$")] | None = None

    @field_validator("source")
    @classmethod
    def _loopback_source(cls, value: str) -> str:
        return _loopback(value)


class AddressTiers(_Strict):
    datacenter: list[ipaddress.IPv4Network] = [
        ipaddress.IPv4Network("127.0.0.1/32"),
        ipaddress.IPv4Network("127.0.1.0/24"),
    ]


class SandboxConfig(_Strict):
    host: str = "127.0.0.1"
    seed: int = 7
    access_log: str | None = None
    sites: list[SiteConfig] = []
    proxies: list[ProxyConfig] = []
    address_tiers: AddressTiers = AddressTiers()

    @field_validator("host")
    @classmethod
    def _loopback_host(cls, value: str) -> str:
        return _loopback(value)

    @model_validator(mode="after")
    def _unique(self) -> SandboxConfig:
        _refuse_duplicates("site name", (site.name for site in self.sites))
        _refuse_duplicates("proxy name", (proxy.name for proxy in self.proxies))
        fixed = [site.port for site in self.sites] + [proxy.port for proxy in self.proxies]
        _refuse_duplicates("port", (str(port) for port in fixed if port))
        return self

    def site(self, name: str) -> SiteConfig:
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)


def _refuse_duplicates(what: str, values: Iterable[str]) -> None:
    repeated = sorted(value for value, count in Counter(values).items() if count > 1)
    if repeated:
        raise ValueError(f"duplicate {what}: {', '.join(repeated)}")


def load_config(path: str | Path | None = None) -> SandboxConfig:
    """Read and validate a sandbox YAML file; ``None`` loads the bundled ``default.yaml``."""
    if path is None:
        source = "hutch_sandbox/default.yaml"
        text = resources.files("hutch_sandbox").joinpath("default.yaml").read_text("utf-8")
    else:
        source = str(path)
        text = Path(path).read_text("utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{source}: the sandbox config must be a mapping, not a {kind}")
    try:
        return SandboxConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid sandbox config\n{_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)
