"""The life of one service process: connect, start consuming, stop in order.

Every service is a `Service`: `run()` sets up logging and tracing, connects (waiting for
the broker if it is not up yet, as a container started before RabbitMQ must), declares the
topology, calls `start()`, then on SIGTERM or SIGINT stops consuming, lets in-flight work
finish within `shutdown_grace`, then asks the service to `abandon()` what still runs (the
fetcher cancels its fetches and gives their tasks back unspent) and waits a little more for
those handlers to publish; what is still unacked after that is requeued by the broker when the
connection closes. Then `stop()`, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import ValidationError

from hutch import telemetry
from hutch.amqp import Broker, BrokerUnreachable
from hutch.metrics import Endpoint, Metrics
from hutch.settings import Settings, problems

log = logging.getLogger(__name__)
T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop where it is installed, else on asyncio's loop.

    The governor's time is mostly AMQP frames and callbacks; uvloop's loop and transports take
    about a tenth off its CPU per permit (bench/governor_permits.py).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def tune_gc(threshold: int) -> None:
    """Once a service is ready: what it built so far (modules, pydantic's models, its topology,
    tens of thousands of objects that live as long as the process) leaves the garbage
    collector's passes, and young passes come every `threshold` allocations, not Python's 700.

    With Python's collector as it is, 4,000 small pages cost the governor, the fetcher and the
    storer 1.5 s of collection together (0.38 ms a page), most of it full passes over
    everything each service ever built, up to 92 ms each; with the startup frozen and 10,000,
    0.38 s (0.10 ms a page), the longest pass 33 ms (docs/benchmarks.md, twentieth round).
    Cycles made later are still collected. `threshold` 0 leaves the collector untouched."""
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


def set_sched_policy(policy: str) -> str:
    """Ask Linux to run this process (and what it starts later) under `policy`; the policy it
    runs under is returned, by name.

    Under SCHED_BATCH a process woken by a message does not preempt the one running: it runs
    when that one blocks or its slice ends. On a host whose cores the broker and the services
    share, a default-policy reader woken by every frame took the CPU from the writer a message
    at a time; handled in turn, each wake-up finds several messages waiting (docs/benchmarks.md,
    twenty-second round). No privilege is needed to enter SCHED_BATCH. Where the call is
    missing (not Linux) or refused, the service runs on as it is and says so."""
    if policy == "batch" and hasattr(os, "sched_setscheduler"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError as exc:
            log.warning("cannot enter SCHED_BATCH (%s); running under the default policy", exc)
    return sched_policy_of(0)


def sched_policy_of(pid: int) -> str:
    """The scheduling policy process `pid` (0: this one) runs under, by name."""
    if not hasattr(os, "sched_getscheduler"):
        return "normal"
    names = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}
    policy = os.sched_getscheduler(pid)
    return names.get(policy, f"policy {policy}")


class Service:
    name = "service"
    # Run on uvloop where it is installed. Only the governor does: its permits per second are
    # per process. (Under uvloop the proxy-manager's probes through a proxy that had reset
    # connections kept failing after it healed: tests/e2e/test_proxy_manager.py.)
    uvloop = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.broker = Broker(settings, self.name)
        self.stopping = asyncio.Event()
        self.metrics = Metrics(settings.metrics_domains)
        self.endpoint: Endpoint | None = None

    async def start(self) -> None:
        """Declare what the service needs beyond the static topology and start consuming."""

    async def abandon(self) -> int:
        """Past the grace period: make in-flight handlers finish now (give their work back);
        how many were cut short. Services whose handlers cannot be cut short return 0."""
        return 0

    async def stop(self) -> None:
        """Release the service's own resources after consuming stopped and work drained."""

    async def connect(self, wait: bool = True) -> None:
        delay = 0.5
        while True:
            try:
                await self.broker.connect()
                return
            except BrokerUnreachable as exc:
                if not wait or self.stopping.is_set():
                    raise
                log.warning("%s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def run(self) -> None:
        telemetry.setup_tracing(self.name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stopping.set)
        await self.serve_metrics()
        await self.connect()
        await self.start()
        tune_gc(self.settings.gc_threshold)
        log.info(
            "%s ready (broker %s, namespace %s, event loop %s, scheduling %s)",
            self.name, self.settings.safe_amqp_url, self.settings.namespace,
            type(loop).__module__.split(".")[0],  # uvloop or asyncio
            sched_policy_of(0),
        )
        await self.stopping.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        log.info("%s stopping: no new work, %.0fs for work in flight", self.name, self.settings.shutdown_grace)
        await self.broker.stop_consuming()
        if not await self.broker.drain(self.settings.shutdown_grace):
            log.warning("%s: work still in flight after the grace period; giving it back", self.name)
            # Abandoned handlers publish their work back (one confirm each): give them that long.
            if await self.abandon() and not await self.broker.drain(self.settings.publish_timeout + 1.0):
                log.warning("%s: work still in flight; the broker will redeliver it", self.name)
        await self.stop()
        await self.broker.close()
        if self.endpoint is not None:
            await self.endpoint.close()
        log.info("%s stopped", self.name)

    async def serve_metrics(self) -> None:
        """Serve /metrics, /healthz and /readyz, before the broker is reached: a probe then
        sees a live process that is not ready yet. A port already taken is logged and the
        service runs on without them: the work matters more than its figures."""
        s = self.settings
        if not s.metrics:
            return
        endpoint = Endpoint(self.metrics, lambda: self.broker.ready, s.metrics_host, s.metrics_port(self.name))
        try:
            port = await endpoint.start()
        except OSError as exc:
            log.error("%s: no metrics: cannot listen on %s:%d: %s", self.name, s.metrics_host, endpoint.port, exc)
            return
        self.endpoint = endpoint
        log.info("%s metrics on http://%s:%d/metrics", self.name, s.metrics_host, port)


def main(service_class: type[Service], settings: Settings | None = None) -> None:
    """The one way a service runs: `python -m hutch.services.<name>` (what `hutch up` starts)
    and `hutch serve NAME` (what the image, compose and Kubernetes run) both come here, so a
    service gets the same logging, event loop and exit wherever it is deployed."""
    try:
        settings = settings or Settings()
    except ValidationError as exc:  # one line naming the variables, never their values
        raise SystemExit(f"{service_class.name}: invalid setting {problems(exc)}") from None
    telemetry.setup_logging(service_class.name, settings.log_level, settings.log_format)
    # Before anything starts: the parser's extraction workers inherit the policy.
    set_sched_policy(settings.sched_policy)
    try:
        service = service_class(settings)
        if service_class.uvloop:
            run_loop(service.run())
        else:
            asyncio.run(service.run())
    except BrokerUnreachable as exc:
        raise SystemExit(f"{service_class.name}: {exc}") from None
