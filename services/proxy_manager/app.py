"""The proxy-manager's wiring: lease RPC, outcome reports, pool reloads, probes, saved state.

No pool configured (`HUTCH_PROXY_FILE` unset) means every lease says "direct"; a configured
pool is never bypassed: when no proxy can be used now the lease says when to ask again.
The logic is in broker-free modules (`leases`, `health`, `tiers`); this module only feeds
them: lease requests from `rpc.proxy` (answered to the caller's own reply queue), outcome events from the
durable `events.proxy-manager` queue, the pool file when it changes (checked every
`HUTCH_PROXY_RELOAD_INTERVAL` seconds, and at once on SIGHUP), probe results, and the state
file at start. Proxy URLs appear only in the leases' `url`; logs name proxies by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hutch.amqp import Delivery, serve_rpc
from hutch.metrics import Metric, gauge
from hutch.models import Event, Lease, LeaseRequest
from hutch.service import Service
from hutch.services.proxy_manager import state
from hutch.services.proxy_manager.health import HealthConfig
from hutch.services.proxy_manager.leases import Selector, SelectorConfig, describe
from hutch.services.proxy_manager.pool import PoolError, PoolFile, parse_tier_floors
from hutch.services.proxy_manager.probe import probe
from hutch.services.proxy_manager.tiers import TierConfig
from hutch.settings import Settings

log = logging.getLogger(__name__)
SAVE_EVERY = 0.25  # seconds between a change and its write to the state file, at most
STREAM_EVERY = 2.0  # seconds between two snapshots on the broker's stream, at least


class ConfigurationError(SystemExit):
    """A pool file or setting the manager cannot start with; the message says which."""


def selector_config(settings: Settings, probe_url: str | None = None) -> SelectorConfig:
    s = settings
    try:
        floors = parse_tier_floors(s.proxy_tier_floors, "HUTCH_PROXY_TIER_FLOORS")
    except PoolError as exc:
        raise ConfigurationError(f"proxy-manager: {exc}") from None
    return SelectorConfig(
        rate_cap=s.proxy_domain_rate or s.rate * s.proxy_rate_fraction,
        tier_floors=floors,
        health=HealthConfig(
            ban_seconds=s.proxy_ban_seconds,
            ban_max=s.proxy_ban_max,
            dead_after=s.proxy_dead_after,
            dead_domains=s.proxy_dead_domains,
            probe_interval=s.proxy_probe_interval,
            active_probe=(probe_url or s.proxy_probe_url) is not None,
        ),
        tiers=TierConfig(
            escalate_blocks=s.proxy_escalate_blocks,
            window=s.proxy_escalate_window,
            trial_interval=s.proxy_tier_probe_interval,
            deescalate_after=s.proxy_deescalate_after,
        ),
    )


class ProxyManager(Service):
    name = "proxy-manager"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.selector = Selector(selector_config(settings), time.time)
        self.pool_file = PoolFile(settings.proxy_file) if settings.proxy_file else None
        self.state_path = Path(settings.data_dir) / state.FILENAME
        self._saved_version = -1
        self._published_version = -1
        self._published_at = 0.0
        self._restored_at = 0.0  # saved_at of the snapshot restored last (0: none)
        self._active = False  # answered a lease: this manager's state is the one to keep
        self._taken_over = False  # and read its predecessor's newest state: it may publish
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_now = asyncio.Event()

    async def start(self) -> None:
        if self.pool_file is not None:
            try:
                pool = self.pool_file.load()
            except PoolError as exc:
                raise ConfigurationError(f"proxy-manager: {exc}") from None
            if not pool.proxies:
                raise ConfigurationError(f"proxy-manager: the proxy file {self.pool_file.path} lists no proxy")
            self.selector.set_pool(pool)
            if await self._restore_from_broker():
                pass
            elif state.load_into(self.selector, self.state_path):
                log.info("state restored from %s: %s", self.state_path, self.selector.summary())
            self._saved_version = self.selector.version
            log.info(
                "proxy pool: %d proxies (%s)",
                len(pool.proxies),
                ", ".join(f"{sum(p.tier == t for p in pool.proxies)} {t}" for t in pool.tiers),
            )
            self._tasks = [
                asyncio.create_task(self._watch_pool()),
                asyncio.create_task(self._save_loop()),
                asyncio.create_task(self._probe_loop()),
            ]
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reload_now.set)
        else:
            log.info("proxy pool: none configured; every lease is direct")
        self.metrics.collect(self._collect)
        topology = self.broker.topology
        await serve_rpc(self.broker, topology.rpc_proxy, LeaseRequest, self._lease)
        await self.broker.consume(topology.events_proxy, Event, self._on_event, stage="proxy-health", prefetch=500)

    async def stop(self) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.pool_file is not None:
            await self._save(final=True)

    # -- the two message flows ----------------------------------------------------------------

    async def _restore_from_broker(self) -> bool:
        data = await state.newest(self.broker)
        if data is None or data["saved_at"] <= self._restored_at:
            return False
        state.restore(self.selector, data)
        self._restored_at = data["saved_at"]
        log.info("state restored from the broker (saved %.0fs ago): %s", time.time() - data["saved_at"],
                 self.selector.summary())
        return True

    async def _take_over(self) -> None:
        """After the first lease this manager answers (the lease queue has one consumer at a
        time, so it is the active one now): read the state a predecessor left, beside the
        leases, not before them (awaited inside the lease handler, the read stalled the leases
        for about 30 s: tests/e2e/test_cli.py). It publishes only once this is done, so it never
        writes its standby state over its predecessor's."""
        try:
            await self._restore_from_broker()
        except Exception as exc:  # the broker went meanwhile: the file or the start's read stand
            log.warning("proxy-manager state not read at takeover: %s", type(exc).__name__)
        finally:
            self._taken_over = True

    async def _lease(self, request: LeaseRequest) -> Lease:
        if self.pool_file is None:
            return Lease(direct=True, valid_for=self.settings.direct_lease_seconds or None)
        if not self._active:
            self._active = True
            self._tasks.append(asyncio.create_task(self._take_over()))
        lease = self.selector.lease(request)
        self.metrics.leases.labels(lease.tier or ("direct" if lease.direct else "none")).inc()
        return lease

    def _collect(self) -> Iterator[Metric]:
        """Proxy health by tier, read from the selector at each scrape: ids never, counts only."""
        selector = self.selector
        if self.pool_file is None:
            return
        now = selector.clock()
        counts: dict[tuple[str, str], float] = {}
        for pid, proxy in selector.proxies.items():
            state = "dead" if selector.health.is_dead(pid) else "alive"
            counts[(proxy.tier, state)] = counts.get((proxy.tier, state), 0.0) + 1
        yield gauge("hutch_proxies", "Proxies in the pool, by tier and state (alive, dead)", ["tier", "state"],
                    counts.items())
        bans: dict[tuple[str], float] = {}
        for (pid, _), pair in selector.health.pairs.items():
            banned = selector.proxies.get(pid)
            if banned is not None and pair.banned_until > now:
                bans[(banned.tier,)] = bans.get((banned.tier,), 0.0) + 1
        yield gauge("hutch_proxy_bans", "Proxy and domain pairs banned now, by tier", ["tier"], bans.items())

    async def _on_event(self, event: Event, _: Delivery) -> None:
        if self.pool_file is None:
            return
        for line in describe(self.selector.report(event)):
            log.info("%s", line)

    # -- background work ------------------------------------------------------------------------

    async def _watch_pool(self) -> None:
        assert self.pool_file is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload_now.wait(), self.settings.proxy_reload_interval)
            forced = self._reload_now.is_set()
            self._reload_now.clear()
            if forced or self.pool_file.changed():
                self.reload()

    def reload(self) -> bool:
        """Re-read the pool file; a file that cannot be used leaves the current pool in place."""
        assert self.pool_file is not None
        try:
            pool = self.pool_file.load()
        except PoolError as exc:
            log.error("proxy file not reloaded, keeping the current pool: %s", exc)
            return False
        if not pool.proxies:
            log.error("proxy file not reloaded: it lists no proxy; keeping the current pool")
            return False
        before = set(self.selector.proxies)
        self.selector.set_pool(pool)
        after = set(self.selector.proxies)
        log.info(
            "proxy pool reloaded: %d proxies (%d added, %d removed)",
            len(after),
            len(after - before),
            len(before - after),
        )
        return True

    async def _save(self, final: bool = False) -> None:
        version = self.selector.version
        data = state.snapshot(self.selector)
        try:
            await asyncio.to_thread(state.write_atomically, self.state_path, data)
        except OSError as exc:
            log.warning("proxy-manager state not saved to %s: %s", self.state_path, exc.strerror)
        else:
            self._saved_version = version
        due = final or time.monotonic() - self._published_at >= STREAM_EVERY
        if self._taken_over and version != self._published_version and due:
            try:
                await state.publish(self.broker, data)
            except Exception as exc:  # the broker is away: the next save tries again
                log.warning("proxy-manager state not published: %s", type(exc).__name__)
                return
            self._published_version = version
            self._published_at = time.monotonic()

    async def _save_loop(self) -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(SAVE_EVERY)
            # Bans, deaths and tier changes at once; health drifts, so every 30 s is enough for it.
            changed = self.selector.version != self._saved_version
            unpublished = self._taken_over and self.selector.version != self._published_version
            if changed or unpublished or time.monotonic() - last_full > 30:
                await self._save()
                last_full = time.monotonic()

    async def _probe_loop(self) -> None:
        url = self.settings.proxy_probe_url
        if url is None:
            return  # dead proxies come back through one trial lease each (see health.py)
        interval = min(self.settings.proxy_probe_interval, 1.0)
        timeout = min(self.settings.connect_timeout + self.settings.read_timeout, self.settings.proxy_probe_interval)
        while True:
            await asyncio.sleep(interval)
            due = self.selector.due_for_probe()
            for proxy in due:
                self.selector.health.probe_failed(proxy.id, time.time())  # not probed again meanwhile
            results = await asyncio.gather(*(probe(proxy, url, timeout, self.settings.user_agent) for proxy in due))
            for proxy, (ok, what) in zip(due, results, strict=True):
                changes = self.selector.probed(proxy.id, ok)
                if ok:
                    log.info("proxy %s answered its probe (%s): back in the pool", proxy.id, what)
                else:
                    log.info("proxy %s still dead: probe failed (%s)", proxy.id, what)
                for line in describe(changes):
                    log.debug("%s", line)


SERVICE = ProxyManager
