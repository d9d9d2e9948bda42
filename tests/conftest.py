"""Test fixtures: a real RabbitMQ, isolated per test module (a vhost) and per test (a namespace).

The broker is found through `HUTCH_AMQP_URL` (default the local one). When `rabbitmqctl`
can reach it, each test module gets its own vhost, removed after it, so nothing is left on a
broker that outlives the test run; otherwise the namespace alone isolates tests and each
test deletes the queues of its namespace. With no broker reachable, a Docker engine lets
testcontainers start one. Failing all that, broker tests are skipped locally and fail in CI.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from hutch.admin import delete_namespace
from hutch.settings import Settings

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
OWN_VHOST = pytest.StashKey[bool]()


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=2):
            return True
    except OSError:
        return False


def _rabbitmqctl(*args: str) -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)
    return done.returncode == 0


def _with_vhost(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


def quick_reconnect(url: str) -> str:
    """`url` asking aio-pika to retry a lost connection every second rather than every 5 s.

    A test setting, like the short timeouts below: tests that drop the shared broker's
    connections wait for reconnects, and the product's default interval is aio-pika's.
    Not for the chaos tests' own nodes: with 1 s, a job whose broker connections were cut
    (tests/chaos/test_connection_cut.py) stopped progressing once they were restored.
    """
    parts = urlsplit(url)
    if "reconnect_interval=" in parts.query:
        return url
    query = f"{parts.query}&reconnect_interval=1" if parts.query else "reconnect_interval=1"
    return urlunsplit(parts._replace(query=query))


@pytest.fixture(scope="session")
def broker_base() -> Iterator[tuple[str, bool]]:
    """The broker's URL for the whole run, and whether test modules may make vhosts on it."""
    base = os.environ.get("HUTCH_AMQP_URL", DEFAULT_URL)
    container = None
    if not _reachable(base):
        try:
            from testcontainers.rabbitmq import RabbitMqContainer  # type: ignore[import-not-found]

            container = RabbitMqContainer("rabbitmq:3.13-management").start()
            host = container.get_container_host_ip()
            base = f"amqp://guest:guest@{host}:{container.get_exposed_port(5672)}/"
        except Exception as exc:
            message = f"no RabbitMQ reachable at {base} and none could be started ({exc})"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    local = urlsplit(base).hostname in ("127.0.0.1", "localhost", "::1") and container is None
    yield base, local and shutil.which("rabbitmqctl") is not None
    if container is not None:
        container.stop()


@pytest.fixture(scope="module")
def amqp_url(request: pytest.FixtureRequest, broker_base: tuple[str, bool]) -> Iterator[str]:
    """A vhost for each test module, removed after it.

    Per module, not per run: the broker's file handle cache counts handles that idle queues
    keep until their vhost goes, and a whole run's worth on the machine's broker (a limit of
    about 900) left it refusing every new connection. A vhost costs about 1.3 s of rabbitmqctl.
    """
    base, can_make_vhosts = broker_base
    vhost = f"hutch-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    user = urlsplit(base).username or "guest"
    if can_make_vhosts and _rabbitmqctl("add_vhost", vhost):
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        request.config.stash[OWN_VHOST] = True
        yield quick_reconnect(_with_vhost(base, vhost))
        _rabbitmqctl("delete_vhost", vhost)
    else:
        request.config.stash[OWN_VHOST] = False
        yield quick_reconnect(base)


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    return f"t-{name}-{uuid.uuid4().hex[:6]}"


def short_settings(amqp_url: str, namespace: str, data_dir: Path) -> Settings:
    """Settings for tests: short delay tiers and timeouts, on this namespace and store."""
    return Settings(
        amqp_url=amqp_url,
        namespace=namespace,
        data_dir=data_dir,
        retry_delays=(0.2, 0.5, 1.0),
        rate=20.0,
        permit_ttl=10.0,
        max_attempts=3,
        connect_timeout=2.0,
        read_timeout=2.0,
        total_timeout=3.0,
        rpc_timeout=2.0,
        shutdown_grace=3.0,
        publish_timeout=5.0,
        default_pause=1.0,  # a 503 without Retry-After pauses its domain this long
    )


@pytest.fixture
def settings(amqp_url: str, namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """Settings for one test: its own namespace and store, short delay tiers and timeouts.

    Without a vhost of the module's own, the test's namespace is deleted after it.
    """
    settings = short_settings(amqp_url, namespace, tmp_path / "data")
    yield settings
    if not request.config.stash.get(OWN_VHOST, True):
        asyncio.run(delete_namespace(settings))


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment for service processes run with these settings."""
    return {**settings.to_env(os.environ), **extra}
