"""What a "domain" is: the key every per-site limit, queue and metric hangs on.

A task's domain is its URL's host, lower-cased and IDNA-encoded, with the port when it is
not the scheme's default, so `http://127.0.0.1:8001/` and `http://127.0.0.1:8002/` are two
domains (each sandbox site on its own loopback port is its own site), while
`https://Example.com:443/a` and `https://example.com/b` are one.
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class InvalidURL(ValueError):
    """A URL Hutch cannot fetch: not http(s), no host, or a malformed port."""


def domain_of(url: str) -> str:
    """The domain key of an absolute http(s) URL; raises InvalidURL otherwise."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"malformed URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL(f"not an http or https URL: {url!r}")
    host = parts.hostname
    if not host:
        raise InvalidURL(f"URL has no host: {url!r}")
    if any(ch.isspace() for ch in url.strip()):
        raise InvalidURL(f"URL contains white space: {url!r}")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise InvalidURL(f"host is not a valid domain name: {url!r}") from None
    if ":" in host:  # an IPv6 literal keeps its brackets so the port stays unambiguous
        host = f"[{host}]"
    if port is not None and port != DEFAULT_PORTS[scheme]:
        return f"{host}:{port}"
    return host


def routing_key(domain: str) -> str:
    """The frontier routing key of a domain (`d.<domain>`)."""
    return f"d.{domain}"


def domain_from_routing_key(key: str) -> str:
    if not key.startswith("d.") or len(key) <= 2:
        raise ValueError(f"not a frontier routing key: {key!r}")
    return key[2:]
