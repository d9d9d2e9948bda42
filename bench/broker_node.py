"""A RabbitMQ node of the benchmarks' own, with room for many file descriptors.

The machine's shared broker (127.0.0.1:5672) serves the tests, runs with a soft limit of
about 1,000 descriptors, and must never be reconfigured or restarted; the large benchmarks
run on a node started here instead, from the same install:

    .venv/bin/python bench/broker_node.py start     # prints the two variables to export
    export BENCH_AMQP_URL=... BENCH_RABBITMQ_NODE=...
    .venv/bin/python bench/frontier_scale.py        # any benchmark: governor_common reads them
    .venv/bin/python bench/broker_node.py stop      # stops the node, deletes its folder

or `--private-node` on `bench/frontier_scale.py`, which starts one and stops it at the end.

The node runs as the `rabbitmq` user (`setpriv`, as root) under `ulimit -n 20000` (this
machine's hard limit), with its own node name, port, distribution port, config, data, logs,
feature flags and plugin list, all in one folder under /tmp. It shares the Erlang cookie of
/var/lib/rabbitmq (its HOME), so `rabbitmqctl -n <node>` reaches it as it reaches the shared
node. Its config pins its own listener: /etc/rabbitmq pins 5672 and names the shared node,
so neither the machine's config file nor its env file is read.

It starts under SCHED_BATCH (`chrt --batch 0`), as `make broker` starts a local broker and as
every service runs by default (`HUTCH_SCHED_POLICY`); `sched="normal"` (speed.py's
`--broker-sched normal`) starts it under the default policy, as a distribution's own unit does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SBIN = Path("/usr/lib/rabbitmq/bin")
STATE = Path(tempfile.gettempdir()) / "hutch-bench-node.json"  # where `start` leaves what `stop` needs
NOFILE = 20000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateNode:
    def __init__(self, folder: Path, nodename: str, port: int, dist_port: int) -> None:
        self.folder = folder
        self.nodename = nodename
        self.port = port
        self.dist_port = dist_port

    @classmethod
    def create(cls) -> PrivateNode:
        folder = Path(tempfile.mkdtemp(prefix="hutch-bench-node-"))
        node = cls(folder, f"hutch-bench-{os.getpid()}@localhost", free_port(), free_port())
        files = {
            "rabbitmq.conf": (
                f"listeners.tcp.default = 127.0.0.1:{node.port}\n"
                "disk_free_limit.absolute = 1GB\n"
                "log.console = false\n"
                "log.file.level = warning\n"
            ),
            "rabbitmq-env.conf": "ERL_EPMD_ADDRESS=127.0.0.1\n",
            "enabled_plugins": "[].\n",
        }
        for name, text in files.items():
            (folder / name).write_text(text)
        folder.chmod(0o755)
        shutil.chown(folder, "rabbitmq", "rabbitmq")
        for path in folder.iterdir():
            shutil.chown(path, "rabbitmq", "rabbitmq")
        return node

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pid_file(self) -> Path:
        return self.folder / "beam.pid"

    def env(self) -> dict[str, str]:
        f = self.folder
        return {
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_CONF_ENV_FILE": str(f / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(f / "rabbitmq.conf"),
            "RABBITMQ_MNESIA_BASE": str(f / "mnesia"),
            "RABBITMQ_LOG_BASE": str(f / "log"),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(f / "feature_flags"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(f / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(f / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self, timeout: float = 90.0, sched: str = "batch") -> None:
        settings = " ".join(shlex.quote(f"{k}={v}") for k, v in self.env().items())
        policy = "chrt --batch 0 " if sched == "batch" and shutil.which("chrt") else ""
        script = (
            f"ulimit -n {NOFILE} && exec {policy}setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "
            f"env HOME=/var/lib/rabbitmq LANG=C.UTF-8 PATH=/usr/bin:/bin {settings} {SBIN}/rabbitmq-server"
        )
        with (self.folder / "stdout.log").open("ab") as out:
            subprocess.Popen(
                ["bash", "-c", script], cwd=self.folder, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._answers():
                return
            time.sleep(0.5)
        raise SystemExit(f"the bench node did not start in {timeout:.0f}s; see {self.folder}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.settimeout(2)
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return sock.recv(1) == b"\x01"  # connection.start: the broker is up
        except OSError:
            return False

    def beam_pid(self) -> int | None:
        """The node's VM, only while it is alive and carries this node's name."""
        try:
            pid = int(self.pid_file.read_text().strip())
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if f"RABBITMQ_NODENAME={self.nodename}".encode() in environ else None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the VM (RabbitMQ stops in order), then delete the folder."""
        pid = self.beam_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.beam_pid() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.beam_pid() is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                time.sleep(1.0)
        shutil.rmtree(self.folder, ignore_errors=True)

    def state(self) -> dict[str, object]:
        return {"folder": str(self.folder), "nodename": self.nodename, "port": self.port, "dist_port": self.dist_port}

    @classmethod
    def from_state(cls, state: dict[str, object]) -> PrivateNode:
        return cls(Path(str(state["folder"])), str(state["nodename"]), int(str(state["port"])),
                   int(str(state["dist_port"])))


@contextlib.contextmanager
def private_node(sched: str = "batch") -> Iterator[PrivateNode]:
    """A node started for the caller and stopped (folder deleted) when it is done."""
    node = PrivateNode.create()
    try:
        node.start(sched=sched)
        yield node
    finally:
        node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop"))
    args = parser.parse_args()
    if args.action == "start":
        if STATE.exists():
            sys.exit(f"a bench node may still run: {STATE} (run `stop` first)")
        node = PrivateNode.create()
        node.start()
        STATE.write_text(json.dumps(node.state()))
        print(f"export BENCH_AMQP_URL={node.url} BENCH_RABBITMQ_NODE={node.nodename}")
    else:
        if not STATE.exists():
            sys.exit("no bench node recorded")
        PrivateNode.from_state(json.loads(STATE.read_text())).stop()
        STATE.unlink()
        print("bench node stopped")


if __name__ == "__main__":
    main()
