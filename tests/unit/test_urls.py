"""The one URL validator: every rule it enforces, and the normalised form it hands back."""

from __future__ import annotations

import idna
import pytest

from hutch.urls import DEFAULT_MAX_URL_BYTES, CheckedURL, InvalidURL, check_url

# -- what passes, and in which form ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "normalised", "domain"),
    [
        ("http://example.com/a?b=1#c", "http://example.com/a?b=1#c", "example.com"),
        ("HTTPS://Example.COM:443/Path", "https://example.com/Path", "example.com"),
        ("http://example.com:8080", "http://example.com:8080", "example.com:8080"),
        ("http://example.com:/a", "http://example.com/a", "example.com"),
        ("http://example.com./a", "http://example.com/a", "example.com"),
        ("http://example.com/?", "http://example.com/?", "example.com"),
        ("http://127.0.0.1:8001/page/1", "http://127.0.0.1:8001/page/1", "127.0.0.1:8001"),
        ("http://[::1]:8080/", "http://[::1]:8080/", "[::1]:8080"),
        ("http://[2001:DB8:0:0::1]/", "http://[2001:db8::1]/", "[2001:db8::1]"),
        ("http://169.254.169.254/latest/", "http://169.254.169.254/latest/", "169.254.169.254"),
    ],
)
def test_a_valid_url_comes_back_normalised_with_its_domain(url: str, normalised: str, domain: str) -> None:
    assert check_url(url) == CheckedURL(normalised, domain)


def test_uts46_maps_a_unicode_host_to_its_a_label() -> None:
    assert check_url("http://Bücher.example/") == CheckedURL("http://xn--bcher-kva.example/", "xn--bcher-kva.example")


def test_uts46_maps_ideographic_and_full_width_dots_and_letters() -> None:
    assert check_url("http://example\u3002com/x").url == "http://example.com/x"
    assert check_url("http://\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25\uff0ecom/").domain == "example.com"


def test_idna_2008_keeps_sharp_s_where_idna_2003_mapped_it_to_ss() -> None:
    assert check_url("http://faß.de/").domain == "xn--fa-hia.de"


def test_a_full_width_ipv4_address_is_mapped_to_the_address() -> None:
    assert check_url("http://\uff11\uff12\uff17.0.0.1:8001/").domain == "127.0.0.1:8001"


def test_the_path_query_and_fragment_are_kept_as_given() -> None:
    url = "http://example.com/A%20b/caf\u00e9?x=Y&z=%2F#Frag"
    assert check_url(url).url == url


def test_a_label_of_63_and_a_host_of_253_bytes_pass() -> None:
    host = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    assert len(host) == 253
    assert check_url(f"http://{host}/").domain == host


def test_normalising_is_idempotent() -> None:
    first = check_url("HTTP://Bücher.Example:80/x?y")
    assert check_url(first.url) == first


# -- what is refused, and why ---------------------------------------------------------------------

REFUSED = [
    ("http://a..example.com/x", "host", "Empty Label"),
    (f"http://{'a' * 70}.example.com/x", "host", "Label too long"),
    ("http://" + ".".join(["h" * 50] * 6) + "/x", "host", "too long"),
    ("http://xn--/x", "host", "not a valid domain name"),
    ("http://xn--zz.example/", "host", "not a valid domain name"),
    ("http://-a.example/", "host", "hyphen"),
    ("http://under_score.example/", "host", "not a valid domain name"),
    ("http://.example.com/", "host", "Empty Label"),
    ("http://example.com../", "host", "not a valid domain name"),
    ("http://2130706433/", "host", "ends in a number"),
    ("http://1.2.3/", "host", "ends in a number"),
    ("http://0x7f.1/", "host", "ends in a number"),
    ("http://256.0.0.1/", "host", "not an IPv4 address"),
    ("http://127.000.0.1/", "host", "not an IPv4 address"),
    ("http://[::1/", "syntax", "malformed URL"),
    ("http://[zz::1]/", "syntax", "does not appear to be an IPv4 or IPv6 address"),
    ("http://[fe80::1%25eth0]/", "host", "zone"),
    ("http:///path", "host", "no host"),
    ("https://", "host", "no host"),
    ("http://:8080/", "host", "no host"),
    ("file:///etc/passwd", "scheme", "not an http or https URL"),
    ("javascript:alert(1)", "scheme", "not an http or https URL"),
    ("ftp://example.com/file", "scheme", "not an http or https URL"),
    ("mailto:someone@example.com", "scheme", "not an http or https URL"),
    ("example.com/no-scheme", "scheme", "not an http or https URL"),
    ("//example.com/scheme-relative", "scheme", "not an http or https URL"),
    ("http:example.com", "syntax", "not an absolute URL"),
    ("http://user:secret@example.com/", "credentials", "credentials"),
    ("http://trusted.example@evil.example/", "credentials", "credentials"),
    ("http://example.com:abc/", "port", "port"),
    ("http://example.com:99999/", "port", "port"),
    ("http://example.com:0/", "port", "port"),
    ("http://example.com:-1/", "port", "port"),
    ("http://example.com:\uff18\uff10/", "port", "port"),
    ("http://example.com/\x1b[2J", "characters", "control character"),
    ("http://example.com/\x00", "characters", "control character"),
    ("http://example.com/\x7f", "characters", "control character"),
    ("http://example.com/\u009b2J", "characters", "control character"),
    ("http://exa mple.com/", "characters", "white space"),
    ("http://example.com/a b", "characters", "white space"),
    ("http://example.com/\tx", "characters", "white space"),
    ("http://example.com/\u3000", "characters", "white space"),
    (" http://example.com/", "characters", "white space"),
    ("http://example.com/\n", "characters", "white space"),
]


@pytest.mark.parametrize(("url", "why", "says"), REFUSED)
def test_a_url_breaking_a_rule_is_refused_with_that_rule(url: str, why: str, says: str) -> None:
    with pytest.raises(InvalidURL, match=says) as info:
        check_url(url)
    assert info.value.why == why


def test_a_url_over_the_byte_cap_is_refused_before_anything_else() -> None:
    url = "http://example.com/" + "a" * DEFAULT_MAX_URL_BYTES
    with pytest.raises(InvalidURL, match=f"over the limit of {DEFAULT_MAX_URL_BYTES}") as info:
        check_url(url)
    assert info.value.why == "too_long"


def test_the_byte_cap_counts_utf8_bytes_and_is_a_parameter() -> None:
    assert check_url("http://example.com/" + "é" * 10, max_bytes=39).url
    with pytest.raises(InvalidURL, match="over the limit"):
        check_url("http://example.com/" + "é" * 11, max_bytes=39)


def test_the_byte_cap_holds_on_the_normalised_url_too() -> None:
    url = "http://bücher.example/"  # 23 bytes as given, 29 once the host is an A-label
    with pytest.raises(InvalidURL, match="once its host is encoded") as info:
        check_url(url, max_bytes=len(url.encode()))
    assert info.value.why == "too_long"


def test_the_error_message_escapes_control_characters_and_is_cut_short() -> None:
    with pytest.raises(InvalidURL) as info:
        check_url("http://example.com/\x1b[2J" + "x" * 500)
    message = str(info.value)
    assert "\x1b" not in message and "\\x1b[2J" in message
    assert len(message) < 250


def test_invalid_url_is_a_value_error() -> None:
    assert issubclass(InvalidURL, ValueError)


@pytest.mark.parametrize(
    "host",
    ["example.com", "Example.COM.", "a-b.c-d.example", "a" * 63 + ".example", "0day.example", "x.y.z.w", "a1-b2.c3",
     "ab--c.example", "xn--bcher-kva.example", "-a.example", "a-.example", "a" * 64 + ".example", "a_b.example"],
)
def test_the_fast_path_for_plain_ascii_hosts_agrees_with_idna(host: str) -> None:
    try:
        expected: str | None = idna.encode(host, uts46=True).decode("ascii").removesuffix(".")
    except idna.IDNAError:
        expected = None
    try:
        found: str | None = check_url(f"http://{host}/").domain
    except InvalidURL:
        found = None
    assert found == expected
