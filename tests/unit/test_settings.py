"""The one settings object: HUTCH_ variables, delay tiers parsed from a list, and redacted URLs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from hutch.settings import DEFAULT_RETRY_DELAYS, Settings, redact_url


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the HUTCH_ variables it sets, whatever the shell running pytest holds."""
    for name in list(os.environ):
        if name.upper().startswith("HUTCH_"):
            monkeypatch.delenv(name)


# -- environment -----------------------------------------------------------------------------------


def test_without_variables_every_setting_has_its_default() -> None:
    s = Settings()
    assert s.namespace == "hutch"
    assert s.queue_type == "classic"
    assert s.retry_delays == DEFAULT_RETRY_DELAYS
    assert s.max_attempts == 5
    assert s.proxy_file is None


def test_hutch_prefixed_variables_set_the_matching_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_NAMESPACE", "staging")
    monkeypatch.setenv("HUTCH_QUEUE_TYPE", "quorum")
    monkeypatch.setenv("HUTCH_RATE", "3.5")
    monkeypatch.setenv("HUTCH_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("HUTCH_USE_PROXY_MANAGER", "false")
    monkeypatch.setenv("HUTCH_PROXY_FILE", "/etc/hutch/proxies.txt")
    s = Settings()
    assert s.namespace == "staging"
    assert s.queue_type == "quorum"
    assert s.rate == 3.5
    assert s.max_attempts == 7
    assert s.use_proxy_manager is False
    assert s.proxy_file == Path("/etc/hutch/proxies.txt")


def test_variables_are_matched_case_insensitively(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("hutch_namespace", "lower")
    assert Settings().namespace == "lower"


def test_a_variable_without_the_hutch_prefix_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "unprefixed")
    monkeypatch.setenv("RATE", "99")
    s = Settings()
    assert s.namespace == "hutch"
    assert s.rate == 2.0


def test_an_unknown_hutch_variable_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_NO_SUCH_SETTING", "x")
    assert Settings().namespace == "hutch"


def test_a_queue_type_other_than_classic_or_quorum_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_QUEUE_TYPE", "stream")
    with pytest.raises(ValidationError, match="queue_type"):
        Settings()


def test_a_non_numeric_rate_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RATE", "fast")
    with pytest.raises(ValidationError, match="rate"):
        Settings()


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.namespace = "other"  # type: ignore[misc]


def test_nothing_is_read_from_the_environment_before_settings_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Settings()
    monkeypatch.setenv("HUTCH_NAMESPACE", "later")
    assert first.namespace == "hutch"
    assert Settings().namespace == "later"


# -- retry delays --------------------------------------------------------------------------------


def test_retry_delays_are_parsed_from_a_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", "1,5,30")
    assert Settings().retry_delays == (1.0, 5.0, 30.0)


def test_retry_delays_accept_fractions_and_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", " 0.5 , 2 ,10")
    assert Settings().retry_delays == (0.5, 2.0, 10.0)


def test_retry_delays_are_sorted_and_deduplicated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", "30,1,5,5,1")
    assert Settings().retry_delays == (1.0, 5.0, 30.0)


def test_empty_items_in_the_delay_list_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", "1,,5,")
    assert Settings().retry_delays == (1.0, 5.0)


def test_retry_delays_given_as_a_sequence_are_sorted_and_deduplicated_too() -> None:
    assert Settings(retry_delays=(5, 1, 5)).retry_delays == (1.0, 5.0)


@pytest.mark.parametrize("value", ["", ",", "0", "0,5", "-1,5", "1,-30"])
def test_retry_delays_without_only_positive_values_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", value)
    with pytest.raises(ValidationError, match="positive delay"):
        Settings()


@pytest.mark.parametrize("value", ["1,x", "soon", "1;5"])
def test_retry_delays_that_are_not_numbers_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", value)
    with pytest.raises(ValidationError, match="retry_delays"):
        Settings()


@pytest.mark.parametrize("value", ["nan", "inf", "1,nan"])
def test_retry_delays_that_are_not_finite_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HUTCH_RETRY_DELAYS", value)
    with pytest.raises(ValidationError, match="retry_delays"):
        Settings()


# -- store location and redaction ----------------------------------------------------------------


def test_store_location_defaults_to_a_sqlite_file_in_the_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_DATA_DIR", "/var/lib/hutch")
    assert Settings().store_location == "sqlite:////var/lib/hutch/hutch.sqlite3"


def test_an_explicit_store_url_wins_over_the_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_DATA_DIR", "/var/lib/hutch")
    monkeypatch.setenv("HUTCH_STORE_URL", "sqlite:////tmp/other.sqlite3")
    assert Settings().store_location == "sqlite:////tmp/other.sqlite3"


def test_redact_url_hides_the_password_and_keeps_everything_else() -> None:
    redacted = redact_url("amqp://hutch:s3cret@rabbit.internal:5672/prod")
    assert redacted == "amqp://hutch:***@rabbit.internal:5672/prod"
    assert "s3cret" not in redacted


def test_redact_url_hides_a_password_without_a_port() -> None:
    assert redact_url("amqps://user:pa55@broker.example/vh") == "amqps://user:***@broker.example/vh"


def test_redact_url_hides_a_password_given_without_a_user_name() -> None:
    redacted = redact_url("amqp://:topsecret@broker:5672/")
    assert "topsecret" not in redacted
    assert "broker:5672" in redacted


def test_redact_url_leaves_a_url_without_a_password_unchanged() -> None:
    assert redact_url("amqp://guest@broker:5672/") == "amqp://guest@broker:5672/"
    assert redact_url("amqp://broker/") == "amqp://broker/"


def test_redact_url_hides_a_percent_encoded_password() -> None:
    redacted = redact_url("amqp://user:p%40ss%2Fword@broker:5672/")
    assert "p%40ss" not in redacted
    assert "word" not in redacted
    assert redacted == "amqp://user:***@broker:5672/"


def test_redact_url_keeps_the_brackets_of_an_ipv6_broker_address() -> None:
    assert redact_url("amqp://user:secret@[::1]:5672/") == "amqp://user:***@[::1]:5672/"


def test_safe_amqp_url_is_the_redacted_amqp_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_AMQP_URL", "amqp://admin:hunter2@10.0.0.5:5672/")
    s = Settings()
    assert s.amqp_url == "amqp://admin:hunter2@10.0.0.5:5672/"
    assert s.safe_amqp_url == "amqp://admin:***@10.0.0.5:5672/"


def test_redact_url_hides_a_password_given_as_a_libpq_parameter() -> None:
    assert (
        redact_url("postgresql://hutch@db:5432/hutch?sslmode=require&password=s3cret")
        == "postgresql://hutch@db:5432/hutch?sslmode=require&password=***"
    )


def test_redact_url_leaves_a_url_without_a_password_as_it_is() -> None:
    assert redact_url("sqlite:///hutch-data/demo/hutch.sqlite3") == "sqlite:///hutch-data/demo/hutch.sqlite3"
    assert redact_url("postgresql://hutch@db/hutch?sslmode=require") == "postgresql://hutch@db/hutch?sslmode=require"
