"""The whole pipeline over many domains: 10,000 sandbox host names, each at 1 request/s.

    .venv/bin/python bench/frontier_sites.py [--domains 10000] [--pages 2] [--fetchers 2]

One sandbox site answers for every host name under `wide.test` (a wildcard entry in
`HUTCH_RESOLVE` and `HUTCH_ALLOWED_TARGETS`), so each `dNNNNN.wide.test` is a domain of its
own to Hutch: its own rate limit, its own robots.txt. All five services run on default
settings, except the rate (1 request/s per domain; burst 1, the default) and what the
sandbox needs; the job is `--domains` x `--pages` URLs. Counted at
the site, by the Host header of each request, robots.txt included:

- the worst 1-second count: the most requests one host received within any 1 s (sliding),
  against rate + burst = 2;
- pages/s: URLs finished (stored or dead) per second from submit to the end of the job.

The broker is the shared one (a vhost of its own): the frontier's queues do not grow with
the domains, so no node of its own is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from governor_common import bench_vhost, child_env
from hutch_sandbox import Sandbox
from hutch_sandbox.config import SandboxConfig, SiteConfig

from hutch.amqp import Broker
from hutch.models import FieldRule, Spec
from hutch.services.control.submit import submit
from hutch.services.control.supervisor import Supervisor
from hutch.settings import Settings
from hutch.store import AsyncStore, Store

RATE = 1.0
SPEC = Spec(fields={"title": FieldRule(kind="css", expr="title::text")})


async def run(args: argparse.Namespace, log_dir: Path) -> None:
    config = SandboxConfig(
        host="127.0.0.1", seed=7, sites=[SiteConfig(name="wide", pages=args.pages, latency_ms=(10, 40))]
    )
    with bench_vhost("frontier-sites") as url, tempfile.TemporaryDirectory() as tmp:
        settings = Settings(amqp_url=url, namespace="bench", data_dir=Path(tmp) / "data", rate=RATE)
        async with Sandbox(config) as box:
            entries = box.wildcard_entries("wide.test", site="wide")
            site = box.sites["wide"]
            urls = [
                site.host_url(f"d{d:05d}.wide.test", f"/page/{p}")
                for p in range(args.pages)
                for d in range(args.domains)
            ]
            env = child_env(settings, HUTCH_RESOLVE=entries.resolve, HUTCH_ALLOWED_TARGETS=entries.allowed)
            log = (log_dir / "services.log").open("w")
            supervisor = Supervisor(env, fetchers=args.fetchers, out=log, grace=3.0)
            await supervisor.start()
            try:
                await supervisor.wait_ready(60)
                broker = await Broker(settings, "bench-submit").connect()
                store = await AsyncStore(settings.store_location).open()
                started = time.time()
                try:
                    await submit(broker, store, "wide", iter(urls), SPEC)
                finally:
                    await store.close()
                    await broker.close()
                submitted = time.time() - started
                print(f"  submitted {len(urls):,} URLs over {args.domains:,} domains in {submitted:.1f}s", flush=True)
                done = None
                last_print = started
                while time.time() - started < args.limit:
                    reader = Store(settings.store_location)
                    try:
                        (done,) = reader.counts("wide")
                    finally:
                        reader.close()
                    if done.total and done.pending == 0:
                        break
                    if time.time() - last_print > 15:
                        last_print = time.time()
                        finished = done.stored + done.dead
                        print(f"  {time.time() - started:5.0f}s: {finished:,}/{len(urls):,} finished", flush=True)
                    await asyncio.sleep(0.5)
                ended = time.time()
            finally:
                await supervisor.stop()
                log.close()
        assert done is not None
        stats = box.host_stats()
        worst = box.worst_host_second()
        over = sum(1 for s in stats.values() if s.worst_second > RATE + 1)
        finished = done.stored + done.dead
        print(f"domains {args.domains:,} x {args.pages} pages, {args.fetchers} fetcher(s), rate {RATE:g}/s burst 1")
        print(
            f"  finished {finished:,}/{len(urls):,} ({done.stored:,} stored, {done.dead:,} dead)"
            f" in {ended - started:.0f}s"
        )
        print(f"  pages/s (finished / wall time from submit): {finished / (ended - started):.1f}")
        print(f"  hosts seen at the site: {len(stats):,}; requests: {sum(s.total for s in stats.values()):,}")
        if worst is not None:
            print(f"  worst 1-second count at the site for any host: {worst[1]} ({worst[0]}); limit rate + burst = 2")
        print(f"  hosts over the limit in some second: {over}")


def make_folder(path: str | None) -> None:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", type=int, default=10_000)
    parser.add_argument("--pages", type=int, default=2, help="pages per domain")
    parser.add_argument("--fetchers", type=int, default=2)
    parser.add_argument("--limit", type=float, default=1200.0, help="seconds before giving up")
    parser.add_argument("--logs", help="folder for the services' log (default: a temporary one)")
    args = parser.parse_args()
    make_folder(args.logs)
    # SIGTERM (a `timeout`, a Ctrl-C from a supervisor) cancels the run, so the services
    # are stopped and the vhost deleted on the way out instead of left running.
    current = asyncio.current_task()
    assert current is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    if args.logs:
        await run(args, Path(args.logs))
    else:
        with tempfile.TemporaryDirectory() as logs:
            await run(args, Path(logs))


if __name__ == "__main__":
    asyncio.run(main())
