"""Running the sandbox as its own process, for demos and for e2e tests that start services
separately: it writes the URL list and proxy file the scraper is seeded from, announces
readiness with a JSON file written atomically, and stops cleanly on SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from hutch_sandbox.config import load_config
from hutch_sandbox.sandbox import Sandbox

__all__ = ["run_forever", "wait_for_ready_file", "write_atomically"]


def write_atomically(path: str | Path, text: str) -> None:
    """Write via a temporary file in the same folder and a rename, so readers never see half."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def wait_for_ready_file(path: str | Path, timeout: float = 10.0) -> dict[str, Any]:
    """Block until a sandbox process has written its ready file; its content."""
    deadline = time.monotonic() + timeout
    target = Path(path)
    while True:
        try:
            data: dict[str, Any] = json.loads(target.read_text("utf-8"))
            return data
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no sandbox ready file at {target} after {timeout} s") from None
            time.sleep(0.05)


def run_forever(
    config_path: str | None,
    urls_out: str | None,
    proxies_out: str | None,
    access_log: str | None,
    ready_file: str | None = None,
) -> None:
    """Start the sandbox, write the seed files, serve until SIGINT or SIGTERM, then stop.

    The ready file is removed on a clean stop, so a stale one never announces a dead sandbox.
    """
    asyncio.run(_serve(config_path, urls_out, proxies_out, access_log, ready_file))


async def _serve(
    config_path: str | None,
    urls_out: str | None,
    proxies_out: str | None,
    access_log: str | None,
    ready_file: str | None,
) -> None:
    config = load_config(config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with Sandbox(config, access_log=access_log) as sandbox:
        if urls_out:
            write_atomically(urls_out, "".join(f"{url}\n" for url in sandbox.urls()))
        if proxies_out:
            write_atomically(proxies_out, sandbox.proxy_file_text())
        _announce(sandbox, urls_out, proxies_out)
        if ready_file:
            info = sandbox.ready_info(urls_file=urls_out, proxies_file=proxies_out)
            write_atomically(ready_file, json.dumps(info, indent=2) + "\n")
        try:
            await stop.wait()
        finally:
            if ready_file:
                with contextlib.suppress(OSError):
                    os.unlink(ready_file)
    print("sandbox stopped", flush=True)


def _announce(sandbox: Sandbox, urls_out: str | None, proxies_out: str | None) -> None:
    lines = [f"hutch sandbox running (seed {sandbox.config.seed})"]
    for site in sandbox.sites.values():
        lines.append(f"  site  {site.name:<12} {site.base_url}  ({site.config.pages} pages)")
    for proxy in sandbox.proxies.values():
        lines.append(f"  proxy {proxy.name:<12} {proxy.url}  {proxy.tier} from {proxy.source}")
    if urls_out:
        lines.append(f"  urls    -> {urls_out} ({len(sandbox.urls())} URLs)")
    if proxies_out:
        lines.append(f"  proxies -> {proxies_out}")
    lines.append("stop with Ctrl-C or SIGTERM")
    print("\n".join(lines), flush=True)
