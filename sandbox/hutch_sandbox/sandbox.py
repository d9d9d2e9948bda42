"""The whole fake internet as one object: every site and proxy of a config, started and stopped
together, with one access log and the lists (URLs, proxy file, allowed targets) a scraper run
is seeded from.

One site can stand for any number of domains: `wildcard_entries("wide.test")` gives the
`HUTCH_RESOLVE` and `HUTCH_ALLOWED_TARGETS` entries that send every host under `wide.test`
(`d00001.wide.test`, ...) to one site's port, and `host_stats()` says what each of those
domains received, in all and at most within one second."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hutch.targets import parse_resolve
from hutch_sandbox.accesslog import AccessLog, AccessRecord
from hutch_sandbox.config import SandboxConfig, load_config
from hutch_sandbox.hostcount import HostCounter, HostStats
from hutch_sandbox.proxy import ProxyServer
from hutch_sandbox.site import SiteServer
from hutch_sandbox.tls import TestCA

__all__ = ["Sandbox", "WildcardEntries"]


@dataclass(frozen=True)
class WildcardEntries:
    """The two entries that send every host under a suffix to one site."""

    resolve: str  # for HUTCH_RESOLVE: `*.wide.test:PORT:127.0.0.1`
    allowed: str  # for HUTCH_ALLOWED_TARGETS: `*.wide.test:PORT`


class Sandbox:
    """Sites and proxies of ``config`` (the bundled default when None) on loopback.

    ``access_log`` (a JSONL path) overrides the config's ``access_log``.
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        access_log: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config if config is not None else load_config(None)
        path = access_log if access_log is not None else self.config.access_log
        self._access_log = AccessLog(Path(path) if path is not None else None)
        self._hosts = HostCounter()
        self.sites: dict[str, SiteServer] = {
            site.name: SiteServer(site, self.config, self._access_log, self._hosts) for site in self.config.sites
        }
        self.proxies: dict[str, ProxyServer] = {
            proxy.name: ProxyServer(proxy, self.config, self._access_log, self._site_at)
            for proxy in self.config.proxies
        }
        # A CA of its own when a site speaks TLS; clients trust `ca.pem` (HUTCH_CA_FILE).
        self.ca: TestCA | None = None
        if any(site.config.tls for site in self.sites.values()):
            self.ca = TestCA()
            context = self.ca.server_context()
            for site in self.sites.values():
                if site.config.tls:
                    site.tls = context
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every site, then every proxy; ports chosen as 0 are resolved afterwards."""
        if self._started:
            raise RuntimeError("sandbox already started")
        self._started = True
        self._access_log.open()
        try:
            for site in self.sites.values():
                await site.start()
            for proxy in self.proxies.values():
                await proxy.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close listeners and every open connection, hanging ones included."""
        for listener in [*self.proxies.values(), *self.sites.values()]:
            await listener.stop()
        self._access_log.close()
        self._started = False

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- what a scraper run is seeded from ------------------------------------------------------

    @property
    def log(self) -> list[AccessRecord]:
        """Every request received so far, sites and proxies, in arrival order."""
        return self._access_log.records

    def site_log(self, name: str) -> list[AccessRecord]:
        return self._access_log.for_site(name)

    def proxy_log(self, name: str) -> list[AccessRecord]:
        return self._access_log.for_proxy(name)

    def urls(self) -> list[str]:
        """Every /page/<i> URL of every site, site by site."""
        self._require_started()
        return [url for site in self.sites.values() for url in site.urls()]

    def proxy_file_text(self) -> str:
        """One proxy a line: its URL, a space, its tier word."""
        self._require_started()
        return "".join(f"{proxy.url} {proxy.tier}\n" for proxy in self.proxies.values())

    def allowed_targets(self) -> list[str]:
        """host:port of every site."""
        self._require_started()
        return [site.domain for site in self.sites.values()]

    def wildcard_entries(self, suffix: str, site: str | None = None) -> WildcardEntries:
        """Entries sending every host under ``suffix`` (not ``suffix`` itself) to ``site``'s port.

        ``site`` defaults to the first site of the config. The site serves each host alike, so
        the URLs are ``sites[site].host_url("d00001.wide.test", "/page/0")`` and so on.
        """
        self._require_started()
        server = self.sites[site] if site is not None else next(iter(self.sites.values()))
        resolve = f"*.{suffix}:{server.port}:{server.host}"
        parse_resolve(resolve)  # a bad suffix fails here, not in every service
        return WildcardEntries(resolve=resolve, allowed=f"*.{suffix}:{server.port}")

    def host_stats(self) -> dict[str, HostStats]:
        """Requests each Host header (`host:port`, lower case) brought to the sites: in all, and
        the most within any one second."""
        return self._hosts.stats()

    def worst_host_second(self) -> tuple[str, int] | None:
        """The Host that got the most requests within one second, and how many; None before any."""
        return self._hosts.worst()

    def ready_info(self, **paths: str | None) -> dict[str, Any]:
        """A JSON-able description of the running sandbox, plus any ``paths`` given."""
        self._require_started()
        return {
            "pid": os.getpid(),
            "host": self.config.host,
            "seed": self.config.seed,
            "sites": {
                site.name: {
                    "port": site.port,
                    "base_url": site.base_url,
                    "domain": site.domain,
                    "pages": site.config.pages,
                }
                for site in self.sites.values()
            },
            "proxies": {
                proxy.name: {
                    "url": proxy.url,
                    "port": proxy.port,
                    "tier": proxy.tier,
                    "source": proxy.source,
                }
                for proxy in self.proxies.values()
            },
            "allowed_targets": self.allowed_targets(),
            "access_log": str(self._access_log.path) if self._access_log.path else None,
            **paths,
        }

    def _site_at(self, host: str, port: int) -> str | None:
        for site in self.sites.values():
            if site.host == host and site.port == port:
                return site.name
        return None

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("start the sandbox first: ports are chosen at start")
