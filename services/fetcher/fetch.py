"""One HTTP fetch with every limit a fleet needs: timeouts, a total deadline, a body cap.

httpx's connect and read timeouts bound each step, but a site that trickles one byte per
second never trips a read timeout; the total deadline (`asyncio.timeout`) bounds the whole
fetch so no site can hold a fetch slot. The body cap counts decoded bytes while streaming,
so a compressed bomb or an endless body is cut off early. Every failure becomes a
`FetchResult` with an outcome from `policy.RULES`; nothing here raises.
"""

from __future__ import annotations

import asyncio
import email.utils
import time

import httpx
from hutch.services.fetcher.policy import FetchResult, outcome_of_status


class BodyTooLarge(Exception):
    pass


def make_client(
    *,
    proxy: str | None,
    user_agent: str,
    connect_timeout: float,
    read_timeout: float,
    max_redirects: int,
    max_connections: int = 100,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        proxy=proxy,
        headers={"User-Agent": user_agent},
        timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout),
        follow_redirects=True,
        max_redirects=max_redirects,
        trust_env=False,  # never pick up HTTP_PROXY and friends behind the proxy-manager's back
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=20),
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


async def fetch(
    client: httpx.AsyncClient, url: str, *, total_timeout: float, max_body_bytes: int
) -> FetchResult:
    started = time.monotonic()

    def elapsed() -> float:
        return time.monotonic() - started

    try:
        async with asyncio.timeout(total_timeout):
            async with client.stream("GET", url) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_body_bytes:
                        raise BodyTooLarge(f"body over {max_body_bytes} bytes")
                    chunks.append(chunk)
                status = response.status_code
                return FetchResult(
                    outcome=outcome_of_status(status),
                    elapsed=elapsed(),
                    status=status,
                    final_url=str(response.url),
                    content_type=response.headers.get("content-type"),
                    body=b"".join(chunks),
                    retry_after=parse_retry_after(response.headers.get("retry-after"), time.time()),
                    detail="" if status < 300 else f"HTTP {status}",
                )
    except BodyTooLarge as exc:
        return FetchResult("too_large", elapsed(), detail=str(exc))
    except TimeoutError:
        return FetchResult("timeout", elapsed(), detail=f"no complete answer within {total_timeout}s")
    except httpx.TimeoutException as exc:
        return FetchResult("timeout", elapsed(), detail=f"{type(exc).__name__}")
    except httpx.ProxyError as exc:
        return FetchResult("proxy", elapsed(), detail=f"proxy: {exc}")
    except httpx.TooManyRedirects:
        return FetchResult("redirects", elapsed(), detail="too many redirects")
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        return FetchResult("invalid_url", elapsed(), detail=str(exc))
    except (httpx.TransportError, httpx.DecodingError) as exc:
        return FetchResult("connection", elapsed(), detail=f"{type(exc).__name__}: {exc}".rstrip(": "))
