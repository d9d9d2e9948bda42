"""A local fake internet for Hutch's tests, demos and benchmarks.

Scraping code is only trustworthy once it has met servers that fail: errors, rate limits, resets,
hangs, trickles, blocks of datacenter addresses, bans for impolite clients, bad proxies. Real
sites fail when they like; these fail when told, reproducibly (every random decision derives
from the config's seed), and only on loopback (127.0.0.0/8).

    from hutch_sandbox import Sandbox, load_config, expected_page

    async with Sandbox(load_config(None)) as sb:     # None: the bundled default.yaml
        sb.sites["books"].base_url                   # "http://127.0.0.1:PORT"
        sb.urls()                                    # every /page/<i> URL
        sb.proxy_file_text()                         # "http://127.0.0.1:PORT datacenter\\n..."
        sb.site_log("books")                         # what the site received

The configuration keys are described in ``hutch_sandbox.config``, the fixed trouble paths
(``/hang``, ``/flaky/<key>``, ``/charset/<name>``, ...) in ``hutch_sandbox.site``, the proxies
in ``hutch_sandbox.proxy``. ``python -m hutch_sandbox`` serves a config until interrupted.
"""

from hutch_sandbox.accesslog import AccessRecord
from hutch_sandbox.config import (
    ConfigError,
    FaultConfig,
    ProxyConfig,
    SandboxConfig,
    SiteConfig,
    load_config,
)
from hutch_sandbox.pages import BLOCK_MARKER, CHALLENGE_MARKER, charset_text, expected_page
from hutch_sandbox.runner import run_forever, wait_for_ready_file
from hutch_sandbox.sandbox import Sandbox, WildcardEntries

__all__ = [
    "BLOCK_MARKER",
    "CHALLENGE_MARKER",
    "AccessRecord",
    "ConfigError",
    "FaultConfig",
    "ProxyConfig",
    "Sandbox",
    "SandboxConfig",
    "SiteConfig",
    "WildcardEntries",
    "charset_text",
    "expected_page",
    "load_config",
    "run_forever",
    "wait_for_ready_file",
]
