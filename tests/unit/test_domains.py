"""What a domain key is: the host every per-site limit and queue hangs on, and its routing key."""

from __future__ import annotations

import pytest

from hutch.domains import InvalidURL, domain_from_routing_key, domain_of, routing_key

# -- default and explicit ports ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/", "example.com"),
        ("http://example.com:80/a", "example.com"),
        ("https://example.com/", "example.com"),
        ("https://example.com:443/b", "example.com"),
    ],
)
def test_the_scheme_default_port_is_dropped_from_the_domain(url: str, expected: str) -> None:
    assert domain_of(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com:8080/", "example.com:8080"),
        ("http://example.com:443/", "example.com:443"),
        ("https://example.com:80/", "example.com:80"),
        ("http://127.0.0.1:8001/page/1", "127.0.0.1:8001"),
    ],
)
def test_a_port_that_is_not_the_scheme_default_is_kept(url: str, expected: str) -> None:
    assert domain_of(url) == expected


def test_two_loopback_ports_are_two_domains() -> None:
    assert domain_of("http://127.0.0.1:8001/") != domain_of("http://127.0.0.1:8002/")


def test_the_same_site_with_and_without_its_default_port_is_one_domain() -> None:
    assert domain_of("https://Example.com:443/a") == domain_of("https://example.com/b")


def test_path_query_fragment_and_credentials_do_not_change_the_domain() -> None:
    assert domain_of("http://user:secret@example.com/a/b?q=1#frag") == "example.com"


def test_surrounding_white_space_is_ignored() -> None:
    assert domain_of("  http://example.com/  \n") == "example.com"


# -- case, IDNA, IPv6 ----------------------------------------------------------------------------


def test_host_and_scheme_are_lower_cased() -> None:
    assert domain_of("HTTP://WWW.Example.COM/Path") == "www.example.com"


def test_a_unicode_host_is_idna_encoded() -> None:
    assert domain_of("http://bücher.de/") == "xn--bcher-kva.de"


def test_a_unicode_host_and_its_punycode_form_are_one_domain() -> None:
    assert domain_of("http://Bücher.DE/x") == domain_of("http://xn--bcher-kva.de/y")


def test_a_unicode_host_keeps_its_non_default_port() -> None:
    assert domain_of("https://münchen.example:8443/") == "xn--mnchen-3ya.example:8443"


def test_an_ipv6_literal_keeps_its_brackets() -> None:
    assert domain_of("http://[::1]/") == "[::1]"


def test_an_ipv6_literal_with_a_port_stays_unambiguous() -> None:
    assert domain_of("http://[::1]:8080/") == "[::1]:8080"


def test_an_ipv6_literal_is_lower_cased_and_drops_its_default_port() -> None:
    assert domain_of("http://[2001:DB8::1]:80/") == "[2001:db8::1]"


# -- invalid URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/file",
        "mailto:someone@example.com",
        "file:///etc/passwd",
        "example.com/no-scheme",
        "//example.com/scheme-relative",
    ],
)
def test_a_url_that_is_not_http_or_https_is_invalid(url: str) -> None:
    with pytest.raises(InvalidURL, match="not an http or https URL"):
        domain_of(url)


@pytest.mark.parametrize("url", ["http:///path", "https://", "http://:8080/"])
def test_a_url_without_a_host_is_invalid(url: str) -> None:
    with pytest.raises(InvalidURL, match="no host"):
        domain_of(url)


@pytest.mark.parametrize("url", ["http://exa mple.com/", "http://example.com/a b", "http://example.com/\tx"])
def test_a_url_with_white_space_inside_is_invalid(url: str) -> None:
    with pytest.raises(InvalidURL, match="white space"):
        domain_of(url)


@pytest.mark.parametrize(
    "url", ["http://example.com:abc/", "http://example.com:99999/", "http://example.com:-1/"]
)
def test_a_malformed_port_is_invalid(url: str) -> None:
    with pytest.raises(InvalidURL, match="malformed URL"):
        domain_of(url)


def test_invalid_url_is_a_value_error_so_generic_callers_can_catch_it() -> None:
    assert issubclass(InvalidURL, ValueError)


def test_the_error_message_quotes_the_offending_url() -> None:
    with pytest.raises(InvalidURL) as info:
        domain_of("ftp://files.example.org/x")
    assert "ftp://files.example.org/x" in str(info.value)


# -- routing keys --------------------------------------------------------------------------------


def test_routing_key_prefixes_the_domain_with_d_dot() -> None:
    assert routing_key("example.com:8080") == "d.example.com:8080"


@pytest.mark.parametrize("domain", ["example.com", "127.0.0.1:8001", "[::1]:8080", "xn--bcher-kva.de"])
def test_a_domain_survives_a_round_trip_through_its_routing_key(domain: str) -> None:
    assert domain_from_routing_key(routing_key(domain)) == domain


@pytest.mark.parametrize("key", ["d.", "example.com", "x.example.com", "", "d"])
def test_a_key_that_is_not_a_frontier_routing_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="not a frontier routing key"):
        domain_from_routing_key(key)
