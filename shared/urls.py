"""The one URL validator: what Hutch agrees to fetch, in the exact form it fetches it.

Every URL from outside goes through `check_url` before it becomes work: each line of a URL
file (`hutch submit`) and each redirect target (the fetcher). A malformed host that slipped
through used to reach the resolver, which raised where nothing expected it, and the task
went round for ever; a host too long for a queue name broke the governor. So the rules are
checked here, once, on bounded input:

- `http` or `https` only; at most `max_bytes` bytes (UTF-8), before and after normalising;
- no control characters (C0, DEL, C1) and no white space anywhere;
- no credentials (`user:pass@`): they would be stored, shown and sent with every request,
  and `http://trusted.example@evil.example/` is a classic disguise;
- a host: an IPv4 dotted quad, a bracketed IPv6 literal (no zone), or a domain name that is
  valid IDNA 2008 after UTS 46 mapping (`idna.encode(host, uts46=True)`): labels of 1-63
  bytes, at most 253 bytes in all, no empty label, no bare `xn--`. A name whose last label is
  a number (`2130706433`, `1.2.3`) is refused: resolvers read it as an IPv4 address;
- a port, when given, of 1-65535.

The host is normalised (UTS 46 mapping, then A-labels, lower case, one trailing dot dropped)
and the URL rebuilt with it and without a default port. Callers fetch exactly that URL:
httpx 0.28 encodes non-ASCII hosts with `idna.encode` and no mapping, so fetching the
original could send another name than the one checked; an ASCII host it only lower-cases.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import idna

DEFAULT_PORTS = {"http": 80, "https": 443}
DEFAULT_MAX_URL_BYTES = 8192
MAX_HOST_BYTES = 253
MAX_LABEL_BYTES = 63

Why = Literal["too_long", "characters", "syntax", "scheme", "credentials", "host", "port"]

# C0 controls, space, DEL and C1 controls; other white space is caught by str.isspace.
_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f]")
_DOTTED_QUAD = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
# Lower-case ASCII letter-digit-hyphen labels, none with `--` in 3rd and 4th place (so no
# `xn--`), an optional trailing dot: valid IDNA 2008 as they are, so idna need not see them.
_LDH = r"(?!..--)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_PLAIN_HOST = re.compile(rf"{_LDH}(?:\.{_LDH})*\.?")


class InvalidURL(ValueError):
    """A URL Hutch will not fetch; `why` says which rule it broke, the message says how."""

    def __init__(self, why: Why, message: str) -> None:
        super().__init__(message)
        self.why = why


@dataclass(frozen=True)
class CheckedURL:
    """A URL that passed: the form to fetch and store, and its domain key."""

    url: str
    domain: str


def _shown(text: str, limit: int = 120) -> str:
    """The URL as quoted in an error: repr (so controls are escaped) and cut short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_url(text: str, max_bytes: int = DEFAULT_MAX_URL_BYTES) -> CheckedURL:
    """The normalised URL and domain key of `text`; raises InvalidURL with the rule it broke."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InvalidURL("too_long", f"URL is {size} bytes, over the limit of {max_bytes}: {_shown(text)}")
    if _CONTROL.search(text) or any(ch.isspace() for ch in text):
        raise InvalidURL("characters", f"URL contains a control character or white space: {_shown(text)}")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise InvalidURL("syntax", f"malformed URL {_shown(text)}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL("scheme", f"not an http or https URL: {_shown(text)}")
    if text[len(parts.scheme) : len(parts.scheme) + 3] != "://":
        raise InvalidURL("syntax", f"not an absolute URL (scheme://host/...): {_shown(text)}")
    netloc = parts.netloc
    if "@" in netloc:
        raise InvalidURL("credentials", f"URL carries credentials (user@host), which Hutch refuses: {_shown(text)}")
    host, port = _split_netloc(netloc, text)
    if port is not None and port == DEFAULT_PORTS[scheme]:
        port = None
    shown_host = f"[{host}]" if ":" in host else host
    domain = shown_host if port is None else f"{shown_host}:{port}"
    # Path, query and fragment exactly as given (urlunsplit would drop an empty `?` or `#`).
    rest = text[len(parts.scheme) + 3 + len(netloc) :]
    url = f"{scheme}://{domain}{rest}"
    size = len(url.encode("utf-8"))
    if size > max_bytes:
        raise InvalidURL("too_long", f"URL is {size} bytes once its host is encoded, over {max_bytes}: {_shown(text)}")
    return CheckedURL(url=url, domain=domain)


def _split_netloc(netloc: str, text: str) -> tuple[str, int | None]:
    """(normalised host, port or None) of an `host[:port]` without credentials."""
    if netloc.startswith("["):
        literal, bracket, rest = netloc[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidURL("host", f"malformed IPv6 literal in {_shown(text)}")
        try:
            address = ipaddress.IPv6Address(literal)
        except ValueError:
            raise InvalidURL("host", f"not an IPv6 address: [{literal}] in {_shown(text)}") from None
        if address.scope_id:
            raise InvalidURL("host", f"an IPv6 zone is not a fetch target: {_shown(text)}")
        return address.compressed, _port(rest[1:] if rest else None, text)
    host, colon, port_text = netloc.rpartition(":")
    if not colon:
        host, port_text = netloc, ""
    return _host(host, text), _port(port_text if colon else None, text)


def _port(text: str | None, url: str) -> int | None:
    if text is None or text == "":
        return None  # `http://host:/` means the default port
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise InvalidURL("port", f"port {text[:20]!r} is not a number from 1 to 65535: {_shown(url)}")
    return int(text)


def _host(host: str, url: str) -> str:
    try:
        return _normalised_host(host)
    except _BadHost as exc:
        raise InvalidURL("host", f"{exc}: {_shown(url)}") from None


class _BadHost(ValueError):
    pass


@functools.lru_cache(maxsize=4096)  # a job's URLs share few hosts; IDNA checks cost ~40 us
def _normalised_host(host: str) -> str:
    if not host:
        raise _BadHost("URL has no host")
    if _DOTTED_QUAD.match(host):
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise _BadHost(f"not an IPv4 address: {host[:60]!r}") from None
    lowered = host.lower()
    if _PLAIN_HOST.fullmatch(lowered) and len(lowered) <= MAX_HOST_BYTES:
        encoded = lowered  # what idna returns for these; it is skipped only because it is slow
    else:
        try:
            encoded = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise _BadHost(f"host is not a valid domain name ({str(exc)[:120]})") from None
    encoded = encoded.removesuffix(".")
    labels = encoded.split(".")
    # idna checks these already; said again here because queue names and resolvers rely on them.
    if len(encoded) > MAX_HOST_BYTES or any(not 1 <= len(label) <= MAX_LABEL_BYTES for label in labels):
        raise _BadHost("host is not a valid domain name (length)")
    if _NUMERIC_LABEL.match(labels[-1]):
        if _DOTTED_QUAD.match(encoded):  # a full-width or otherwise mapped IPv4 address
            return _normalised_host(encoded)
        raise _BadHost("host ends in a number but is not an IPv4 address")
    return encoded


def canonical_url(checked: str) -> str:
    """The form by which a crawl admits a URL once per job, for a URL `check_url` returned.

    `check_url` has already lower-cased the scheme and host and dropped a default port; this
    adds `w3lib.url.canonicalize_url` (Scrapy's): the fragment dropped, the query's arguments
    sorted, percent-escapes made upper-case and applied where the path needs them, `.` and `..`
    segments resolved. So `HTTP://Site:80/a/../b?y=2&x=1#top` and `http://site/b?x=1&y=2` are one
    page. The URL fetched stays the one first found; only the task's id comes from this form.
    """
    from w3lib.url import canonicalize_url  # a parsel dependency; imported where crawls need it

    return canonicalize_url(checked, keep_fragments=False)
