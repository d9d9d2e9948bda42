"""Domain keys widened to the registrable domain with the bundled public-suffix list."""

from __future__ import annotations

import pytest

from hutch.services.governor.suffixes import BUNDLED, PublicSuffixList, key_function, split_port

RULES = """
// a tiny list in the file's own format
com
uk
co.uk
*.ck
!www.ck
jp
*.kobe.jp
!city.kobe.jp
公司.cn
"""


@pytest.fixture(scope="module")
def psl() -> PublicSuffixList:
    return PublicSuffixList(RULES.splitlines())


@pytest.mark.parametrize(
    ("host", "registrable"),
    [
        ("www.example.com", "example.com"),
        ("a.b.example.com", "example.com"),
        ("example.com", "example.com"),
        ("com", "com"),
        ("shop.example.co.uk", "example.co.uk"),
        ("a.b.ck", "a.b.ck"),
        ("x.a.b.ck", "a.b.ck"),
        ("www.ck", "www.ck"),
        ("a.www.ck", "www.ck"),
        ("x.y.kobe.jp", "x.y.kobe.jp"),
        ("a.city.kobe.jp", "city.kobe.jp"),
        ("a.example.unknowntld", "example.unknowntld"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "[::1]"),
        ("WWW.Example.COM.", "example.com"),
        ("a.xn--example-1.xn--55qx5d.cn", "xn--example-1.xn--55qx5d.cn"),
    ],
)
def test_the_registrable_domain_is_one_label_past_the_public_suffix(
    psl: PublicSuffixList, host: str, registrable: str
) -> None:
    assert psl.registrable(host) == registrable


def test_the_bundled_list_is_there_and_knows_common_suffixes() -> None:
    assert BUNDLED.exists()
    psl = PublicSuffixList.load()
    assert psl.registrable("a.b.example.co.uk") == "example.co.uk"
    assert psl.registrable("user.github.io") == "user.github.io"  # a private-section suffix
    assert psl.registrable("www.bbc.co.uk") == "bbc.co.uk"


@pytest.mark.parametrize(
    ("domain", "parts"),
    [("a.example:8080", ("a.example", ":8080")), ("a.example", ("a.example", "")), ("[::1]:81", ("[::1]", ":81"))],
)
def test_split_port(domain: str, parts: tuple[str, str]) -> None:
    assert split_port(domain) == parts


def test_host_keys_leave_the_domain_alone() -> None:
    key = key_function("host")
    assert key("www.example.com:8080") == "www.example.com:8080"


def test_registrable_keys_keep_a_non_default_port() -> None:
    key = key_function("registrable")
    assert key("www.example.com") == "example.com"
    assert key("a.shop.example.co.uk:8443") == "example.co.uk:8443"
    assert key("127.0.0.1:8001") == "127.0.0.1:8001"


def test_an_unknown_key_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="host or registrable"):
        key_function("site")
