"""`make demo`: a real job against the local sandbox, from a fresh clone, in about a minute.

It starts the bundled sandbox (three sites with faults, one that blocks datacenter
addresses, one that bans impolite clients; two datacenter and two residential proxies), writes
its URL list (300 pages plus two that do not exist) and proxy file under `hutch-data/demo/`,
runs every service as a child process in namespace `hutch-demo`, submits the job, shows
progress, and prints the summary and where the items are. Short delay tiers keep the demo's
retries quick; a real job uses the defaults (1 s to 1 h).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from hutch.admin import delete_namespace
from hutch.models import FieldRule, Spec
from hutch.services.control.cli import UserError, run_job, sandbox_package
from hutch.settings import Settings, redact_url

SPEC = Spec(
    fields={
        "title": FieldRule(kind="css", expr="title::text"),
        "price": FieldRule(kind="css", expr="span.price::text"),
        "maker": FieldRule(kind="xpath", expr="//h1/text()"),
    }
)


async def demo(data_dir: Path) -> int:
    folder = data_dir / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    access_log = folder / "access.jsonl"
    # Each demo starts afresh: the sandbox's ports, and so its URLs, differ from run to run.
    for old in (access_log, *folder.glob("hutch.sqlite3*")):
        old.unlink(missing_ok=True)
    package = sandbox_package()
    async with package.Sandbox(package.load_config(None), access_log=access_log) as sandbox:
        urls = [*sandbox.urls(), *(site.base_url + "/status/404" for site in list(sandbox.sites.values())[:2])]
        urls_file = folder / "urls.txt"
        urls_file.write_text("\n".join(urls) + "\n", encoding="utf-8")
        proxies_file = folder / "proxies.txt"
        proxies_file.write_text(sandbox.proxy_file_text(), encoding="utf-8")
        print(f"sandbox: {len(sandbox.sites)} sites, {len(sandbox.proxies)} proxies, {len(urls)} URLs")
        for name, site in sandbox.sites.items():
            print(f"  site  {name:<6} {site.base_url}")
        for name, proxy in sandbox.proxies.items():
            print(f"  proxy {name:<6} {proxy.url} ({proxy.tier}, leaves from {proxy.source})")
        env_settings = Settings()
        settings = env_settings.model_copy(
            update={
                "namespace": os.environ.get("HUTCH_NAMESPACE", "hutch-demo"),
                "data_dir": folder,
                "store_url": None,
                "proxy_file": proxies_file,
                # The SSRF guard refuses loopback targets except the sandbox's own sites.
                "allowed_targets": tuple(sandbox.allowed_targets()),
                "rate": float(os.environ.get("HUTCH_RATE", "8")),
                "retry_delays": (0.5, 1.0, 2.0, 5.0),
            }
        )
        # A fresh namespace too: queues of an earlier demo (other ports, older bindings) go.
        await delete_namespace(settings)
        job = "demo"
        out = folder / "items.jsonl"
        counts = await run_job(settings, urls_file, job, SPEC, fetchers=2, timeout=600, out=out)
    print(f"store: {redact_url(settings.store_location)}")
    print(f"sandbox access log: {access_log}")
    print("first items:")
    with out.open(encoding="utf-8") as handle:
        for _, line in zip(range(3), handle, strict=False):
            print("  " + json.dumps(json.loads(line), ensure_ascii=False))
    print(f"see also: HUTCH_DATA_DIR={folder} hutch status {job}")
    return 0 if counts.pending == 0 else 1


def main() -> None:
    settings = Settings()
    try:
        code = asyncio.run(demo(settings.data_dir))
    except UserError as exc:
        print(f"hutch demo: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)


if __name__ == "__main__":
    main()
