"""``python -m hutch_sandbox``: serve the sandbox until interrupted (see ``runner.run_forever``)."""

from __future__ import annotations

import argparse

from hutch_sandbox.config import ConfigError
from hutch_sandbox.runner import run_forever


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hutch_sandbox",
        description="Serve the Hutch sandbox (fake sites and proxies on loopback) until stopped.",
    )
    parser.add_argument("--config", help="sandbox YAML (default: the bundled default.yaml)")
    parser.add_argument("--urls-out", help="write every page URL here, one a line")
    parser.add_argument("--proxies-out", help="write the proxy file here: 'URL tier' a line")
    parser.add_argument("--access-log", help="append every request here as JSONL")
    parser.add_argument("--ready-file", help="write a JSON description here once serving")
    args = parser.parse_args(argv)
    try:
        run_forever(args.config, args.urls_out, args.proxies_out, args.access_log, args.ready_file)
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")


if __name__ == "__main__":
    main()
