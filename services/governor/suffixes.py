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
    def __init__(self, lines: Iterable[str]) -> None:
        self.rules: set[str] = set()
        self.wildcards: set[str] = set()  # "*.ck" is kept as "ck"
        self.exceptions: set[str] = set()  # "!www.ck" is kept as "www.ck"
        for raw in lines:
            line = raw.strip().split()[0] if raw.strip() else ""
            if not line or line.startswith("//"):
                continue
            for rule in _forms(line.lower()):
                if rule.startswith("!"):
                    self.exceptions.add(rule[1:])
                elif rule.startswith("*."):
                    self.wildcards.add(rule[2:])
                else:
                    self.rules.add(rule)

    @classmethod
    def load(cls, path: Path | None = None) -> PublicSuffixList:
        with (path or BUNDLED).open(encoding="utf-8") as handle:
            return cls(handle)

    def suffix_labels(self, labels: list[str]) -> int:
        """How many trailing labels of a host form its public suffix (at least 1)."""
        n = len(labels)
        for i in range(n):
            candidate = ".".join(labels[i:])
            if candidate in self.exceptions:
                return n - i - 1
            if candidate in self.rules or (i + 1 < n and ".".join(labels[i + 1 :]) in self.wildcards):
                return n - i
        return 1

    def registrable(self, host: str) -> str:
        """`example.co.uk` for `a.b.example.co.uk`; the host itself when it has no such part."""
        host = host.lower().rstrip(".")
        if _is_ip(host):
            return host
        labels = host.split(".")
        suffix = self.suffix_labels(labels)
        if len(labels) <= suffix:
            return host
        return ".".join(labels[-(suffix + 1) :])


def _forms(rule: str) -> set[str]:
    """A rule as written (Unicode) and IDNA-encoded, since domain keys are IDNA."""
    forms = {rule}
    prefix = ""
    body = rule
    if body.startswith("!"):
        prefix, body = "!", body[1:]
    if body.startswith("*."):
        prefix, body = prefix + "*.", body[2:]
    if not body.isascii():
        try:
            forms.add(prefix + body.encode("idna").decode("ascii"))
        except UnicodeError:
            pass
    return forms


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
