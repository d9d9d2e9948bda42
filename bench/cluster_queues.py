"""Quorum queues against classic ones on a three-node cluster: publish rate and permits/s.

    .venv/bin/python bench/cluster_queues.py [--runs 2] [--domains 200] [--per-domain 100]

Starts three RabbitMQ nodes of its own on this machine (the nodes of tests/brokers.py: own
names, ports, data; the cookie of /var/lib/rabbitmq, so `rabbitmqctl -n` reaches them as it
reaches the shared node, which is never touched), joins them into one cluster, then runs
`bench/governor_permits.py` against the first node, classic and quorum in turn (`--runs`
rounds, interleaved), and prints each run's confirmed publish rate (the preload into the
frontier) and permits/s, and the medians side by side. Classic queues live on the node the
services use; quorum queues are replicated to the three, so each write waits for a majority.
The nodes are stopped and deleted at the end.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.brokers import BrokerNode, form_cluster  # noqa: E402

HOME = Path("/var/lib/rabbitmq")  # its .erlang.cookie: the one root's rabbitmqctl uses


def one_run(node: BrokerNode, queue_type: str, args: argparse.Namespace) -> tuple[float, float]:
    env = {"BENCH_AMQP_URL": node.url, "BENCH_RABBITMQ_NODE": node.nodename}
    command = [
        sys.executable, str(ROOT / "bench" / "governor_permits.py"), "--runs", "1", "--no-profile",
        "--domains", str(args.domains), "--per-domain", str(args.per_domain), "--queue-type", queue_type,
    ]  # fmt: skip
    done = subprocess.run(command, env={**_base_env(), **env}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"governor_permits.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    published = re.search(r"\(([\d,]+) published/s", done.stdout)
    permits = re.search(r": ([\d,]+) permits/s,", done.stdout)
    if published is None or permits is None:
        raise SystemExit(f"no figures in:\n{done.stdout[-2000:]}")
    return float(published.group(1).replace(",", "")), float(permits.group(1).replace(",", ""))


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "HUTCH_"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--domains", type=int, default=200)
    parser.add_argument("--per-domain", type=int, default=100)
    args = parser.parse_args()
    advanced = (Path(__file__).resolve().parents[1] / "deploy" / "rabbitmq" / "advanced.config").read_text()
    nodes = [BrokerNode(name=f"hutch-bench-cluster-{i}", home=HOME, advanced_config=advanced) for i in range(3)]
    try:
        form_cluster(nodes, 120)
        print(f"cluster of {len(nodes)} nodes up; the services use {nodes[0].nodename}", flush=True)
        figures: dict[str, list[tuple[float, float]]] = {"classic": [], "quorum": []}
        for round_ in range(args.runs):
            for queue_type in figures:
                published, permits = one_run(nodes[0], queue_type, args)
                figures[queue_type].append((published, permits))
                print(f"  round {round_ + 1}, {queue_type}: {published:,.0f} published/s, {permits:,.0f} permits/s")
        print(f"median of {args.runs} runs ({args.domains} domains x {args.per_domain} tasks):")
        for queue_type, runs in figures.items():
            print(
                f"  {queue_type:<8} {statistics.median(p for p, _ in runs):>8,.0f} published/s (confirmed)   "
                f"{statistics.median(q for _, q in runs):>8,.0f} permits/s"
            )
    finally:
        for node in nodes:
            node.cleanup()


if __name__ == "__main__":
    main()
