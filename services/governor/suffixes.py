"""The domain key a limit hangs on: the host (the default), or its registrable domain.

With `HUTCH_DOMAIN_KEY=registrable`, `a.shop.example.co.uk` and `b.shop.example.co.uk`
share the limit of `example.co.uk`: the registrable domain is one label more than the
longest public suffix, found in the public-suffix list (publicsuffix.org, Mozilla Public
License 2.0) that the `publicsuffixlist` package installs with Hutch: nothing is downloaded
at run time, and `HUTCH_PUBLIC_SUFFIX_FILE` points to another copy. IP addresses
and hosts that are themselves public suffixes stay as they are; a non-default port stays
part of the key, as in `hutch.domains`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

import publicsuffixlist

BUNDLED = Path(publicsuffixlist.__file__).with_name("public_suffix_list.dat")


class PublicSuffixList:
    """The registrable domain of a host, by the `publicsuffixlist` package's own matcher
    (`privatesuffix`: rules, wildcards and exceptions, Unicode and IDNA forms alike)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._list = publicsuffixlist.PublicSuffixList(lines)

    @classmethod
    def load(cls, path: Path | None = None) -> PublicSuffixList:
        with (path or BUNDLED).open(encoding="utf-8") as handle:
            return cls(handle.read().splitlines())

    def registrable(self, host: str) -> str:
        """`example.co.uk` for `a.b.example.co.uk`; the host itself when it has no such part
        (an IP address, a public suffix)."""
        host = host.lower().rstrip(".")
        if _is_ip(host):
            return host
        return self._list.privatesuffix(host) or host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def split_port(domain: str) -> tuple[str, str]:
    """("host", ":port") of a domain key; the port part is "" when there is none."""
    if domain.startswith("["):
        host, _, rest = domain.partition("]")
        return host + "]", rest
    host, colon, port = domain.rpartition(":")
    if colon and port.isdigit():
        return host, ":" + port
    return domain, ""


def key_function(mode: str, suffix_file: Path | None = None) -> Callable[[str], str]:
    """The function from a task's domain (host[:port]) to the key its limits hang on."""
    if mode == "host":
        return lambda domain: domain
    if mode != "registrable":
        raise ValueError(f"unknown domain key {mode!r}: host or registrable")
    psl = PublicSuffixList.load(suffix_file)

    @lru_cache(maxsize=65536)
    def key(domain: str) -> str:
        host, port = split_port(domain)
        return psl.registrable(host) + port

    return key
