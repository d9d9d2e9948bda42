"""What a domain key is: the host every per-site limit and queue hangs on, and its routing key."""

from __future__ import annotations

import pytest
from pamqp.constants import DOMAIN_REGEX
from pydantic import ValidationError

from hutch.domains import MAX_NAME_BYTES, InvalidURL, amqp_name, domain_of
from hutch.settings import Settings
from hutch.topology import Topology, event_key, outcome_key, routing_key

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


def test_path_query_and_fragment_do_not_change_the_domain() -> None:
    assert domain_of("http://example.com/a/b?q=1#frag") == "example.com"


def test_credentials_are_refused_not_ignored() -> None:
    with pytest.raises(InvalidURL, match="credentials"):
        domain_of("http://user:secret@example.com/")


def test_surrounding_white_space_is_refused_callers_strip_their_lines() -> None:
    with pytest.raises(InvalidURL, match="white space"):
        domain_of("  http://example.com/  \n")


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


# -- invalid URLs (every rule: test_urls.py) -----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://a..example.com/x", f"http://{'a' * 70}.example.com/x", "http://" + "h." * 127 + "h/", "http://xn--/x"],
)
def test_the_malformed_hosts_of_issue_10_have_no_domain(url: str) -> None:
    with pytest.raises(InvalidURL, match="not a valid domain name"):
        domain_of(url)


def test_invalid_url_is_a_value_error_so_generic_callers_can_catch_it() -> None:
    assert issubclass(InvalidURL, ValueError)


# -- routing keys and queue names -----------------------------------------------------------------


def test_routing_key_prefixes_the_domain_with_d_dot() -> None:
    assert routing_key("example.com:8080") == "d.example.com:8080"


def test_event_keys_name_the_kind_and_the_domain() -> None:
    assert event_key("outcome", "example.com") == "outcome.example.com"
    assert outcome_key("example.com", proxied=False) == "outcome.example.com"
    assert outcome_key("example.com", proxied=True) == "outcome.proxied.example.com"
    assert event_key("robots", "127.0.0.1:8001") == "robots.127.0.0.1:8001"


LONGEST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]) + ":65535"  # 253-byte host and a port


def amqp_accepts(name: str) -> bool:
    """What the client library checks before it sends a queue name (and RabbitMQ's 255 bytes)."""
    return len(name.encode()) <= MAX_NAME_BYTES and bool(DOMAIN_REGEX["queue-name"].fullmatch(name))


def test_a_name_that_fits_is_kept_as_it_is() -> None:
    name = "x" * MAX_NAME_BYTES
    assert amqp_name(name) == name
    assert amqp_name("acme.v2.frontier.d.127.0.0.1:8001") == "acme.v2.frontier.d.127.0.0.1:8001"


def test_a_name_over_255_bytes_is_cut_to_255_with_a_hash_of_the_whole() -> None:
    name = "q." + LONGEST
    short = amqp_name(name)
    assert len(short.encode()) == MAX_NAME_BYTES and amqp_accepts(short)
    assert short.startswith("q.aaaa") and short[-25] == "_"


def test_the_hashed_name_is_deterministic_and_tells_apart_names_with_one_head() -> None:
    one, two = "d." + LONGEST, "d." + LONGEST.replace("65535", "65534")
    assert amqp_name(one) == amqp_name(one)
    assert amqp_name(one) != amqp_name(two)
    assert amqp_name(one)[:200] == amqp_name(two)[:200]


@pytest.mark.parametrize("domain", ["[::1]:8080", "[2001:db8::1]", "\u00e9" * 200])
def test_a_name_with_characters_amqp_refuses_is_made_plain_and_hashed(domain: str) -> None:
    name = amqp_name(f"acme.v2.frontier.d.{domain}")
    assert amqp_accepts(name)
    assert name != amqp_name(f"acme.v2.frontier.d.{domain}x")


def test_a_mangled_name_never_equals_the_name_of_a_valid_domain() -> None:
    # `_` is in no valid host: `[::1]` cannot come out as some host's plain name.
    assert "_" in amqp_name("d.[::1]")
    with pytest.raises(InvalidURL):
        domain_of("http://" + amqp_name("d.[::1]")[2:] + "/")


def test_routing_and_event_keys_of_the_longest_domain_fit_an_amqp_short_string() -> None:
    assert len(routing_key(LONGEST).encode()) <= MAX_NAME_BYTES
    assert len(event_key("outcome", LONGEST).encode()) <= MAX_NAME_BYTES
    assert routing_key(LONGEST) != routing_key(LONGEST[:-1])


@pytest.mark.parametrize("namespace", ["h", "n" * 100, "n" * 200])
def test_a_253_byte_host_under_a_200_character_namespace_gives_names_within_255_bytes(namespace: str) -> None:
    topology = Topology(namespace)
    queue = topology.domain_queue(LONGEST)
    assert amqp_accepts(queue.name)
    assert all(len(key.encode()) <= MAX_NAME_BYTES for _, key in queue.bindings)
    assert all(amqp_accepts(name) for name in topology.all_queue_names([LONGEST, "[::1]:8080"]))
    assert queue.name == Topology(namespace).domain_queue(LONGEST).name  # every service agrees


def test_a_short_domain_keeps_its_readable_queue_name() -> None:
    assert Topology("acme").domain_queue("example.com").name == "acme.v3.frontier.d.example.com"


def test_the_longest_namespace_settings_allow_keeps_every_exchange_within_amqps_127() -> None:
    topology = Topology(Settings(namespace="n" * 100).namespace)
    assert all(len(exchange.name) <= 127 for exchange in topology.exchanges)
    assert all(len(name.encode()) <= MAX_NAME_BYTES for name in topology.all_queue_names([LONGEST]))


@pytest.mark.parametrize("namespace", ["", "n" * 101, "a/b", "a b", "x\x1b"])
def test_a_namespace_that_could_not_name_an_exchange_is_refused(namespace: str) -> None:
    with pytest.raises(ValidationError):
        Settings(namespace=namespace)
