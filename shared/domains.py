"""What a "domain" is: the key every per-site limit, queue and metric hangs on.

A task's domain is its URL's host as the URL validator normalises it (UTS 46 mapping, IDNA
2008 A-labels, lower case; see hutch.urls), with the port when it is not the scheme's
default, so `http://127.0.0.1:8001/` and `http://127.0.0.1:8002/` are two domains (each
sandbox site on its own loopback port is its own site), while `https://Example.com:443/a`
and `https://example.com/b` are one.

A domain also names AMQP objects (`hutch.topology` builds them): its routing keys and queues.
AMQP caps each of those at 255 bytes (a short string), and a valid host with a port is up
to 259; the client library (pamqp) also refuses a queue name with characters outside
`A-Za-z0-9-_.:@#,/+ `, such as an IPv6 literal's brackets. So a name that is too long or
holds other characters keeps a readable head, with those characters as `_`, and ends in `_`
and a hash of the whole (`amqp_name`). `_` is in no valid host name, so a mangled name never
equals a plain one. The mapping is a pure function of the name, so every service derives
the same one; nothing reads a domain back out of a name (messages carry their domain).
"""

from __future__ import annotations

import hashlib
import re

from hutch.urls import InvalidURL, check_url

__all__ = ["MAX_NAME_BYTES", "InvalidURL", "amqp_name", "domain_of"]

MAX_NAME_BYTES = 255  # AMQP short string: queue names, exchange names, routing keys
HASH_CHARS = 24  # hex digits of SHA-256 kept: 96 bits, no collision among any real set of domains
_PLAIN = re.compile(r"[A-Za-z0-9._:-]*")  # what every name may hold as it is
_OTHER = re.compile(r"[^A-Za-z0-9._:-]")


def domain_of(url: str) -> str:
    """The domain key of a URL the validator accepts; raises InvalidURL otherwise."""
    return check_url(url).domain


def amqp_name(name: str) -> str:
    """`name` itself when short and plain enough for AMQP, else a readable head + `_` + a hash."""
    if len(name) <= MAX_NAME_BYTES and _PLAIN.fullmatch(name):
        return name  # plain characters are ASCII: as many bytes as characters
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    head = _OTHER.sub("_", name)[: MAX_NAME_BYTES - HASH_CHARS - 1]
    return f"{head}_{digest}"
