"""The AMQP layer's message counts and republished properties, without a broker."""

from __future__ import annotations

import datetime

import pytest
from pamqp.commands import Basic

from hutch.amqp import CRASHES, FAILURES, INFRA_BACKOFF_MAX, copy_properties, infra_backoff
from hutch.amqp.consumer import _count


@pytest.mark.parametrize(
    ("value", "count"),
    [(None, 0), (0, 0), (2, 2), (-3, 0), (True, 0), ("2", 0), (2.0, 0), ([1], 0)],
)
def test_a_count_header_is_a_positive_int_or_zero_whatever_was_sent(value: object, count: int) -> None:
    assert _count(value) == count


def received() -> Basic.Properties:
    return Basic.Properties(
        content_type="application/json",
        message_type="hutch.Page",
        message_id="m1",
        timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        headers={
            "traceparent": "00-abc-def-01",
            "x-death": [{"count": 1}],
            "x-first-death-queue": "q",
            "x-last-death-reason": "expired",
            CRASHES: 1,
        },
        delivery_mode=2,
        correlation_id="c",
        reply_to="r",
        expiration="5000",
        user_id="guest",
        app_id="hutch-parser",
    )


def test_a_republished_message_keeps_its_identity_and_trace_and_gets_its_new_counts() -> None:
    copy = copy_properties(received(), {CRASHES: 2, FAILURES: 1})
    assert copy.headers == {"traceparent": "00-abc-def-01", CRASHES: 2, FAILURES: 1}
    assert (copy.message_id, copy.message_type, copy.content_type) == ("m1", "hutch.Page", "application/json")
    assert (copy.correlation_id, copy.reply_to, copy.expiration, copy.app_id) == ("c", "r", "5000", "hutch-parser")
    assert copy.delivery_mode == 2
    assert copy.timestamp == datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_a_republished_message_drops_the_brokers_dead_letter_history_and_its_user_id() -> None:
    copy = copy_properties(received())
    assert not any(k.startswith(("x-death", "x-first-death", "x-last-death")) for k in copy.headers)
    assert copy.user_id is None  # the broker would check it against the republishing connection
    assert copy.headers[CRASHES] == 1  # unchanged when no counts are given


def test_copying_properties_leaves_the_received_ones_untouched() -> None:
    original = received()
    copy_properties(original, {CRASHES: 5})
    assert original.headers[CRASHES] == 1 and "x-death" in original.headers


def test_the_backoff_after_infrastructure_errors_doubles_from_a_quarter_second_up_to_its_cap() -> None:
    assert [infra_backoff(n) for n in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 4.0, INFRA_BACKOFF_MAX]
    assert infra_backoff(1000) == INFRA_BACKOFF_MAX == 5.0
