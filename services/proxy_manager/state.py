"""The proxy-manager's memory across restarts: bans, dead proxies, health and learned tiers.

A restarted manager that forgot which domains need residential proxies would send the next
requests through datacenter ones and collect the blocks that taught it the first time; one
that forgot its bans would hand banned proxies straight back to the sites that banned them.
So the state is written to a small JSON file under `HUTCH_DATA_DIR`, atomically (a
temporary file in the same folder, flushed to disk, then renamed over the old one), shortly
after every change, and read back at start. Only proxy ids and domains are written, never a
proxy URL. In-flight details (the rate cap's spacing, a tier trial in progress) are not kept:
they last seconds.

The file is on the manager's own disk, which a pod re-created on another node, or a standby
there, does not have. So the active manager also appends its snapshot to a stream on the
broker (`<namespace>.v3.proxy-state`, every `STREAM_EVERY` seconds at most while it changes,
and at stop), and a manager reads the newest one there at start, before the file, and again
beside its first leases (a standby becoming active). A manager publishes only after that
second read, so a standby never writes its own state over the active one's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from hutch.admin import read_stream
from hutch.amqp import Broker
from hutch.models import Model
from hutch.services.proxy_manager.leases import Selector

log = logging.getLogger(__name__)

VERSION = 1
FILENAME = "proxy-manager.json"


def snapshot(selector: Selector) -> dict[str, Any]:
    now = selector.clock()
    return {
        "v": VERSION,
        "saved_at": now,
        "health": selector.health.snapshot(now),
        "tiers": selector.tiers.snapshot(),
    }


def restore(selector: Selector, data: dict[str, Any]) -> None:
    if data.get("v") != VERSION:
        log.warning("proxy-manager state of version %r ignored", data.get("v"))
        return
    selector.health.restore(data.get("health") or {})
    selector.tiers.restore(data.get("tiers") or [])


class Snapshot(Model):
    """A manager's state as it travels on the stream."""

    v: Literal[1] = 1
    saved_at: float
    health: dict[str, Any]
    tiers: list[Any]


async def publish(broker: Broker, data: dict[str, Any]) -> None:
    await broker.publish("", broker.topology.proxy_state, Snapshot.model_validate(data))


async def newest(broker: Broker, idle: float = 0.5) -> dict[str, Any] | None:
    """The newest snapshot on the stream (read from its last chunk), or None."""
    try:
        found = await read_stream(broker, broker.topology.proxy_state, Snapshot, "last", idle, prefetch=100)
    except Exception as exc:  # no stream yet, or the broker went: the file is next
        log.warning("proxy-manager state not read from the broker: %s", type(exc).__name__)
        return None
    if not found:
        return None
    return max(found, key=lambda snapshot: snapshot.saved_at).model_dump()


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none or it cannot be read (a fresh start)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("proxy-manager state %s unreadable (%s); starting afresh", path, type(exc).__name__)
        return None
    return data if isinstance(data, dict) else None


def load_into(selector: Selector, path: Path) -> bool:
    data = read(path)
    if data is None:
        return False
    restore(selector, data)
    return True
