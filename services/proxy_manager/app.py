"""The proxy-manager's wiring: answer lease requests from the pool.

No pool configured (`HUTCH_PROXY_FILE` unset) means every lease says "direct"; a
configured pool is never bypassed.
"""

from __future__ import annotations

import logging

from hutch.amqp import serve_rpc
from hutch.models import Lease, LeaseRequest
from hutch.service import Service
from hutch.services.proxy_manager.pool import RoundRobin, load_pool

log = logging.getLogger(__name__)


class ProxyManager(Service):
    name = "proxy-manager"

    async def start(self) -> None:
        proxies = load_pool(self.settings.proxy_file) if self.settings.proxy_file else []
        self.pool = RoundRobin(proxies)
        tiers = sorted({p.tier for p in proxies})
        log.info("proxy pool: %d proxies (%s)", len(proxies), ", ".join(tiers) or "direct")
        await serve_rpc(self.broker, self.broker.topology.rpc_proxy, LeaseRequest, self._lease)

    async def _lease(self, request: LeaseRequest) -> Lease:
        if not self.pool.proxies:
            return Lease(direct=True)
        proxy = self.pool.choose(set(request.exclude))
        assert proxy is not None
        return Lease(proxy_id=proxy.id, url=proxy.url, tier=proxy.tier)


SERVICE = ProxyManager
