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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With pytest-xdist's `--dist loadfile` (`make test`): each test module runs whole on one
    worker, as there (its module fixtures are made once), and tests/chaos all on one worker, one
    module after another: their RabbitMQ node is started once for the package, and no two of
    them break brokers at the same time. Modules are handed out in collection order, chaos and
    e2e (the long ones) first and the many short unit modules last, to even out the workers'
    ends; xdist's default order (most tests first) left the longest e2e modules, which have
    few tests, to the end on one worker while the other idled. Other modes are xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False

    class ChaosTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "tests/chaos" if module.startswith("tests/chaos/") else module

    return ChaosTogether(config, log)  # type: ignore[arg-type]


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=2):
            return True
    except OSError:
        return False


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


def _erlang(name: str) -> str:
    """`name` as an Erlang binary, for `rabbitmqctl eval`."""
    return '<<"' + name.replace("\\", "\\\\").replace('"', '\\"') + '">>'


class VhostPool:
    """Vhosts made and removed by rabbitmqctl in the background, one module ahead.

    Each rabbitmqctl call starts an Erlang VM: about half a second of CPU, taken from the
    tests running beside it on a machine of two cores, and a second or more of waiting. So a
    module costs one call, `rabbitmqctl eval`, which removes the vhosts of the modules that
    finished since the last call and makes the next module's vhost with its permissions,
    while this module runs. A module waits only when its vhost is not ready yet. Every vhost
    is still used by one module only, and removed as the next module starts (or at the end
    of the run). A broker whose internals differ gets the plain commands, one call each.
    """

    ACTOR = "hutch-tests"  # who made and removed them, in the broker's log

    def __init__(self, user: str) -> None:
        self.user = user
        self.plain = False  # rabbitmqctl eval failed: add_vhost, set_permissions, delete_vhost
        self.making: tuple[str, subprocess.Popen[bytes]] | None = None
        self.finished: list[str] = []  # to remove with the next call

    def _call(self, make: str | None) -> subprocess.Popen[bytes]:
        """Remove the finished vhosts, then make `make` with the user's permissions."""
        remove, self.finished = self.finished, []
        if self.plain:
            script = 'm=$1 u=$2; shift 2; for v in "$@"; do rabbitmqctl delete_vhost "$v"; done'
            if make is not None:
                script += '; rabbitmqctl add_vhost "$m" && rabbitmqctl set_permissions -p "$m" "$u" ".*" ".*" ".*"'
            command = ["sh", "-c", script, "vhosts", make or "", self.user, *remove]
        else:
            actor, every = _erlang(self.ACTOR), _erlang(".*")
            steps = [f"rabbit_vhost:delete({_erlang(vhost)}, {actor})" for vhost in remove]
            if make is not None:
                steps += [
                    f"ok = rabbit_vhost:add({_erlang(make)}, {actor})",
                    f"ok = rabbit_auth_backend_internal:set_permissions("
                    f"{_erlang(self.user)}, {_erlang(make)}, {every}, {every}, {every}, {actor})",
                ]
            command = ["rabbitmqctl", "eval", ", ".join([*steps, "ok."])]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _make_next(self) -> None:
        vhost = f"hutch-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.making = vhost, self._call(vhost)

    def take(self) -> str | None:
        """A vhost of its own for the caller (None if rabbitmqctl failed); the next is begun."""
        while True:
            if self.making is None:
                self._make_next()
            assert self.making is not None
            (vhost, making), self.making = self.making, None
            if making.wait(timeout=120) == 0:
                self._make_next()  # and the finished vhosts removed
                return vhost
            self.finished.append(vhost)  # what was made of it
            if self.plain:
                self._make_next()
                return None
            self.plain = True

    def remove(self, vhost: str) -> None:
        """Remove `vhost` with the next call: the next module's, or the one at the end."""
        self.finished.append(vhost)

    def close(self) -> None:
        if self.making is not None:
            (vhost, making), self.making = self.making, None
            making.wait(timeout=120)
            self.finished.append(vhost)
        if self.finished:
            self._call(None).wait(timeout=120)


@pytest.fixture(scope="session")
def vhost_pool(broker_base: tuple[str, bool]) -> Iterator[VhostPool | None]:
    """The run's vhost maker, when test modules may make vhosts on the broker."""
    base, can_make_vhosts = broker_base
    if not can_make_vhosts:
        yield None
        return
    pool = VhostPool(urlsplit(base).username or "guest")
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def amqp_url(
    request: pytest.FixtureRequest, broker_base: tuple[str, bool], vhost_pool: VhostPool | None
) -> Iterator[str]:
    """A vhost for each test module, removed after it.

    Per module, not per run: the broker's file handle cache counts handles that idle queues
    keep until their vhost goes, and a whole run's worth on the machine's broker (a limit of
    about 900) left it refusing every new connection.
    """
    base, _ = broker_base
    vhost = vhost_pool.take() if vhost_pool is not None else None
    if vhost_pool is not None and vhost is not None:
        request.config.stash[OWN_VHOST] = True
        yield quick_reconnect(_with_vhost(base, vhost))
        vhost_pool.remove(vhost)
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
        # Any free port: tests and their services never collide with each other or with a
        # `hutch up` on the machine (the port bound is logged, and `Service.endpoint` has it).
        governor_metrics_port=0,
        proxy_manager_metrics_port=0,
        parser_metrics_port=0,
        storer_metrics_port=0,
        fetcher_metrics_port=0,
    )


def module_settings(
    amqp_url: str, name: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """The short settings for a module's fixtures shared by its tests, on a namespace and store
    of their own (deleted after, without a vhost of the module's own); each test a job of its own."""
    settings = short_settings(amqp_url, f"t-{name}-{uuid.uuid4().hex[:6]}", tmp_path_factory.mktemp(name) / "data")
    yield settings
    if not request.config.stash.get(OWN_VHOST, True):
        asyncio.run(delete_namespace(settings))


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


# -- PostgreSQL --------------------------------------------------------------------------------

POSTGRES_ADMIN = os.environ.get("HUTCH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_base() -> Iterator[str]:
    """A database of this run's own on the machine's PostgreSQL (`HUTCH_TEST_POSTGRES`, an
    admin URL), dropped after the run. Unreachable: skipped locally, a failure in CI."""
    import psycopg

    name = f"hutch_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        message = f"no PostgreSQL reachable at {POSTGRES_ADMIN} ({str(exc).strip()})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(POSTGRES_ADMIN)._replace(path="/" + name))
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_base: str) -> str:
    """A store URL on a schema of this test's own in the run's database."""
    import psycopg

    schema = f"s_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{postgres_base}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store's location on each backend in turn: an SQLite file, a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'hutch.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))
