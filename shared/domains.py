"""What a "domain" is: the key every per-site limit, queue and metric hangs on.

A task's domain is its URL's host as the URL validator normalises it (UTS 46 mapping, IDNA
2008 A-labels, lower case; see hutch.urls), with the port when it is not the scheme's
default, so `http://127.0.0.1:8001/` and `http://127.0.0.1:8002/` are two domains (each
sandbox site on its own loopback port is its own site), while `https://Example.com:443/a`
and `https://example.com/b` are one.

A domain also names AMQP objects: its frontier routing key, its queue and its event keys.
AMQP caps each of those at 255 bytes (a short string), and a valid host with a port is up
to 259, so a name that would be longer keeps a readable head and ends in a hash of the
whole (`shortstr`). The mapping is a pure function of the name, so every service derives
the same one; nothing reads a domain back out of a name (messages carry their domain).
"""

from __future__ import annotations

import hashlib

from hutch.urls import InvalidURL, check_url

__all__ = ["MAX_NAME_BYTES", "InvalidURL", "domain_of", "event_key", "routing_key", "shortstr"]

MAX_NAME_BYTES = 255  # AMQP short string: queue names, exchange names, routing keys
HASH_CHARS = 24  # hex digits of SHA-256 kept: 96 bits, no collision among any real set of domains


def domain_of(url: str) -> str:
    """The domain key of a URL the validator accepts; raises InvalidURL otherwise."""
    return check_url(url).domain


def shortstr(name: str) -> str:
    """`name` itself when it fits in an AMQP short string, else a readable head + `~` + a hash."""
    data = name.encode("utf-8")
    if len(data) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(data).hexdigest()[:HASH_CHARS]
    head = data[: MAX_NAME_BYTES - HASH_CHARS - 1].decode("utf-8", "ignore")
    return f"{head}~{digest}"


def routing_key(domain: str) -> str:
    """The frontier routing key of a domain (`d.<domain>`, hashed when too long)."""
    return shortstr(f"d.{domain}")


def event_key(kind: str, domain: str) -> str:
    """The events-exchange key of a domain's event (`outcome.<domain>`, `robots.<domain>`)."""
    return shortstr(f"{kind}.{domain}")
