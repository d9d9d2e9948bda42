"""A crawl against a plain URL list of the same pages, side by side, on default settings.

    .venv/bin/python bench/crawl_vs_list.py [--runs 3] [--sites 4] [--pages 500]

The sites are the sandbox's small pages (`bench/speed.py`'s: 20 ms latency, no limit per
domain, one fetcher). Each page `/page/<i>` links to `/page/<i-1>` and to two other earlier
pages; each site's root `/` links to every page. Three jobs, each run `--runs` times on a
fresh vhost, store and sandbox, on a RabbitMQ node of the benchmark's own:

- `list`: every `/page/<i>` URL submitted, with `bench/speed.py`'s spec (no `follow:`);
- `crawl, wide`: only each site's root submitted, with the same fields and a `follow:`
  rule on every anchor (`allow: /page/<n>$`): every page is found at depth 1, and each
  page's own links are then offered again and refused as duplicates;
- `crawl, deep`: only each site's last page submitted, with the same rule on the page's
  links: the pages are found one link at a time down the `<i-1>` chain (and sooner through
  the other links), so the crawl's speed is bounded by how fast a discovered link becomes a
  fetch.

Printed for each: pages/s (URLs finished over the time from submit to the last one
finished), and CPU seconds per 1,000 pages for every process, as `bench/speed.py` prints
them. A crawl's pages include its seeds (a wide crawl also stores each root).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_node import private_node
from governor_common import bench_vhost, use_node
from hutch_sandbox.config import SandboxConfig
from speed import SPEC_YAML, Run, Shape, Sites, report, run_hutch, sites

FOLLOW = """follow:
  - links: "{selector}"
    allow: ['/page/[0-9]+$']
"""


def crawl_spec(selector: str) -> str:
    return SPEC_YAML + FOLLOW.format(selector=selector)


async def run_one(kind: str, shape: Shape, node_pid: int, keep: Path | None) -> Run:
    config = SandboxConfig(host="127.0.0.1", seed=shape.seed, sites=shape.sites)
    per_site = shape.sites[0].pages
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=keep)) if keep else Path(scratch)
        async with Sites(config, work) as box:
            pages = box.urls()
            roots = sorted({page.rsplit("/page/", 1)[0] + "/" for page in pages})
            with bench_vhost("crawl") as url:
                if kind == "list":
                    return await run_hutch(shape, box, url, node_pid, work)
                if kind == "wide":
                    spec = crawl_spec("css:a::attr(href)")
                    return await run_hutch(shape, box, url, node_pid, work, seeds=roots,
                                           spec_yaml=spec, expect=len(pages) + len(roots))
                lasts = [root + f"page/{per_site - 1}" for root in roots]
                spec = crawl_spec("css:ul.links a::attr(href)")
                return await run_hutch(shape, box, url, node_pid, work, seeds=lasts, spec_yaml=spec,
                                       expect=len(pages))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--pages", type=int, default=500, help="pages per site")
    parser.add_argument("--kinds", default="list,wide,deep")
    parser.add_argument("--keep", help="keep each run's folder (logs, store, the sites' access log) under this folder")
    args = parser.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    names = {"list": "URL list", "wide": "crawl, wide (from each root)", "deep": "crawl, deep (from each last page)"}
    if set(kinds) - set(names):
        raise SystemExit(f"unknown kinds: {', '.join(sorted(set(kinds) - set(names)))}; known: {', '.join(names)}")
    with private_node() as node:
        use_node(node.url, node.nodename)
        print(f"broker: a node of its own ({node.nodename}, port {node.port}); "
              f"{args.sites} sites x {args.pages} small pages, 20 ms latency, no limit", flush=True)
        runs: dict[str, list[Run]] = {kind: [] for kind in kinds}
        # Interleaved, so a slow spell on the machine falls on every kind alike.
        for n in range(args.runs):
            for kind in kinds:
                shape = Shape(names[kind], sites(args.sites, args.pages), None)
                run = await run_one(kind, shape, node.beam_pid(), keep)
                print(f"  {names[kind]} run {n + 1}: {run.finished}/{run.pages} in {run.seconds:.1f}s "
                      f"= {run.rate:.1f} pages/s; CPU {sum(run.cpu.values()):.1f}s", flush=True)
                runs[kind].append(run)
        figures = {kind: report(Shape(names[kind], sites(args.sites, args.pages), None), runs[kind]) for kind in kinds}
        if "list" in figures:
            base = float(figures["list"]["pages_per_s"])  # type: ignore[arg-type]
            for kind in kinds:
                if kind != "list":
                    rate = float(figures[kind]["pages_per_s"])  # type: ignore[arg-type]
                    print(f"{names[kind]}: {rate / base:.2f} of the URL list's pages/s")


if __name__ == "__main__":
    asyncio.run(main())
