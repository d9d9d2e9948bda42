"""The fetch's pure parts: reading Retry-After (delta-seconds, an HTTP date, or garbage that must
not raise) and telling a proxy's own error from the site's answer (Proxy-Status, 407).

The fetch itself needs a socket: tests/e2e/test_hostile_bodies.py drives it.
"""

from __future__ import annotations

import email.utils

import pytest

from hutch.services.fetcher.fetch import first_proxy_status, parse_retry_after, proxy_error, proxy_names

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def http_date(timestamp: float) -> str:
    return email.utils.formatdate(timestamp, usegmt=True)


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("1", 1.0), ("120", 120.0), ("86400", 86400.0)])
def test_delta_seconds_are_read_as_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, NOW) == seconds


def test_delta_seconds_do_not_depend_on_the_clock() -> None:
    assert parse_retry_after("30", 0.0) == parse_retry_after("30", NOW) == 30.0


def test_white_space_around_the_value_is_ignored() -> None:
    assert parse_retry_after("  45\t", NOW) == 45.0


def test_an_http_date_in_the_future_gives_the_seconds_until_then() -> None:
    assert parse_retry_after(http_date(NOW + 90), NOW) == pytest.approx(90.0)


def test_an_http_date_is_measured_from_the_given_now() -> None:
    value = http_date(NOW + 600)
    assert parse_retry_after(value, NOW + 100) == pytest.approx(500.0)


def test_a_literal_rfc_9110_date_is_understood() -> None:
    # Wed, 21 Oct 2015 07:28:00 GMT is 1445412480 seconds after the epoch.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412480.0 - 30) == pytest.approx(30.0)


def test_an_http_date_in_the_past_means_no_wait() -> None:
    assert parse_retry_after(http_date(NOW - 3600), NOW) == 0.0


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_header_gives_none(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "value",
    ["soon", "1.5", "-5", "+5", "5s", "tomorrow at noon", "Wed, 32 Foo 2015", "   ", "0x10"],
)
def test_garbage_gives_none(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize("value", ["²", "1²", "①"])
def test_unicode_digit_like_garbage_gives_none_instead_of_raising(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


# -- whose failure an answer is: the proxy's own, or the site's ---------------------------------

PROXY = "http://user:secret@proxy.example:3128"
NAMES = proxy_names(PROXY)


def test_a_proxy_is_known_by_its_host_and_its_host_and_port() -> None:
    assert NAMES == {"proxy.example", "proxy.example:3128"}
    assert proxy_names("http://[::1]:8080") == {"::1", "[::1]", "[::1]:8080"}
    assert proxy_names(None) == frozenset()


def test_a_proxy_status_error_signed_by_the_leased_proxy_is_a_proxy_failure() -> None:
    assert proxy_error(502, "proxy.example:3128; error=proxy_internal_error", NAMES) is not None
    assert proxy_error(502, '"proxy.example"; error=http_request_error', NAMES) is not None


def test_a_proxy_status_signed_by_another_name_is_the_sites_answer() -> None:
    assert proxy_error(502, "cdn.origin.example; error=proxy_internal_error", NAMES) is None
    # Only the first member counts: the site's own intermediary came first.
    assert proxy_error(502, "cdn.origin.example; error=x, proxy.example:3128", NAMES) is None


def test_a_407_counts_only_when_signed_by_the_proxy() -> None:
    assert proxy_error(407, None, NAMES) is None
    assert proxy_error(407, "login.origin.example; error=http_request_denied", NAMES) is None
    assert proxy_error(407, "proxy.example:3128; error=http_request_denied", NAMES) is not None


def test_errors_that_blame_the_destination_are_not_the_proxys() -> None:
    assert proxy_error(502, "proxy.example:3128; error=destination_unavailable", NAMES) is None
    assert proxy_error(200, "proxy.example:3128; error=proxy_internal_error", NAMES) is None


def test_nothing_is_a_proxy_failure_without_a_proxy() -> None:
    assert proxy_error(407, "proxy.example:3128; error=http_request_denied", frozenset()) is None
    assert proxy_error(502, "proxy.example:3128; error=proxy_internal_error", frozenset()) is None


def test_a_huge_proxy_status_is_read_within_bounds() -> None:
    assert first_proxy_status("a" * 100_000 + "; error=x")[1] == {}
    assert first_proxy_status("px; error=oops; details=\"x\"") == ("px", {"error": "oops", "details": "x"})
