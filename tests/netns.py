"""Separate hosts on one machine: network namespaces on a bridge, and a PostgreSQL of the test's own.

`Network` makes a bridge in the root namespace with an address of its own (the "gateway",
where the test's broker node, PostgreSQL and sandbox forwarders listen) and, per `host(name)`,
a namespace joined to it by a veth pair, with its own address and loopback. Nothing but the
network is shared between namespaces; a process started with `Host.popen` runs inside one.
`Host.cut()` takes the host's link down (its cable pulled: packets vanish, nothing is reset),
`Host.restore()` brings it back. Every name carries the test's pid, and `close()` deletes
every namespace, link and bridge made.

    net = Network()               # needs root and `ip`; `Network.unavailable()` says why not
    gw = net.gateway              # "10.231.N.1", on the bridge in the root namespace
    host = net.host("fetcher1")   # namespace + veth; host.address "10.231.N.2"
    proc = host.popen([...], env=...)
    host.cut(); host.restore()
    net.close()

`PgCluster` runs a PostgreSQL server of the test's own (initdb into a temporary folder, run as
the `postgres` user) listening on the given address, with trust auth for the bridge's subnet.
The machine's own server (127.0.0.1:5432) is never touched.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Host:
    def __init__(self, network: Network, name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.ns = f"h{network.tag}-{name}"
        self.address = f"{network.prefix}.{index + 1}"
        self.outer = f"v{network.tag}o{index}"  # the bridge's end, in the root namespace
        inner = f"v{network.tag}i{index}"
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", self.ns)
        _ip("link", "set", self.outer, "master", network.bridge, "up")
        _ip("-n", self.ns, "addr", "add", f"{self.address}/24", "dev", inner)
        _ip("-n", self.ns, "link", "set", inner, "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *command], **kwargs)

    def run(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(["ip", "netns", "exec", self.ns, *command], **kwargs)

    def cut(self) -> None:
        _ip("link", "set", self.outer, "down")

    def restore(self) -> None:
        _ip("link", "set", self.outer, "up")

    def close(self) -> None:
        _ip("link", "del", self.outer, check=False)
        _ip("netns", "del", self.ns, check=False)


class Network:
    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.bridge = f"hbr{self.tag}"
        self.prefix = f"10.231.{os.getpid() % 250}"
        self.gateway = f"{self.prefix}.1"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or None."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "no `ip` command (iproute2)"
        probe = f"hutch-probe-{os.getpid()}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot make a network namespace: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return None

    def host(self, name: str) -> Host:
        host = Host(self, name, len(self.hosts) + 1)
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        _ip("link", "del", self.bridge, check=False)


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """A PostgreSQL server of the test's own on `address` (run as the `postgres` user)."""

    def __init__(self, address: str, trusted: str) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not found:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bin = found[-1].parent
        self.address = address
        self.port = _free_port(address)
        self.folder = Path(tempfile.mkdtemp(prefix="hutch-pg-"))
        user = pwd.getpwnam("postgres")
        self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        os.chown(self.folder, user.pw_uid, user.pw_gid)
        self.data = self.folder / "data"
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
            **self._as,
        )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {trusted} trust\n")
        subprocess.run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.folder / "log"),
                "-w",
                "-o",
                f"-c listen_addresses={address} -c port={self.port} -c unix_socket_directories={self.folder}"
                " -c fsync=off",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            **self._as,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/postgres"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            subprocess.run(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
                **self._as,
            )
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_for_mark(log: Path, mark: str, timeout: float, process: subprocess.Popen[Any] | None = None) -> None:
    """Wait until the log file `log` holds `mark` (a service's " ready (broker " line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if mark in text:
            return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{log.name}: exited with {process.returncode}:\n{text[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"{log.name}: no {mark!r} within {timeout:.0f}s:\n{text[-3000:]}")
