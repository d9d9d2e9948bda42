"""A spec's headers:, cookies: and budget:: checked at spec load and on the wire with the key
named and no value quoted, sent as one Cookie header and not to another host after a redirect,
and redacted wherever a task, spec or dead letter is shown."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hutch.models import DeadLetter, DecodeError, FieldRule, Spec, Submission, Task, decode, encode
from hutch.request_options import (
    MAX_BYTES,
    MAX_ENTRIES,
    REDACTED,
    OptionsError,
    check_options,
    redact,
    request_headers,
)
from hutch.services.parser.spec import SpecError, parse_spec, spec_document, spec_from_bytes

FIELDS = {"title": "css:title::text"}
SECRET = "s3cr3t-session-token"


def spec(**keys: Any) -> Spec:
    return parse_spec({"fields": FIELDS, **keys}, "job.yaml")


def refusal(**keys: Any) -> str:
    with pytest.raises(SpecError) as caught:
        spec(**keys)
    return str(caught.value)


# -- accepted ---------------------------------------------------------------------------------


def test_headers_cookies_and_a_budget_load_and_write_back_to_the_same_spec() -> None:
    loaded = spec(
        headers={"Accept-Language": "fr-CH, fr;q=0.9", "X-Count": 5, "Authorization": f"Bearer {SECRET}"},
        cookies={"sid": SECRET, "consent": '"yes"'},
        budget=5,
    )
    assert loaded.headers == {"Accept-Language": "fr-CH, fr;q=0.9", "X-Count": "5", "Authorization": f"Bearer {SECRET}"}
    assert loaded.cookies == {"sid": SECRET, "consent": '"yes"'}
    assert loaded.budget == 5.0
    assert parse_spec(spec_document(loaded)) == loaded


def test_a_spec_file_gives_them_in_yaml() -> None:
    text = b"""
fields: {title: "css:title::text"}
headers:
  User-Agent: "Mozilla/5.0 (compatible; catalogue-bot)"
  Referer: https://shop.example/
cookies:
  session: abc123
budget: 0.5
"""
    loaded = spec_from_bytes(text, "job.yaml")
    assert loaded.headers == {
        "User-Agent": "Mozilla/5.0 (compatible; catalogue-bot)",
        "Referer": "https://shop.example/",
    }
    assert loaded.cookies == {"session": "abc123"}
    assert loaded.budget == 0.5


def test_a_spec_without_them_stays_as_it_was_on_the_wire() -> None:
    loaded = spec()
    assert loaded.headers is None and loaded.cookies is None and loaded.budget is None
    assert b"headers" not in encode(Task(id="t", job="j", url="http://a.test/", domain="a.test", spec=loaded))


def test_a_value_is_stripped_of_the_spaces_around_it_as_a_header_value_is() -> None:
    assert spec(headers={"X-A": "  b c\t"}).headers == {"X-A": "b c"}


# -- refused, with the key named and the value never quoted -------------------------------------


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"headers": {"X-Token": f"{SECRET}\r\nX-Injected: 1"}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": f"{SECRET}\n"}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": f"{SECRET}\x00"}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": f"{SECRET}\x7f"}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": f"{SECRET}é"}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": [SECRET]}}, "headers: 'X-Token'"),
        ({"headers": {"X-Token": True}}, "headers: 'X-Token'"),
        ({"cookies": {"sid": f"{SECRET} x"}}, "cookies: 'sid'"),
        ({"cookies": {"sid": f"{SECRET};admin=1"}}, "cookies: 'sid'"),
        ({"cookies": {"sid": f"{SECRET},x"}}, "cookies: 'sid'"),
        ({"cookies": {"sid": f"{SECRET}\r\n"}}, "cookies: 'sid'"),
        ({"cookies": {"sid": {"nested": SECRET}}}, "cookies: 'sid'"),
    ],
)
def test_a_value_that_cannot_go_on_the_wire_is_refused_naming_its_key_not_its_value(
    keys: dict[str, Any], named: str
) -> None:
    message = refusal(**keys)
    assert message.startswith(f"job.yaml: {named}: ")
    assert SECRET not in message and "\n" not in message


@pytest.mark.parametrize("name", ["X Token", "X:Token", "", "Ünï", "X\r\nY", "(x)", "a/b"])
def test_a_header_or_cookie_name_must_be_a_token(name: str) -> None:
    assert "is not a valid name" in refusal(headers={name: "1"})
    assert "is not a valid name" in refusal(cookies={name: "1"})


@pytest.mark.parametrize(
    "name",
    ["Host", "content-length", "Transfer-Encoding", "Connection", "Keep-Alive", "TE", "Trailer", "Upgrade",
     "Expect", "Accept-Encoding", "Proxy-Authorization", "proxy-connection", "Proxy-Anything"],
)  # fmt: skip
def test_headers_the_fetcher_owns_are_refused(name: str) -> None:
    expected = f"job.yaml: headers: {name!r}: the fetcher sets this header itself; it cannot be given"
    assert refusal(headers={name: "x"}) == expected


def test_a_cookie_header_is_refused_beside_cookies_and_taken_alone() -> None:
    assert "give cookies in cookies: only" in refusal(headers={"Cookie": "a=1"}, cookies={"b": "2"})
    assert spec(headers={"Cookie": "a=1"}).headers == {"Cookie": "a=1"}


def test_a_header_given_twice_in_another_case_is_refused() -> None:
    assert "given twice" in refusal(headers={"X-A": "1", "x-a": "2"})


def test_counts_and_the_head_size_are_bounded() -> None:
    many = {f"X-{i}": "1" for i in range(MAX_ENTRIES + 1)}
    assert refusal(headers=many) == f"job.yaml: headers: {MAX_ENTRIES + 1} headers; at most {MAX_ENTRIES}"
    assert refusal(cookies={f"c{i}": "1" for i in range(MAX_ENTRIES + 1)}).startswith("job.yaml: cookies: 51 cookies")
    assert spec(headers={f"X-{i}": "1" for i in range(MAX_ENTRIES)}).headers is not None
    big = {"X-A": "a" * (MAX_BYTES // 2), "X-B": "b" * (MAX_BYTES // 2)}
    assert "at most 8,192" in refusal(headers=big)
    assert "at most 8,192" in refusal(headers={"X-A": "a" * (MAX_BYTES // 2)}, cookies={"c": "c" * (MAX_BYTES // 2)})


@pytest.mark.parametrize("budget", [0, -1, True, "5", float("inf"), float("nan"), 1e13, None])
def test_a_budget_is_a_number_above_zero(budget: object) -> None:
    assert refusal(budget=budget).startswith("job.yaml: budget: expected a number above 0")


def test_headers_must_be_a_mapping() -> None:
    assert refusal(headers=["X-A: 1"]) == "job.yaml: headers: expected a mapping of header names to values"
    assert refusal(cookies="sid=1") == "job.yaml: cookies: expected a mapping of cookie names to values"


def test_a_message_from_the_wire_meets_the_same_rules_and_its_error_quotes_no_value() -> None:
    """A hand-made intake message or task is held to the spec file's rules: a bad value would
    otherwise fail each request with an error that quotes it."""
    body = {"v": 1, "job": "j", "urls": ["http://a.test/"], "spec": {"fields": {}, "cookies": {"sid": f"{SECRET}\r\n"}}}
    with pytest.raises(DecodeError) as caught:
        decode(json.dumps(body).encode(), Submission)
    assert "cookies: 'sid'" in str(caught.value) and SECRET not in str(caught.value)
    with pytest.raises(Exception) as direct:
        Spec.model_validate({"fields": {}, "headers": {"Host": SECRET}})
    assert SECRET not in str(direct.value)
    stripped = decode(
        json.dumps({**body, "spec": {"fields": {}, "headers": {"X-A": f" {SECRET} "}}}).encode(), Submission
    )
    assert stripped.spec is not None and stripped.spec.headers == {"X-A": SECRET}


def test_check_options_raises_its_own_error_for_callers_outside_a_spec() -> None:
    with pytest.raises(OptionsError):
        check_options({"Host": "x"}, None)
    assert check_options(None, None) == ({}, {})


# -- what a request sends ------------------------------------------------------------------------


def test_cookies_go_as_one_cookie_header_beside_the_headers() -> None:
    sent = request_headers(
        {"Accept-Language": "fr"}, {"sid": "abc", "consent": "yes"}, "http://a.test/p", "http://a.test/p"
    )
    assert sent == {"Accept-Language": "fr", "Cookie": "sid=abc; consent=yes"}


def test_after_a_redirect_to_another_host_credentials_stay_behind_and_other_headers_go_on() -> None:
    headers = {"Accept-Language": "fr", "Authorization": "Bearer x", "cookie": "a=1"}
    sent = request_headers(headers, {}, "https://cdn.other.test/p", "https://a.test/p")
    assert sent == {"Accept-Language": "fr"}
    sent = request_headers({}, {"sid": "abc"}, "https://www.a.test/p", "https://a.test/p")
    assert sent == {}  # a host-only cookie, as a browser keeps one given without Domain


def test_a_redirect_within_the_host_keeps_the_cookies_whatever_the_scheme_port_or_case() -> None:
    sent = request_headers({}, {"sid": "abc"}, "http://A.TEST:8080/login", "https://a.test/p")
    assert sent == {"Cookie": "sid=abc"}


def test_a_spec_without_options_adds_nothing() -> None:
    assert request_headers({}, {}, "http://a.test/", "http://a.test/") == {}


# -- what a person is shown ----------------------------------------------------------------------


def options_task() -> Task:
    rule = FieldRule(kind="css", expr="title::text")
    options = Spec(fields={"title": rule}, headers={"Authorization": SECRET}, cookies={"sid": SECRET})
    return Task(id="t", job="j", url="http://a.test/", domain="a.test", spec=options)


def test_a_dead_letter_is_shown_with_the_names_and_without_the_values() -> None:
    letter = json.loads(encode(options_task().dead_letter("fetch", "not_found", "HTTP 404")))
    shown = redact({"id": 1, "letter": letter})
    assert SECRET not in json.dumps(shown)
    spec_shown = shown["letter"]["task"]["spec"]
    assert spec_shown["headers"] == {"Authorization": REDACTED}
    assert spec_shown["cookies"] == {"sid": REDACTED}
    assert spec_shown["fields"] == letter["task"]["spec"]["fields"]
    assert letter["task"]["spec"]["cookies"] == {"sid": SECRET}  # the letter itself is untouched


def test_json_text_inside_is_redacted_too_even_cut_short() -> None:
    raw = encode(options_task()).decode()
    assert SECRET in raw
    for text in (raw, raw[: raw.index(SECRET) + 5], raw[: raw.rindex(SECRET) + 3]):
        letter = DeadLetter(stage="fetch", reason="decode", raw=text)
        shown = redact(json.loads(encode(letter)))
        assert SECRET[:5] not in json.dumps(shown), text
    assert redact({"raw": '{"headers": {"X-A": "1"}, "other": "kept"}'}) == {
        "raw": f'{{"headers": {{"X-A": "{REDACTED}"}}, "other": "kept"}}'
    }


def test_redaction_leaves_everything_else_as_it_was() -> None:
    letter = json.loads(encode(Task(id="t", job="j", url="http://a.test/", domain="a.test").dead_letter("fetch", "x")))
    assert redact(letter) == letter


def test_the_readmes_request_options_example_loads() -> None:
    import textwrap
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = text.split("- A spec may give **request options**")[1].split("```yaml")[1].split("```")[0]
    loaded = spec_from_bytes(textwrap.dedent(block).encode(), "README.md")
    assert loaded.cookies == {"session": "abc123", "consent": "yes"}
    assert loaded.headers is not None and set(loaded.headers) == {"Accept-Language", "Authorization", "User-Agent"}
    assert loaded.budget == 5.0
    assert request_headers(loaded.headers, loaded.cookies, "https://a.test/", "https://a.test/")["Cookie"] == (
        "session=abc123; consent=yes"
    )
