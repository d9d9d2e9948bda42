"""Versioned JSON messages: round trips, refusals as DecodeError, and stable task ids."""

from __future__ import annotations

import json

import pytest

from hutch.models import (
    MAX_PARKED,
    SCHEMA_VERSION,
    SPLIT_PREFIX,
    AnyEvent,
    Attempt,
    DeadLetter,
    DecodeError,
    Event,
    EventBatch,
    FieldRule,
    Item,
    Lease,
    LeaseRequest,
    Page,
    Parked,
    Permit,
    Spec,
    Task,
    decode,
    encode,
    task_id,
)


def make_task(**changes: object) -> Task:
    values: dict[str, object] = {
        "id": task_id("job-1", "http://example.com/a"),
        "job": "job-1",
        "url": "http://example.com/a",
        "domain": "example.com",
        "submitted_at": 1_700_000_000.0,
    }
    values.update(changes)
    return Task.model_validate(values)


def rich_task() -> Task:
    return make_task(
        spec=Spec(fields={"title": FieldRule(kind="css", expr="title::text")}),
        attempts=2,
        history=[
            Attempt(n=1, at=1.0, outcome="timeout", elapsed=5.0, delay=1.0, detail="ReadTimeout"),
            Attempt(n=2, at=9.0, outcome="blocked", status=403, proxy_id="px-abc", delay=5.0),
        ],
        failed_proxies=["px-abc"],
        permit=Permit(id="p-1", issued=10.0, expires=40.0),
    )


# -- round trips ---------------------------------------------------------------------------------


def test_a_task_with_history_spec_and_permit_survives_encode_and_decode() -> None:
    task = rich_task()
    assert decode(encode(task), Task) == task


def test_a_minimal_task_survives_encode_and_decode() -> None:
    task = make_task()
    assert decode(encode(task), Task) == task


@pytest.mark.parametrize(
    "message",
    [
        Page(task=make_task(), status=200, final_url="http://example.com/a", text="<p>é</p>", fetched_at=2.0),
        Item(task=make_task(), status=200, fields={"title": "T", "links": ["a", "b"], "n": 3}, parsed_at=3.0),
        DeadLetter(stage="fetch", reason="not_found", detail="HTTP 404", at=4.0, task=make_task()),
        DeadLetter(stage="parse", reason="decode", at=4.0, raw="{not json"),
        Event(kind="released", task_id="t1", job="j", domain="example.com", attempt=0, at=5.0),
        Event(
            kind="outcome",
            task_id="t1",
            job="j",
            domain="d",
            attempt=1,
            at=5.0,
            outcome="throttled",
            status=429,
            next="retry",
            delay=30.0,
        ),
        LeaseRequest(task_id="t1", domain="example.com", exclude=["px-1"]),
        Lease(proxy_id="px-1", url="http://u:p@proxy:8080", tier="residential"),
        Lease(direct=True),
    ],
    ids=lambda m: type(m).__name__,
)
def test_every_message_kind_survives_encode_and_decode(message: object) -> None:
    assert isinstance(message, (Page, Item, DeadLetter, Event, LeaseRequest, Lease))
    assert decode(encode(message), type(message)) == message


def test_parked_tasks_survive_encode_and_decode_and_each_becomes_its_own_dead_letter() -> None:
    tasks = [rich_task(), make_task(id=task_id("job-2", "http://example.com/b"), job="job-2")]
    parked = Parked(tasks=tasks)
    assert decode(encode(parked), Parked) == parked
    letters = parked.dead_letters("governor", "crashed", "died 50 times", "frontier.s.0")
    assert [letter.task for letter in letters] == tasks
    assert {(letter.stage, letter.reason, letter.detail, letter.queue) for letter in letters} == {
        ("governor", "crashed", "died 50 times", "frontier.s.0")
    }
    # Any other message is one letter, as before.
    assert [letter.task for letter in tasks[0].dead_letters("fetch", "not_found")] == [tasks[0]]


@pytest.mark.parametrize("count", [0, MAX_PARKED + 1])
def test_a_parked_message_with_no_task_or_too_many_is_refused(count: int) -> None:
    body = json.dumps({"v": 1, "tasks": [json.loads(encode(make_task())) for _ in range(count)]}).encode()
    with pytest.raises(DecodeError, match="Parked"):
        decode(body, Parked)


def make_page(text: str) -> Page:
    return Page(task=rich_task(), status=200, final_url="http://example.com/a", text=text, fetched_at=1.0)


PAGE_TEXTS = [
    '<html><title>"quoted"</title>\n<p>line\r\nbreaks\ttabs \\ backslash</p></html>',
    "<p>caf\u00e9 \u65e5\u672c \U0001f600 \u2028 \x00 nul</p>\n\n",
    "",
    "\n" * 3 + '{"v":2,"looks":"like a head"}\n',
]


@pytest.mark.parametrize("text", PAGE_TEXTS, ids=range(len(PAGE_TEXTS)))
def test_a_page_crosses_as_a_line_of_fields_then_its_text_as_utf8_and_comes_back_equal(text: str) -> None:
    page = make_page(text)
    body = encode(page)
    head, newline, rest = body.partition(b"\n")
    assert body.startswith(SPLIT_PREFIX) and newline == b"\n"
    assert rest == text.encode("utf-8")  # as it is: nothing escaped
    fields = json.loads(head)
    assert fields["v"] == 2 and "text" not in fields and fields["task"]["url"] == "http://example.com/a"
    assert decode(body, Page) == page


def test_a_page_as_one_json_object_the_first_form_still_decodes() -> None:
    page = make_page('<title>"old"</title>\n')
    assert decode(page.model_dump_json(exclude_none=True).encode(), Page) == page


def test_a_page_keeps_a_field_a_newer_producer_added_to_its_line() -> None:
    head, _, text = encode(make_page("<p>x</p>")).partition(b"\n")
    fields = json.loads(head)
    fields["added_later"] = 7
    page = decode(json.dumps(fields, separators=(",", ":")).encode() + b"\n" + text, Page)
    assert page.model_extra == {"added_later": 7} and page.text == "<p>x</p>"


def test_inside_a_dead_letter_a_page_stays_one_json_object_of_version_one() -> None:
    letter = make_page("<p>x</p>\n").dead_letter("parse", "parse_error", "boom")
    body = encode(letter)
    assert json.loads(body)["page"]["v"] == 1 and json.loads(body)["page"]["text"] == "<p>x</p>\n"
    assert decode(body, DeadLetter) == letter


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (SPLIT_PREFIX + b'"status":200}', "no line of fields"),
        (SPLIT_PREFIX + b'"status":200\n<p>', "no line of fields"),
        (SPLIT_PREFIX + b'"status":200,"final_url":"u","fetched_at":1.0}\n<p>', "task"),
    ],
)
def test_a_split_page_that_is_cut_or_lacks_a_field_fails_with_decode_error(body: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        decode(body, Page)


def test_a_split_page_whose_text_is_not_utf8_fails_with_decode_error_saying_where() -> None:
    head = encode(make_page("")).partition(b"\n")[0]
    with pytest.raises(DecodeError, match=r"not UTF-8.*byte 3"):
        decode(head + b"\n<p>\xff</p>", Page)


def test_an_item_keeps_fields_whose_value_is_none() -> None:
    item = Item(task=make_task(), status=200, fields={"title": None, "price": "3"}, parsed_at=1.0)
    assert decode(encode(item), Item).fields == {"title": None, "price": "3"}


def test_encoded_messages_are_json_carrying_the_schema_version() -> None:
    body = json.loads(encode(make_task()))
    assert body["v"] == SCHEMA_VERSION == 1
    assert body["url"] == "http://example.com/a"


def test_encode_leaves_out_fields_that_are_none() -> None:
    body = json.loads(encode(make_task()))
    assert "spec" not in body
    assert "permit" not in body


def test_a_body_without_v_decodes_as_version_one() -> None:
    body = json.loads(encode(make_task()))
    del body["v"]
    assert decode(json.dumps(body).encode(), Task).v == 1


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"{not json", b"[1, 2", b"\xff\xfe\x00garbage", b"null"])
def test_a_body_that_is_not_a_json_object_fails_with_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError, match="not a Task v1"):
        decode(body, Task)


def test_a_body_missing_a_required_field_fails_with_decode_error_naming_it() -> None:
    body = json.loads(encode(make_task()))
    del body["url"]
    with pytest.raises(DecodeError, match="url"):
        decode(json.dumps(body).encode(), Task)


def test_a_field_of_the_wrong_type_fails_with_decode_error_naming_it() -> None:
    body = json.loads(encode(make_task()))
    body["attempts"] = "many"
    with pytest.raises(DecodeError, match="attempts"):
        decode(json.dumps(body).encode(), Task)


def test_a_message_of_another_kind_fails_with_decode_error() -> None:
    event = Event(kind="released", task_id="t", job="j", domain="d", attempt=0)
    with pytest.raises(DecodeError, match="not a Task v1"):
        decode(encode(event), Task)


def test_an_unknown_schema_version_fails_with_decode_error() -> None:
    body = json.loads(encode(make_task()))
    body["v"] = 2
    with pytest.raises(DecodeError, match="v"):
        decode(json.dumps(body).encode(), Task)


def test_a_field_a_newer_producer_added_is_read_and_kept_when_the_message_is_passed_on() -> None:
    body = json.loads(encode(make_task()))
    body["priority"] = 5
    task = decode(json.dumps(body).encode(), Task)
    assert task.url == make_task().url
    retried = task.model_copy(update={"attempts": task.attempts + 1})
    again = json.loads(encode(retried))
    assert again["priority"] == 5 and again["attempts"] == task.attempts + 1


def test_a_field_added_to_a_nested_model_is_kept_too() -> None:
    body = json.loads(encode(rich_task()))
    body["history"][0]["colour"] = "red"
    task = decode(json.dumps(body).encode(), Task)
    assert json.loads(encode(task))["history"][0]["colour"] == "red"


def test_a_newer_schema_version_is_refused_saying_which_version_came_and_which_is_read() -> None:
    body = json.loads(encode(make_task()))
    body["v"] = 2
    with pytest.raises(DecodeError, match="schema version '2' at v: this Hutch reads version 1; upgrade it"):
        decode(json.dumps(body).encode(), Task)


def test_an_unknown_selector_kind_in_a_spec_fails_with_decode_error() -> None:
    body = json.loads(encode(rich_task()))
    body["spec"]["fields"]["title"]["kind"] = "regex"
    with pytest.raises(DecodeError, match="kind"):
        decode(json.dumps(body).encode(), Task)


def test_an_unknown_event_kind_fails_with_decode_error() -> None:
    body = json.loads(encode(Event(kind="released", task_id="t", job="j", domain="d", attempt=0)))
    body["kind"] = "vanished"
    with pytest.raises(DecodeError, match="kind"):
        decode(json.dumps(body).encode(), Event)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


# -- task ids ------------------------------------------------------------------------------------


def test_task_id_is_stable_for_the_same_job_and_url() -> None:
    assert task_id("job", "http://example.com/") == task_id("job", "http://example.com/")


def test_task_id_depends_on_the_job() -> None:
    assert task_id("job-a", "http://example.com/") != task_id("job-b", "http://example.com/")


def test_task_id_depends_on_the_url() -> None:
    assert task_id("job", "http://example.com/a") != task_id("job", "http://example.com/b")


def test_task_id_does_not_confuse_the_boundary_between_job_and_url() -> None:
    assert task_id("ab", "c") != task_id("a", "bc")


def test_task_id_is_32_lower_case_hex_digits() -> None:
    tid = task_id("job", "http://example.com/")
    assert len(tid) == 32
    assert set(tid) <= set("0123456789abcdef")


def test_task_id_keeps_its_known_value_so_a_resubmit_after_an_upgrade_matches() -> None:
    # Changing the derivation would make a resubmit store every URL of a job a second time.
    assert task_id("job", "http://example.com/") == "cdee531742ec2285518afe132c2a547e"


def test_the_events_queues_decode_one_event_or_a_batch_of_them() -> None:
    one = Event(kind="outcome", task_id="t1", job="j", domain="a.example", attempt=1, outcome="ok")
    two = Event(kind="released", task_id="t2", job="j", domain="b.example", attempt=0)
    batch = EventBatch(events=[two, one])
    assert decode(encode(one), AnyEvent).events() == [one]
    assert decode(encode(batch), AnyEvent).events() == [two, one]
    with pytest.raises(DecodeError):
        decode(b'{"v": 1, "events": [{"kind": "released"}]}', AnyEvent)
