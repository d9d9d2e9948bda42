"""A RabbitMQ node of the test's own, to restart, kill or wipe without touching anyone else.

Chaos and cluster tests must stop brokers; the machine's shared broker (5672) serves every
other test and must never be stopped or reconfigured. `BrokerNode` runs a separate node from
the same RabbitMQ install, with nothing in common with the shared one but the binaries and epmd:

- its own node name (`hutch-test-<pid>-<n>@localhost`), and `-n <node>` on every CLI call;
- its own config file, written here, with an AMQP listener on a free loopback port. The
  machine's /etc/rabbitmq config pins 5672, so the node is pointed at ours explicitly
  (`RABBITMQ_CONFIG_FILE`) and at an env file of ours (`RABBITMQ_CONF_ENV_FILE`: the machine's
  sets `NODENAME=rabbit@localhost`);
- its own distribution port, data (mnesia), log, feature-flags and enabled-plugins files (no
  plugin), all in one temporary folder owned by the `rabbitmq` user;
- an Erlang cookie in a `home` folder: by default a fresh random one in the node's folder, so
  the CLI cannot even authenticate to the shared node. Nodes meant to cluster must share one
  cookie: create it once with `cookie_home(folder)` and pass `home=` to every node.

When the tests run as root, the node and the CLI run as the `rabbitmq` user (as
`rabbitmq-server`'s own wrapper does through `su`); otherwise as the current user.

    node = BrokerNode()            # picks free ports, writes the folder
    node.start()                   # ~5-10 s on 2 cores; waits until AMQP answers
    node.url                       # "amqp://guest:guest@127.0.0.1:<port>/"
    node.stop()                    # graceful (SIGTERM to the VM), data kept
    node.start()                   # same port, same data: durable queues and messages back
    node.restart()                 # stop() then start()
    node.kill()                    # SIGKILL to the VM: a crash; start() recovers the data
    node.wipe()                    # stop, delete the data, start: definitions lost, same port
    node.stop_app() / start_app()  # rabbitmqctl stop_app / start_app: VM up, broker down
    node.ctl("list_queues", "name")  # any rabbitmqctl command, with -n
    node.cleanup()                 # kill it and remove the folder (idempotent)

Every method blocks (subprocesses and sleeps); from async code call it with
`await asyncio.to_thread(node.restart)` so the event loop (the sandbox, a TCP proxy) keeps
running. `start()` waits for the AMQP handshake on the node's port rather than polling
`rabbitmq-diagnostics check_running`: each CLI call starts an Erlang VM (~2 s of CPU), while
the listener opens in the last boot step, once queues are recovered.

For a cluster, create the nodes with one `home`, start them, then on each joiner run
`node.ctl("stop_app")`, `node.ctl("join_cluster", first.nodename)`, `node.ctl("start_app")`;
`extra_config` adds lines to the config file (e.g. `cluster_formation...` keys);
`advanced_config` is the text of its advanced.config (Erlang terms, e.g. the file that
deploy/rabbitmq/ ships).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SBIN = Path("/usr/lib/rabbitmq/bin")
USER = "rabbitmq"
_counter = itertools.count(1)


def available() -> str | None:
    """Why a node cannot be started here, or None if it can."""
    if not (SBIN / "rabbitmq-server").exists():
        return f"no RabbitMQ install at {SBIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            return f"running as root and no {USER!r} user to run the node as"
    return None


def free_port() -> int:
    """A loopback TCP port free right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _owner() -> tuple[int, int] | None:
    """The uid/gid to run the node as (the rabbitmq user when we are root), or None for us."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def _chown(path: Path) -> None:
    owner = _owner()
    if owner is not None:
        os.chown(path, *owner)


def cookie_home(folder: Path) -> Path:
    """Make `folder` a HOME holding a fresh random Erlang cookie; nodes sharing it can cluster."""
    folder.mkdir(parents=True, exist_ok=True)
    _chown(folder)
    cookie = folder / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(20).upper())
    cookie.chmod(0o400)  # Erlang refuses a cookie others can read
    _chown(cookie)
    return folder


class NodeError(Exception):
    """The node did not start, stop or answer in time; the message ends with its log's tail."""


class BrokerNode:
    def __init__(
        self,
        *,
        name: str | None = None,
        home: Path | None = None,
        port: int | None = None,
        dist_port: int | None = None,
        extra_config: str = "",
        advanced_config: str = "",
        parent: Path | None = None,
    ) -> None:
        self.nodename = f"{name or f'hutch-test-{os.getpid()}-{next(_counter)}'}@localhost"
        self.folder = Path(tempfile.mkdtemp(prefix="hutch-node-", dir=parent))
        _chown(self.folder)
        self.folder.chmod(0o755)
        self.home = home or cookie_home(self.folder / "home")
        self.port = port or free_port()
        self.dist_port = dist_port or free_port()
        self.extra_config = extra_config
        self.advanced_config = advanced_config
        self.process: subprocess.Popen[bytes] | None = None
        self._write_files()

    # -- files and environment ----------------------------------------------------

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def data_dir(self) -> Path:
        return self.folder / "mnesia"

    @property
    def log_file(self) -> Path:
        return self.folder / "log" / f"{self.nodename}.log"

    @property
    def pid_file(self) -> Path:
        return self.folder / "beam.pid"  # outside the data folder, which wipe() deletes

    def _write_files(self) -> None:
        files = {
            "rabbitmq.conf": "\n".join(
                [
                    f"listeners.tcp.default = 127.0.0.1:{self.port}",
                    # /tmp may be small on a test machine; a disk alarm would block publishers.
                    "disk_free_limit.absolute = 1MB",
                    "log.console = false",
                    "log.file.level = info",
                    self.extra_config,
                ]
            )
            + "\n",
            # Our env file instead of /etc/rabbitmq's (which names the shared node).
            "rabbitmq-env.conf": "ERL_EPMD_ADDRESS=127.0.0.1\n",
            "enabled_plugins": "[].\n",
            # Erlang terms for what rabbitmq.conf cannot say; an empty list when none.
            "advanced.config": self.advanced_config or "[].\n",
        }
        for name, text in files.items():
            path = self.folder / name
            path.write_text(text)
            _chown(path)

    def _env(self) -> dict[str, str]:
        f = self.folder
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self.home),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_CONF_ENV_FILE": str(f / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(f / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(f / "advanced.config"),
            "RABBITMQ_MNESIA_BASE": str(self.data_dir),
            "RABBITMQ_LOG_BASE": str(f / "log"),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.data_dir / "feature_flags"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(f / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(f / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _run_as(self) -> dict[str, Any]:
        owner = _owner()
        return {} if owner is None else {"user": owner[0], "group": owner[1], "extra_groups": []}

    # -- lifecycle ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Start the node (data kept from any earlier run) and wait until AMQP answers."""
        if self.running:
            return
        self.pid_file.unlink(missing_ok=True)
        with (self.folder / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                [str(SBIN / "rabbitmq-server")],
                cwd=self.folder,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C on pytest must not reach the node first
                **self._run_as(),
            )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the node's listener completes an AMQP protocol handshake."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise NodeError(f"{self.nodename} exited with {self.process.returncode}{self._tail()}")
            if self._answers():
                return
            time.sleep(0.2)
        raise NodeError(f"{self.nodename} not ready after {timeout:.0f}s{self._tail()}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.settimeout(2)
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                frame = sock.recv(7)
        except OSError:
            return False
        return len(frame) == 7 and frame[0] == 1  # a method frame: connection.start

    def beam_pid(self) -> int | None:
        """The Erlang VM's pid (the `rabbitmq-server` script is its parent, not the VM).

        Only a live process that carries this node's name in its environment: a pid file left
        by a VM that died must never lead to signalling whatever process got its pid since.
        """
        try:
            pid = int(self.pid_file.read_text().strip())
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        mine = f"RABBITMQ_NODENAME={self.nodename}".encode()
        return pid if mine in environ and _alive(pid) else None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully: SIGTERM makes the VM stop RabbitMQ in order (as `rabbitmqctl stop`)."""
        if not self.running:
            return
        pid = self.beam_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        else:
            self.ctl("stop", timeout=timeout)
        self._wait_exit(timeout)

    def kill(self) -> None:
        """SIGKILL the VM: connections drop without a close, nothing is flushed."""
        pid = self.beam_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._kill_script()
        self._wait_exit(15.0)

    def _wait_exit(self, timeout: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_script()
            self.process.wait(10)
        # The script exits when the VM does; make sure the VM is really gone (the port freed).
        pid = self.beam_pid()
        deadline = time.monotonic() + 10
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.process = None

    def _kill_script(self) -> None:
        # Its process group is ours while the script is not reaped (poll() is None): the
        # script, and the VM unless it left the group.
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop gracefully and start again on the same port with the same data."""
        self.stop()
        self.start(timeout)

    def wipe(self, timeout: float = 60.0) -> None:
        """Restart with every definition and message lost: a fresh data folder, same port."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start(timeout)

    def stop_app(self) -> None:
        """Stop RabbitMQ inside a running VM: connections refused until `start_app()`."""
        self.ctl("stop_app")

    def start_app(self, timeout: float = 60.0) -> None:
        self.ctl("start_app", timeout=timeout)
        self.wait_ready(timeout)

    def ctl(self, *args: str, tool: str = "rabbitmqctl", timeout: float = 60.0) -> str:
        """Run a RabbitMQ CLI tool against this node (`-n` always) and return its output."""
        done: subprocess.CompletedProcess[str] = subprocess.run(
            [str(SBIN / tool), "-q", "-n", self.nodename, *args],
            cwd=self.folder,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **self._run_as(),
        )
        if done.returncode != 0:
            raise NodeError(f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def cleanup(self) -> None:
        """Kill the node if it runs and delete its folder; safe to call twice."""
        with contextlib.suppress(Exception):
            self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _tail(self, lines: int = 30) -> str:
        parts = []
        for path in (self.folder / "stdout.log", self.log_file):
            with contextlib.suppress(OSError):
                parts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return ("\n--- " + "\n--- ".join(parts)) if parts else ""

    def __enter__(self) -> BrokerNode:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.cleanup()


def form_cluster(nodes: list[BrokerNode], timeout: float = 90.0) -> None:
    """Start `nodes` (sharing one cookie) together, then join each to the first."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda node: node.start(timeout), nodes))
    for node in nodes[1:]:
        node.ctl("stop_app")
        node.ctl("join_cluster", nodes[0].nodename)
        node.start_app(timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True
