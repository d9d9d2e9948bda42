"""Probing a dead proxy: one real HTTP request through it, to a configured URL.

A proxy marked dead gets no leases, so no outcome report can ever say it recovered; only a
request sent on purpose can. The probe counts as a success when an answer comes back from
the target through the proxy: a status below 500 that the proxy did not write itself (no
407, no `Proxy-Status` error, RFC 9209). Any failure is reported by its type only, because
httpx's messages can quote the proxy URL, credentials included.
"""

from __future__ import annotations

import httpx

from hutch.services.proxy_manager.pool import Proxy


async def probe(proxy: Proxy, url: str, timeout: float, user_agent: str) -> tuple[bool, str]:
    """(ok, what happened): e.g. (True, "HTTP 200"), (False, "ConnectError")."""
    try:
        async with httpx.AsyncClient(
            proxy=proxy.url,
            timeout=timeout,
            trust_env=False,
            follow_redirects=False,
            headers={"User-Agent": user_agent},
        ) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        return False, type(exc).__name__
    except OSError as exc:
        return False, type(exc).__name__
    status = response.status_code
    proxy_error = "error=" in response.headers.get("proxy-status", "")
    ok = status < 500 and status != 407 and not proxy_error
    return ok, f"HTTP {status}" + (" from the proxy" if proxy_error else "")
