"""One HTTP request with every limit a fleet needs: timeouts, a total deadline, a body cap.

httpx's connect and read timeouts bound each step, but a site that trickles one byte per
second never trips a read timeout; the total deadline (`asyncio.timeout`) bounds the whole
fetch so no site can hold a fetch slot. The caller may shorten both per request (the adaptive
timeouts of timeouts.py); a timeout's detail names the wait it ran into. The body is read raw
and its content encodings undone here in bounded steps (decoding.py), so the cap holds on
decoded bytes at every step and a compressed bomb or an endless body is cut off early with
memory bounded; a response head over httpcore's 100 KiB is refused by h11 and ends
`too_large` too.

Through a forward proxy, an answer counts as the proxy's own failure only when the proxy says
so: a `Proxy-Status` whose first member names the leased proxy (by the host or host:port of
its URL) with an error, or a 407 that came with such a `Proxy-Status`; a 407 to a CONNECT
fails the tunnel (`httpx.ProxyError`). A 407 or `Proxy-Status` sent by the site is the site's
answer, whoever carried it. Without a proxy nothing is ever a proxy failure. Redirects are not followed here:
each hop is a request to a site and goes back through the governor as a new attempt (see
policy.py). Every failure becomes a `FetchResult` whose outcome is a key of
`policy.DEFAULT_RULES`; nothing here raises, but for `NotSent`.

The clients keep no cookies (`_NoCookies`): a client serves every job behind its proxy, so a
site's `Set-Cookie` kept there would go out with other jobs' requests. What a request sends
beyond the client's User-Agent and Accept-Encoding is the caller's `headers`: a job's own
headers and cookies (`hutch.request_options`), checked before they were queued.

A caller that must not send late (a permit's moment at the site, see lateness.py) gives
`on_time`: it is asked again at the request's first step on the network (a new
connection's connect, or the request head on a kept-alive one), after whatever the
connection pool or a busy event loop cost, through httpcore's `trace` hook; when it says no,
the request is withdrawn unsent (`NotSent`), so the site never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import http.cookiejar
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urljoin, urlsplit

import certifi
import h11
import httpx

from hutch.models import Outcome
from hutch.services.fetcher.decoding import ACCEPT_ENCODING, BadEncoding, BodyDecoder, BodyTooLarge
from hutch.services.fetcher.guard import ForbiddenTarget, GuardedBackend, ResolveError, TargetGuard
from hutch.services.fetcher.keepalive import ConnectionPool, make_linear
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


@functools.cache
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The certificates a fetch trusts: certifi's bundle (httpx's default), or only `ca_file`
    (HUTCH_CA_FILE). Loaded once per file and shared by every client (a context serves any
    number of connections): loading the bundle takes 30-45 ms, which a fetch made on the way
    to its permit's moment cannot absorb."""
    return ssl.create_default_context(cafile=ca_file or certifi.where())


LOCATION = "hutch.location"  # where a redirect's raw Location waits for the URL validator


class NotSent(Exception):
    """The request was withdrawn before its first byte went out: `on_time` said no."""


def _first_step(on_time: Callable[[], bool]) -> Callable[[str, dict[str, object]], Awaitable[None]]:
    """httpcore's trace hook, asking `on_time` once, at the request's first step on the network:
    the TCP connect of a new connection (to the site, or to the proxy), or the request head on
    a kept-alive one. What comes after (resolving the host, TLS, a tunnel's CONNECT) is the
    network's time, not the pipeline's lateness: asked again there, a site or a proxy a few
    round trips away would have every request on a new connection withdrawn, and withdrawing
    closes the connection, so the next try would be new again, for ever."""
    asked = False

    async def trace(event: str, info: dict[str, object]) -> None:
        nonlocal asked
        if asked or not event.endswith(".started"):
            return
        asked = True
        if not on_time():
            raise NotSent(event)

    return trace


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


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """Keeps no cookie and returns none: a client serves every job that uses its proxy, so a
    site's `Set-Cookie` kept in its jar would go out with other jobs' requests, and what a
    request sends would depend on which fetcher took it. A job's cookies are its spec's alone
    (`hutch.request_options`), sent as a header on each request."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: object) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: object) -> bool:
        return False


SPARE_CONNECTIONS = 20  # the connections a client's pool keeps beyond its requests in flight


def make_client(
    *,
    proxy: str | None,
    guard: TargetGuard,
    user_agent: str,
    connect_timeout: float,
    read_timeout: float,
    concurrency: int = 100,
    ca_file: str | None = None,
) -> httpx.AsyncClient:
    # A connection for every request in flight and SPARE_CONNECTIONS more, any of them
    # allowed to stay idle until its keep-alive time is up: the sites sharing a fetcher take
    # its slots in turns, and a pool of just the slots closed one site's idle connections to
    # open another's (a small-page run of 4 sites opened at least 460 connections for 4,000
    # pages; docs/benchmarks.md, twenty-third round).
    size = concurrency + SPARE_CONNECTIONS
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    context = tls_context(ca_file)
    transport = httpx.AsyncHTTPTransport(proxy=proxy, limits=limits, trust_env=False, verify=context)
    if proxy is None:
        # Direct connections go only to addresses the guard checked (no DNS rebinding).
        transport._pool = ConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(guard),
        )
    else:
        make_linear(transport._pool)
    return httpx.AsyncClient(
        transport=transport,
        headers={"User-Agent": user_agent, "Accept-Encoding": ACCEPT_ENCODING},
        timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout),
        follow_redirects=False,
        cookies=http.cookiejar.CookieJar(policy=_NoCookies()),
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


def proxy_names(proxy_url: str | None) -> frozenset[str]:
    """The names by which the proxy at `proxy_url` may sign its `Proxy-Status`: host, host:port."""
    if not proxy_url:
        return frozenset()
    parts = urlsplit(proxy_url)
    host = (parts.hostname or "").lower()
    if not host:
        return frozenset()
    shown = f"[{host}]" if ":" in host else host
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return frozenset({host, shown, f"{shown}:{port}"})


def first_proxy_status(value: str) -> tuple[str, dict[str, str]]:
    """The first member of a Proxy-Status field (RFC 9209): its name and its parameters."""
    member = value[:4096].split(",", 1)[0]
    name, *params = member.split(";")
    found: dict[str, str] = {}
    for param in params:
        key, _, raw = param.partition("=")
        found[key.strip().lower()] = raw.strip().strip('"')
    return name.strip().strip('"').lower(), found


def proxy_error(status: int, proxy_status: str | None, names: frozenset[str]) -> str | None:
    """The leased proxy's own failure, when the answer says it came from that proxy, else None.

    `names` is empty for a direct fetch: then nothing is a proxy failure."""
    if not names or not proxy_status:
        return None
    name, params = first_proxy_status(proxy_status)
    if name not in names:
        return None  # the site's own Proxy-Status (its CDN, or a hostile page), not our proxy's
    if status == 407:
        return "proxy authentication required"
    error = params.get("error")
    if status < 400 or not error or error in DESTINATION_ERRORS:
        return None
    return f"proxy error {error[:64]} (HTTP {status})"


def _with_read(timeout: httpx.Timeout, read: float | None) -> httpx.Timeout:
    if read is None:
        return timeout
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


def _head_too_large(exc: BaseException) -> bool:
    """Whether h11 refused the response head as too long (httpx wraps it twice)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, h11.RemoteProtocolError) and seen.error_status_hint == 431:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    domain: str,
    guard: TargetGuard,
    proxy: str | None,
    policy: Policy,
    total_timeout: float,
    max_body_bytes: int,
    max_encodings: int = 2,
    read_timeout: float | None = None,
    on_time: Callable[[], bool] | None = None,
    headers: Mapping[str, str] | None = None,
) -> FetchResult:
    """Fetch `url`; `read_timeout`, when given, replaces the client's own for this request;
    `on_time`, when given, may withdraw it unsent (`NotSent`) at its first network step;
    `headers` go with the client's own (a job's, `hutch.request_options`: checked, and
    never put in a result's detail)."""
    started = time.monotonic()
    proxied = proxy is not None
    timeouts = _with_read(client.timeout, read_timeout)

    def elapsed() -> float:
        return time.monotonic() - started

    try:
        async with asyncio.timeout(total_timeout):
            request = client.build_request("GET", url, headers=headers, timeout=timeouts)
            if on_time is not None:
                request.extensions["trace"] = _first_step(on_time)
            # Inside a CONNECT tunnel (https) every answer is the site's: the proxy cannot write there.
            names = proxy_names(proxy) if request.url.scheme == "http" else frozenset()
            if proxied:
                # The host exactly as it goes on the wire (IDNA-encoded by httpx), so the guard
                # checks the name the proxy will resolve. Direct connections are checked by
                # GuardedBackend, which sees the same host.
                wire = request.url
                port = wire.port or (443 if wire.scheme == "https" else 80)
                await guard.check(wire.raw_host.decode("ascii"), port)
            response = await client.send(request, stream=True)
            try:
                return await _answer(response, url, domain, names, policy, max_body_bytes, max_encodings, elapsed)
            finally:
                await response.aclose()
    except FAILURES as exc:
        return _failure(exc, elapsed(), proxied, total_timeout, timeouts.read)


async def _answer(
    response: httpx.Response,
    url: str,
    domain: str,
    names: frozenset[str],
    policy: Policy,
    max_body_bytes: int,
    max_encodings: int,
    elapsed: Callable[[], float],
) -> FetchResult:
    """What an answer from the site (or the proxy) says, its body read within the limits."""
    status = response.status_code
    if error := proxy_error(status, response.headers.get("proxy-status"), names):
        return FetchResult("proxy_failure", elapsed(), status=status, detail=error)
    outcome = outcome_of_status(status)
    if outcome == "redirect":
        target = response.extensions.get(LOCATION)
        if not target:
            return FetchResult("client_error", elapsed(), status=status, detail="redirect without Location")
        try:
            location = urljoin(url, target)
        except ValueError:  # unparseable: the fetcher's URL validator says why
            location = target
        return FetchResult("redirect", elapsed(), status=status, location=location, detail=f"-> {location}")
    decoder = BodyDecoder(response.headers.get("content-encoding"), max_body_bytes, max_encodings)
    async for chunk in response.aiter_raw():
        decoder.feed(chunk)
    body = decoder.body()
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
        detail="block page" if outcome == "blocked" and status < 300 else ("" if status < 300 else f"HTTP {status}"),
    )


# What `fetch` turns into an outcome; anything else is a bug and propagates (the fetcher
# records it as `error`).
async def warm_up(policy: Policy, user_agent: str) -> FetchResult:
    """One request through the same stack as every fetch (guard, connection pool, anyio,
    h11, body decoding), to a listener of this process's own on loopback: the modules and
    code paths a process's first request loads on its way (40 ms on a quiet machine, 60-180
    on a loaded one: a first robots.txt went out that late in `bench/speed.py`) are loaded
    before a permit's moment waits on them. Nothing leaves the process; a failure here only
    costs the first fetch that time. What the request got (outcome `ok` when all went well)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    guard = TargetGuard([f"127.0.0.1:{port}"])
    async with server:
        client = make_client(proxy=None, guard=guard, user_agent=user_agent, connect_timeout=5, read_timeout=5)
        async with client:
            return await fetch(client, f"http://127.0.0.1:{port}/", domain="127.0.0.1", guard=guard, proxy=None,
                               policy=policy, total_timeout=5, max_body_bytes=1024, on_time=lambda: True)


FAILURES = (
    ForbiddenTarget, ResolveError, BodyTooLarge, BadEncoding, TimeoutError,
    httpx.TransportError, httpx.DecodingError, httpx.InvalidURL,
)


def _failure(
    exc: Exception, elapsed: float, proxied: bool, total_timeout: float, read_timeout: float | None
) -> FetchResult:
    """The outcome of a fetch that got no usable answer."""
    if isinstance(exc, ForbiddenTarget):
        return FetchResult("forbidden_target", elapsed, detail=str(exc))
    if isinstance(exc, ResolveError):
        return FetchResult("reset", elapsed, detail=str(exc))
    if isinstance(exc, BodyTooLarge):
        return FetchResult("too_large", elapsed, detail=str(exc))
    if isinstance(exc, BadEncoding):
        return FetchResult("bad_encoding", elapsed, detail=str(exc))
    if isinstance(exc, TimeoutError):
        return FetchResult("timeout", elapsed, detail=f"no complete answer within {total_timeout:g}s")
    return _transport_failure(exc, elapsed, proxied, read_timeout)


def _transport_failure(exc: Exception, elapsed: float, proxied: bool, read_timeout: float | None) -> FetchResult:
    """httpx's errors, most specific first."""
    if isinstance(exc, httpx.ProxyError):
        return FetchResult("proxy_failure", elapsed, detail=f"proxy: {type(exc).__name__}")
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        if proxied:  # the connection goes to the proxy: it is the proxy that did not answer
            return FetchResult("proxy_failure", elapsed, detail=f"proxy unreachable: {type(exc).__name__}")
        outcome: Outcome = "timeout" if isinstance(exc, httpx.ConnectTimeout) else "reset"
        return FetchResult(outcome, elapsed, detail=f"{type(exc).__name__}: {exc}".rstrip(": "))
    if isinstance(exc, httpx.ReadTimeout):
        return FetchResult("timeout", elapsed, detail=f"ReadTimeout: no data for {read_timeout:g}s")
    if isinstance(exc, httpx.TimeoutException):
        return FetchResult("timeout", elapsed, detail=type(exc).__name__)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return FetchResult("invalid_url", elapsed, detail=str(exc))
    if isinstance(exc, httpx.RemoteProtocolError) and _head_too_large(exc):
        return FetchResult("too_large", elapsed, detail="response head over 100 KiB")
    return FetchResult("reset", elapsed, detail=f"{type(exc).__name__}: {exc}".rstrip(": "))
