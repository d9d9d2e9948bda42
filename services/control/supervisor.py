"""Running the services as child processes: `hutch up`, `hutch run` and the end-to-end tests.

Each service is its own process (`python -m hutch.services.<name>`), exactly as a container
runs it, so killing one is a real crash. Their output is prefixed with the service's name
(`fetcher.2 | ...`); a child that dies while the set is running is started again after a
short backoff; `stop()` sends SIGTERM to all (each drains its in-flight work) and SIGKILL
to any still alive after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

from hutch.services import SERVICES, module_of
from hutch.settings import Settings

READY_MARK = " ready (broker "


@dataclass
class Child:
    service: str
    index: int
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    restarts: int = 0
    started_at: float = 0.0
    pump: asyncio.Task[None] | None = None
    # Variables this child gets on top of the set's, from its next start on (a rolling
    # upgrade starts each service again in turn with the new build's environment).
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.service}.{self.index}" if self.service == "fetcher" else self.service


class Supervisor:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        fetchers: int = 1,
        services: tuple[str, ...] = SERVICES,
        restart: bool = True,
        out: TextIO | None = sys.stderr,
        grace: float = 10.0,
        quick_backoff: float = 2.0,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.restart = restart
        # The wait before restarting a child that died within 5 s of its start; it doubles
        # with each such death, up to 30 s.
        self.quick_backoff = quick_backoff
        self.out = out
        self.grace = grace
        self.stopping = False
        self.children: list[Child] = []
        for name in services:
            count = fetchers if name == "fetcher" else 1
            self.children.extend(Child(name, i + 1) for i in range(count))
        self._watchers: list[asyncio.Task[None]] = []

    def child(self, label: str) -> Child:
        for child in self.children:
            if child.label == label:
                return child
        raise KeyError(label)

    def env_of(self, child: Child) -> dict[str, str]:
        """A child's environment: fetcher N serves its metrics on the fetchers' port + N - 1
        (none of them on the same port), unless that port is 0 (each takes a free one)."""
        env = {**self.env, **child.extra_env}
        if child.service != "fetcher" or child.index == 1:
            return env
        base = int(env.get("HUTCH_FETCHER_METRICS_PORT", Settings.model_fields["fetcher_metrics_port"].default))
        if base == 0:
            return env
        return {**env, "HUTCH_FETCHER_METRICS_PORT": str(base + child.index - 1)}

    async def start(self) -> None:
        for child in self.children:
            await self._spawn(child)
            self._watchers.append(asyncio.create_task(self._watch(child)))

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every child has connected and started consuming."""
        waits = [asyncio.create_task(c.ready.wait()) for c in self.children]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            late = [c.label for c in self.children if not c.ready.is_set()]
            raise TimeoutError(f"services not ready after {timeout:.0f}s: {', '.join(late)}")

    async def _spawn(self, child: Child) -> None:
        child.ready.clear()
        child.started_at = time.monotonic()
        child.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module_of(child.service),
            env=self.env_of(child),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches the supervisor only
        )
        child.pump = asyncio.create_task(self._pump(child, child.process))

    async def _pump(self, child: Child, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        width = max(len(c.label) for c in self.children)
        while True:
            line = await process.stdout.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if READY_MARK in text:
                child.ready.set()
            if self.out is not None:
                print(f"{child.label:<{width}} | {text}", file=self.out, flush=True)

    async def _watch(self, child: Child) -> None:
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if child.pump is not None:
                with contextlib.suppress(Exception):
                    await child.pump
            if self.stopping or not self.restart:
                return
            child.restarts += 1
            # Back off when a child keeps dying at start (e.g. a bad setting), not after a crash
            # of a long-lived child.
            quick = time.monotonic() - child.started_at < 5
            delay = min(self.quick_backoff * 2.0 ** (min(child.restarts, 5) - 1), 30.0) if quick else 0.5
            if self.out is not None:
                print(f"{child.label} | exited with {code}; restarting in {delay:.1f}s", file=self.out, flush=True)
            await asyncio.sleep(delay)
            if self.stopping:
                return
            await self._spawn(child)

    def signal(self, label: str, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to one child (tests use SIGKILL for a real crash); returns its pid."""
        child = self.child(label)
        assert child.process is not None
        child.process.send_signal(sig)
        return child.process.pid

    async def wait_restarted(self, label: str, pid: int, timeout: float = 30.0) -> None:
        child = self.child(label)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.process is not None and child.process.pid != pid and child.ready.is_set():
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{label} was not restarted within {timeout:.0f}s")

    async def stop(self) -> None:
        self.stopping = True
        alive = [c.process for c in self.children if c.process and c.process.returncode is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if alive:
            await asyncio.wait([asyncio.create_task(p.wait()) for p in alive], timeout=self.grace + 5)
            for process in alive:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        # A child a watcher was restarting as stop() began was not in `alive`; it must not
        # outlive the supervisor.
        for child in self.children:
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                await child.process.wait()
        for child in self.children:
            if child.pump is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(child.pump, 2)
