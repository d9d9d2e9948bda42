"""Wildcard entries in HUTCH_RESOLVE and HUTCH_ALLOWED_TARGETS: matching, precedence, validation,
the 128 KiB cap on one variable, and the sandbox's per-Host counts. No sockets."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from hutch_sandbox.hostcount import OVERFLOW, HostCounter
from pydantic import ValidationError

from hutch.services.fetcher.guard import ForbiddenTarget, TargetGuard, parse_overrides
from hutch.settings import MAX_ENV_BYTES, Settings
from hutch.targets import BadEntry, Pattern, allowed_table, parse_resolve, parse_target, resolve_table


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("HUTCH_"):
            monkeypatch.delenv(name)


# -- matching --------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["a.shop.test", "d00001.shop.test", "a.b.c.shop.test"])
def test_a_wildcard_names_every_host_under_its_suffix(host: str) -> None:
    table = resolve_table(["*.shop.test:8443:127.0.0.1"])
    assert table.get(host, 8443) == "127.0.0.1"


@pytest.mark.parametrize("host", ["shop.test", "evilshop.test", "shop.test.evil", "a.shop.testx", "test"])
def test_a_wildcard_names_neither_its_bare_suffix_nor_a_host_that_only_ends_alike(host: str) -> None:
    table = resolve_table(["*.shop.test:8443:127.0.0.1"])
    assert table.get(host, 8443) is None


def test_a_wildcard_names_only_its_own_port() -> None:
    table = allowed_table(["*.shop.test:8443"])
    assert table.get("a.shop.test", 8443) is not None
    assert table.get("a.shop.test", 443) is None


def test_a_port_wildcard_names_every_port() -> None:
    table = allowed_table(["*.shop.test:*", "exact.test:*"])
    assert table.get("a.shop.test", 1) == "*.shop.test:*"
    assert table.get("exact.test", 65535) == "exact.test:*"


def test_a_wildcard_never_names_an_ip_address() -> None:
    table = resolve_table(["*:80:10.0.0.8"])
    assert table.get("127.0.0.1", 80) is None
    assert table.get("::1", 80) is None
    assert table.get("name.test", 80) == "10.0.0.8"


def test_entries_are_matched_in_the_form_the_fetcher_sends_idna_and_lower_case() -> None:
    table = resolve_table(["*.BÜCHER.Test:80:127.0.0.1", "Exact.Test.:80:127.0.0.2"])
    assert table.get("a.xn--bcher-kva.test", 80) == "127.0.0.1"
    assert table.get("exact.test", 80) == "127.0.0.2"


# -- precedence ------------------------------------------------------------------------------------


def test_an_exact_entry_wins_over_every_wildcard_whatever_the_order() -> None:
    for entries in (
        ["*.shop.test:80:10.0.0.1", "a.shop.test:80:10.0.0.2"],
        ["a.shop.test:80:10.0.0.2", "*.shop.test:80:10.0.0.1"],
    ):
        table = resolve_table(entries)
        assert table.get("a.shop.test", 80) == "10.0.0.2"
        assert table.get("b.shop.test", 80) == "10.0.0.1"


def test_the_longest_wildcard_suffix_wins_and_star_alone_comes_last() -> None:
    table = resolve_table(
        ["*:80:10.0.0.9", "*.test:80:10.0.0.1", "*.a.shop.test:80:10.0.0.3", "*.shop.test:80:10.0.0.2"]
    )
    assert table.get("x.a.shop.test", 80) == "10.0.0.3"
    assert table.get("a.shop.test", 80) == "10.0.0.2"  # `*.a.shop.test` does not name a.shop.test itself
    assert table.get("x.other.test", 80) == "10.0.0.1"
    assert table.get("example.org", 80) == "10.0.0.9"
    assert table.get("localhost", 80) == "10.0.0.9"


def test_for_one_host_or_suffix_an_exact_port_wins_over_a_port_wildcard() -> None:
    table = resolve_table(
        ["*.shop.test:*:10.0.0.1", "*.shop.test:80:10.0.0.2", "a.test:*:10.0.0.3", "a.test:80:10.0.0.4"]
    )
    assert table.get("x.shop.test", 80) == "10.0.0.2"
    assert table.get("x.shop.test", 81) == "10.0.0.1"
    assert table.get("a.test", 80) == "10.0.0.4"
    assert table.get("a.test", 81) == "10.0.0.3"


def test_an_exact_host_on_any_port_wins_over_a_wildcard_on_the_exact_port() -> None:
    table = resolve_table(["a.shop.test:*:10.0.0.1", "*.shop.test:80:10.0.0.2"])
    assert table.get("a.shop.test", 80) == "10.0.0.1"


def test_a_table_of_20000_exact_names_and_a_wildcard_answers_each_kind() -> None:
    entries = [f"d{i:06d}.wide.test:8000:127.0.0.1" for i in range(20_000)] + ["*.wide.test:8000:127.0.0.2"]
    table = resolve_table(entries)
    assert len(table) == 20_001
    assert table.get("d019999.wide.test", 8000) == "127.0.0.1"
    assert table.get("d020000.wide.test", 8000) == "127.0.0.2"


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["a*.shop.test", "*shop.test", "shop.*.test", "*.*.test", "**.test", "*.", "a.*", "*.shop.test*"]
)
def test_a_star_anywhere_but_the_whole_leftmost_label_is_refused_naming_the_entry(host: str) -> None:
    entry = f"{host}:80:127.0.0.1"
    with pytest.raises(BadEntry) as caught:
        parse_resolve(entry)
    assert repr(entry) in str(caught.value)


@pytest.mark.parametrize("port", ["0", "65536", "x", "", "-1", "\uff18\uff10", "80 "])
def test_a_bad_port_is_refused_naming_the_entry(port: str) -> None:
    entry = f"*.shop.test:{port}"
    with pytest.raises(BadEntry, match="is not a number from 1 to 65535") as caught:
        parse_target(entry)
    assert repr(entry) in str(caught.value)


@pytest.mark.parametrize("address", ["localhost", "300.1.1.1", "", "127.0.0.1:80", "[127.0.0.1"])
def test_a_resolve_entry_whose_address_is_not_an_ip_address_is_refused(address: str) -> None:
    with pytest.raises(BadEntry, match="not an IP address"):
        parse_resolve(f"*.shop.test:80:{address}")


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("*.10.0.0.1:80", "not addresses"),
        ("*:80", "HUTCH_ALLOW_PRIVATE_NETWORKS"),
        ("shop.test", "no port"),
        ("shop.test:80:1", "not host:port"),
        ("a/b.test:80", "not a host name"),
        ("user@shop.test:80", "not a host name"),
        ("[::1:80", "IPv6"),
        ("*.1.2.3:80", "not a host name"),
    ],
)
def test_a_malformed_allowlist_entry_is_refused_saying_why(entry: str, why: str) -> None:
    with pytest.raises(BadEntry, match=why):
        parse_target(entry)


def test_two_entries_for_the_same_hosts_with_different_addresses_are_refused_naming_both() -> None:
    with pytest.raises(BadEntry) as caught:
        resolve_table(["*.shop.test:80:10.0.0.1", "*.SHOP.test:80:10.0.0.2"])
    assert "'*.SHOP.test:80:10.0.0.2'" in str(caught.value) and "'*.shop.test:80:10.0.0.1'" in str(caught.value)


def test_repeated_entries_that_agree_are_accepted() -> None:
    assert len(allowed_table(["*.shop.test:80", "*.Shop.Test:80"])) == 1
    assert len(resolve_table(["a.test:80:::1", "A.test:80:[::1]"])) == 1


def test_entries_are_parsed_into_host_port_and_kind() -> None:
    assert parse_target("*.Shop.Test:*") == Pattern("shop.test", None, True)
    assert parse_target("[::1]:8080") == Pattern("::1", 8080, False)
    assert parse_resolve("*:443:[2001:db8::1]") == (Pattern("", 443, True), "2001:db8::1")
    assert str(parse_target("*.shop.test:*")) == "*.shop.test:*"


# -- settings --------------------------------------------------------------------------------------


def test_settings_read_wildcard_entries_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RESOLVE", "*.wide.test:8000:127.0.0.1, a.test:*:127.0.0.2")
    monkeypatch.setenv("HUTCH_ALLOWED_TARGETS", "*.wide.test:8000,127.0.0.1:9000")
    s = Settings()
    assert s.resolve == ("*.wide.test:8000:127.0.0.1", "a.test:*:127.0.0.2")
    assert s.allowed_targets == ("*.wide.test:8000", "127.0.0.1:9000")


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("HUTCH_RESOLVE", "ok.test:80:127.0.0.1,shop.*.test:80:127.0.0.1", "'shop.*.test:80:127.0.0.1'"),
        ("HUTCH_RESOLVE", "*.shop.test:http:127.0.0.1", "'*.shop.test:http:127.0.0.1'"),
        ("HUTCH_ALLOWED_TARGETS", "*.shop.test:99999", "'*.shop.test:99999'"),
    ],
)
def test_a_bad_entry_in_a_variable_fails_settings_naming_the_entry(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert named in str(caught.value)


def _entries_of_size(prefix: str, size: int) -> str:
    """Resolve entries whose `HUTCH_RESOLVE=` string, NUL included, is exactly `size` bytes."""
    entries = []
    length = len("HUTCH_RESOLVE=") + 1
    i = 0
    while True:
        entry = f"d{i:06d}.{prefix}:8000:127.0.0.1"
        if length + len(entry) + 1 > size:
            break
        entries.append(entry)
        length += len(entry) + (1 if i else 0)
        i += 1
    text = ",".join(entries)
    pad = size - (len("HUTCH_RESOLVE=") + len(text.encode()) + 1)
    return text + "," * pad  # empty entries are dropped but count as bytes


def test_a_resolve_variable_of_exactly_128_kib_is_accepted_and_one_byte_more_is_refused() -> None:
    assert len(Settings(resolve=_entries_of_size("wide.test", MAX_ENV_BYTES)).resolve) > 3900
    with pytest.raises(ValidationError) as caught:
        Settings(resolve=_entries_of_size("wide.test", MAX_ENV_BYTES + 1))
    message = str(caught.value)
    assert "HUTCH_RESOLVE would be 131,073 bytes" in message and "wildcard" in message


def test_the_cap_counts_utf8_bytes_not_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    # 66,000 characters, 2 bytes each in UTF-8: 132,000 bytes.
    monkeypatch.setenv("HUTCH_USER_AGENT", "\u00e9" * 66_000)
    with pytest.raises(ValidationError, match="HUTCH_USER_AGENT would be 132,018 bytes, over the 131,072"):
        Settings()
    monkeypatch.setenv("HUTCH_USER_AGENT", "\u00e9" * 65_000)
    assert len(Settings().user_agent) == 65_000


def test_every_variable_is_capped_not_only_the_two_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_USER_AGENT", "x" * MAX_ENV_BYTES)
    with pytest.raises(ValidationError, match="HUTCH_USER_AGENT would be"):
        Settings()


def test_a_tuple_given_in_code_is_capped_as_its_child_environment_would_hold_it() -> None:
    entries = tuple(f"d{i:05d}.wide.test:8000" for i in range(8_000))  # 8,000 x 22 bytes
    with pytest.raises(ValidationError, match="HUTCH_ALLOWED_TARGETS would be"):
        Settings(allowed_targets=entries)


def test_a_child_environment_is_capped_too_for_settings_copied_without_validation() -> None:
    copied = Settings().model_copy(update={"resolve": tuple(f"d{i:05d}.wide.test:80:127.0.0.1" for i in range(5_000))})
    with pytest.raises(ValueError, match=r"HUTCH_RESOLVE would be .* wildcard"):
        copied.to_env({})


# -- the guard -------------------------------------------------------------------------------------


def test_the_guard_resolves_and_lets_through_hosts_under_a_wildcard_and_refuses_others() -> None:
    guard = TargetGuard(
        ["*.wide.test:8000"], overrides=parse_overrides("*.wide.test:8000:127.0.0.1,*.test:8000:127.0.0.1")
    )
    assert asyncio.run(guard.check("d00042.wide.test", 8000)) == ["127.0.0.1"]
    assert asyncio.run(guard.check("D00042.WIDE.TEST", 8000)) == ["127.0.0.1"]
    for host in ("evilwide.test", "wide.test"):
        with pytest.raises(ForbiddenTarget, match=re.escape(f"{host}:8000 resolves to 127.0.0.1")):
            asyncio.run(guard.check(host, 8000))



def test_an_allowed_wildcard_lets_through_only_its_own_port() -> None:
    guard = TargetGuard(["*.wide.test:8000"], overrides=parse_overrides("*.wide.test:*:127.0.0.1"))
    assert asyncio.run(guard.check("d1.wide.test", 8000)) == ["127.0.0.1"]
    with pytest.raises(ForbiddenTarget, match=r"d1\.wide\.test:8001"):
        asyncio.run(guard.check("d1.wide.test", 8001))


def test_the_guard_still_takes_exact_overrides_as_a_mapping() -> None:
    guard = TargetGuard(["intranet.test:8080"], overrides={("Intranet.test", 8080): "10.1.2.3"})
    assert asyncio.run(guard.check("intranet.test", 8080)) == ["10.1.2.3"]


def test_a_malformed_resolve_spec_is_refused_by_the_guard_too() -> None:
    with pytest.raises(BadEntry, match="leftmost label"):
        parse_overrides("a.*.test:80:127.0.0.1")


# -- the sandbox's count per Host ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_worst_second_is_the_most_requests_within_any_one_second_window() -> None:
    clock = Clock()
    counter = HostCounter(clock=clock)
    # 3 requests at .6-.9 of one second and 3 at .0-.3 of the next: 6 within one second,
    # though no calendar second holds more than 3.
    for t in (0.6, 0.7, 0.9, 1.1, 1.2, 1.3):
        clock.now = 1000 + t
        counter.add("A.wide.test:8000")
    clock.now = 1005.0
    counter.add("a.wide.test:8000")
    counter.add("b.wide.test:8000")
    stats = counter.stats()
    assert stats["a.wide.test:8000"].total == 7
    assert stats["a.wide.test:8000"].worst_second == 6
    assert stats["b.wide.test:8000"].worst_second == 1
    assert counter.worst() == ("a.wide.test:8000", 6)


def test_requests_one_second_apart_are_not_in_the_same_window() -> None:
    clock = Clock()
    counter = HostCounter(clock=clock)
    for t in range(5):
        clock.now = 1000.0 + t
        counter.add("a.test")
    assert counter.stats()["a.test"].worst_second == 1


def test_hosts_past_the_bound_are_counted_together_and_long_names_are_cut() -> None:
    counter = HostCounter(max_hosts=3, clock=Clock())
    for host in ("a", "b", "c", "d", "e", "x" * 1000):
        counter.add(host)
    counter.add("a")
    stats = counter.stats()
    assert len(stats) == 4
    assert stats["a"].total == 2
    assert stats[OVERFLOW].total == 3
    assert counter.worst() is not None
    assert HostCounter().worst() is None
