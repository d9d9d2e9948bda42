"""One HTTP request with every limit a fleet needs: timeouts, a total deadline, a body cap.

httpx's connect and read timeouts bound each step, but a site that trickles one byte per
second never trips a read timeout; the total deadline (`asyncio.timeout`) bounds the whole
fetch so no site can hold a fetch slot. The body cap counts decoded bytes while streaming,
so a compressed bomb or an endless body is cut off early. Redirects are not followed here:
each hop is a request to a site and goes back through the governor as a new attempt (see
policy.py). Every failure becomes a `FetchResult` whose outcome is a key of
`policy.DEFAULT_RULES`; nothing here raises.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from hutch.services.fetcher.guard import ForbiddenTarget, GuardedBackend, ResolveError, TargetGuard
from hutch.services.fetcher.policy import FetchResult, Policy, outcome_of_status

# Proxy-Status error types (RFC 9209) that blame the destination, not the proxy.
DESTINATION_ERRORS = (
    "destination_unavailable",
    "destination_not_found",
    "destination_ip_prohibited",
    "destination_ip_unroutable",
    "connection_refused",
    "connection_terminated",
    "connection_timeout",
    "dns_error",
    "dns_timeout",
)


class BodyTooLarge(Exception):
    pass


LOCATION = "hutch.location"  # where a redirect's raw Location waits for the URL validator


async def _hold_location(response: httpx.Response) -> None:
    """Move a redirect's Location out of httpx's reach, into the response's extensions.

    Even with redirects off, httpx parses a redirect target itself (for `next_request`) and
    raises on a malformed one (an IDNA error, a control character) before the response is
    handed back, so the task never learnt why. Hutch checks every hop with its own URL
    validator instead (see hutch.urls), which needs the header as the site sent it.
    """
    location = response.headers.get("location")
    if location is not None:
        response.extensions[LOCATION] = location
        del response.headers["location"]


def make_client(
    *,
    proxy: str | None,
    guard: TargetGuard,
    user_agent: str,
    connect_timeout: float,
    read_timeout: float,
    max_connections: int = 100,
) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=20)
    transport = httpx.AsyncHTTPTransport(proxy=proxy, limits=limits, trust_env=False)
    if proxy is None:
        # Direct connections go only to addresses the guard checked (no DNS rebinding).
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(guard),
        )
    return httpx.AsyncClient(
        transport=transport,
        headers={"User-Agent": user_agent},
        timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout),
        follow_redirects=False,
        event_hooks={"response": [_hold_location]},
        trust_env=False,  # never pick up HTTP_PROXY and friends behind the proxy-manager's back
    )


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - now)


def _proxy_error(response: httpx.Response) -> str | None:
    """The proxy's own error, when the response came from the proxy and not the site."""
    if response.status_code == 407:
        return "proxy authentication required"
    status = response.headers.get("proxy-status", "")
    if "error=" not in status or response.status_code < 400:
        return None
    error = status.split("error=", 1)[1].split(";")[0].strip()
    if error in DESTINATION_ERRORS:
        return None
    return f"proxy error {error} (HTTP {response.status_code})"


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    domain: str,
    guard: TargetGuard,
    proxied: bool,
    policy: Policy,
    total_timeout: float,
    max_body_bytes: int,
) -> FetchResult:
    started = time.monotonic()

    def elapsed() -> float:
        return time.monotonic() - started

    try:
        async with asyncio.timeout(total_timeout):
            if proxied:
                parts = urlsplit(url)
                await guard.check(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
            async with client.stream("GET", url) as response:
                status = response.status_code
                if proxied and (error := _proxy_error(response)):
                    return FetchResult("proxy_failure", elapsed(), status=status, detail=error)
                outcome = outcome_of_status(status)
                location = None
                if outcome == "redirect":
                    target = response.extensions.get(LOCATION)
                    if not target:
                        return FetchResult("client_error", elapsed(), status=status, detail="redirect without Location")
                    try:
                        location = urljoin(url, target)
                    except ValueError:  # unparseable: the fetcher's URL validator says why
                        location = target
                    return FetchResult("redirect", elapsed(), status=status, location=location, detail=f"-> {location}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_body_bytes:
                        raise BodyTooLarge(f"body over {max_body_bytes} bytes")
                    chunks.append(chunk)
                body = b"".join(chunks)
                if outcome in ("ok", "blocked") and policy.is_block(domain, status, body):
                    outcome = "blocked"
                return FetchResult(
                    outcome=outcome,
                    elapsed=elapsed(),
                    status=status,
                    final_url=str(response.url),
                    content_type=response.headers.get("content-type"),
                    body=body,
                    retry_after=parse_retry_after(response.headers.get("retry-after"), time.time()),
                    detail="block page" if outcome == "blocked" and status < 300 else (
                        "" if status < 300 else f"HTTP {status}"
                    ),
                )
    except ForbiddenTarget as exc:
        return FetchResult("forbidden_target", elapsed(), detail=str(exc))
    except ResolveError as exc:
        return FetchResult("reset", elapsed(), detail=str(exc))
    except BodyTooLarge as exc:
        return FetchResult("too_large", elapsed(), detail=str(exc))
    except TimeoutError:
        return FetchResult("timeout", elapsed(), detail=f"no complete answer within {total_timeout}s")
    except httpx.ProxyError as exc:
        return FetchResult("proxy_failure", elapsed(), detail=f"proxy: {type(exc).__name__}")
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        if proxied:  # the connection goes to the proxy: it is the proxy that did not answer
            return FetchResult("proxy_failure", elapsed(), detail=f"proxy unreachable: {type(exc).__name__}")
        outcome = "timeout" if isinstance(exc, httpx.ConnectTimeout) else "reset"
        return FetchResult(outcome, elapsed(), detail=f"{type(exc).__name__}: {exc}".rstrip(": "))
    except httpx.TimeoutException as exc:
        return FetchResult("timeout", elapsed(), detail=type(exc).__name__)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        return FetchResult("invalid_url", elapsed(), detail=str(exc))
    except (httpx.TransportError, httpx.DecodingError) as exc:
        return FetchResult("reset", elapsed(), detail=f"{type(exc).__name__}: {exc}".rstrip(": "))
