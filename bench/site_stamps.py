"""The sandbox's stamp of each request against the kernel's: where a late request's time went.

`bench/speed.py` counts the worst 1-second window per domain from the sandbox's access log,
which stamps a request once the sandbox's event loop has read its head. A request stamped
late may have left the fetcher late, or reached a sandbox too busy to read it at once. A
packet capture on loopback stamps each request's first segment as the kernel passed it on,
which separates the two:

    tcpdump -i lo -s 300 -w RUN/get.pcap 'tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420' &
    .venv/bin/python bench/speed.py --runs 1 --shapes limited --keep RUN
    .venv/bin/python bench/site_stamps.py RUN/get.pcap RUN/tmp*/access.jsonl

(the filter keeps TCP segments whose payload starts with `GET `). For each run folder's
access log this prints the worst 1-second count per site by each stamp, and how far the
sandbox's stamp came after the kernel's (median, 99th percentile, largest). Requests are
matched by port and path: each page of a run is requested once, robots.txt once per site
(a repeated pair is matched in order).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
from collections import defaultdict
from pathlib import Path

ETHERNET = 14
GET_FILTER = "tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420"  # a TCP payload that starts with "GET "


class Capture:
    """tcpdump on loopback, keeping each GET's first segment, for as long as it runs (root
    and tcpdump needed: `Capture.possible()`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def possible() -> bool:
        return os.geteuid() == 0 and shutil.which("tcpdump") is not None

    def start(self) -> None:
        """Returns once tcpdump listens, so no request of the run is missed."""
        argv = ["tcpdump", "-i", "lo", "-U", "-s", "300", "-w", str(self.path), GET_FILTER]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.process.stderr is not None
        first = self.process.stderr.readline()
        if b"listening" not in first:
            self.stop()
            raise RuntimeError(f"tcpdump did not start: {first.decode(errors='replace').strip()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None


def kernel_stamps(pcap: Path) -> dict[tuple[int, str], list[float]]:
    """(destination port, path) -> the capture's stamps of each GET, in order."""
    data = pcap.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    nano = magic == 0xA1B23C4D
    if magic not in (0xA1B2C3D4, 0xA1B23C4D):
        raise SystemExit(f"{pcap}: not a little-endian pcap file")
    stamps: dict[tuple[int, str], list[float]] = defaultdict(list)
    at = 24
    while at + 16 <= len(data):
        seconds, fraction, caught, _ = struct.unpack("<IIII", data[at:at + 16])
        frame = data[at + 16:at + 16 + caught]
        at += 16 + caught
        ip = frame[ETHERNET:]
        if len(ip) < 20 or ip[0] >> 4 != 4:
            continue
        tcp = ip[(ip[0] & 0x0F) * 4:]
        port = struct.unpack("!H", tcp[2:4])[0]
        payload = tcp[(tcp[12] >> 4) * 4:]
        line = payload.split(b"\r\n", 1)[0].split(b" ")
        if len(line) >= 2 and line[0] == b"GET":
            stamps[(port, line[1].decode("latin-1"))].append(seconds + fraction / (1e9 if nano else 1e6))
    return stamps


def worst_second(times: list[float]) -> int:
    times = sorted(times)
    worst, first = 0, 0
    for last, ts in enumerate(times):
        while times[first] <= ts - 1.0:
            first += 1
        worst = max(worst, last - first + 1)
    return worst


def report(access_log: Path, kernel: dict[tuple[int, str], list[float]]) -> None:
    by_site_kernel: dict[str, list[float]] = defaultdict(list)
    by_site_sandbox: dict[str, list[float]] = defaultdict(list)
    lags: list[float] = []
    taken: dict[tuple[int, str], int] = defaultdict(int)
    unmatched = 0
    for line in access_log.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "site":
            continue
        key = (int(record["port"]), record["path"])
        seen = kernel.get(key, [])
        if taken[key] >= len(seen):
            unmatched += 1
            continue
        stamp = seen[taken[key]]
        taken[key] += 1
        site = record["site"]
        by_site_kernel[site].append(stamp)
        by_site_sandbox[site].append(record["ts"])
        lags.append(record["ts"] - stamp)
    if not lags:
        print(f"{access_log}: no request matched the capture")
        return
    lags.sort()
    print(f"{access_log}: {len(lags)} requests matched, {unmatched} not")
    for site in sorted(by_site_kernel):
        print(f"    {site}: worst 1-second count by the kernel's stamp {worst_second(by_site_kernel[site])}, "
              f"by the sandbox's {worst_second(by_site_sandbox[site])}")
    print(f"    sandbox stamp after the kernel's, ms: median {statistics.median(lags) * 1000:.1f}, "
          f"99th percentile {lags[int(0.99 * (len(lags) - 1))] * 1000:.1f}, largest {lags[-1] * 1000:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pcap", type=Path)
    parser.add_argument("access_logs", type=Path, nargs="+")
    args = parser.parse_args()
    kernel = kernel_stamps(args.pcap)
    for log in args.access_logs:
        report(log, kernel)


if __name__ == "__main__":
    main()
