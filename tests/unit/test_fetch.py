"""Reading a Retry-After header: delta-seconds, an HTTP date, or garbage that must not raise.

Only `parse_retry_after` is tested here: the fetch itself needs a socket.
"""

from __future__ import annotations

import email.utils

import pytest

from hutch.services.fetcher.fetch import parse_retry_after

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
