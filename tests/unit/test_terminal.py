"""The CLI's one escaping helper: no control or bidi character reaches the terminal raw."""

from __future__ import annotations

import json

import pytest

from hutch.services.control.terminal import json_text, shown


@pytest.mark.parametrize(
    ("raw", "printed"),
    [
        ("clear\x1b[2J", "clear\\x1b[2J"),
        ("title\x1b]0;owned\x07", "title\\x1b]0;owned\\x07"),
        ("csi\x9b31m", "csi\\x9b31m"),
        ("nul\x00del\x7f", "nul\\x00del\\x7f"),
        ("line\nbreak\r\t", "line\\x0abreak\\x0d\\x09"),
        ("bidi\u202eevil\u2066", "bidi\\u202eevil\\u2066"),
    ],
)
def test_control_and_bidi_characters_are_printed_as_escapes(raw: str, printed: str) -> None:
    assert shown(raw) == printed


def test_ordinary_text_and_non_ascii_letters_are_left_alone() -> None:
    text = "http://xn--bcher-kva.example/straße?q=1 — Bücher \\ ok"
    assert shown(text) == text


def test_shown_takes_any_object() -> None:
    assert shown(ValueError("bad\x1b")) == "bad\\x1b"


def test_json_text_is_valid_json_of_the_same_value_with_nothing_raw() -> None:
    value = {"reason": "evil\x1b[2J\x9b\u202e", "title": "Bücher", "n": [1, 2]}
    text = json_text(value, indent=2)
    assert json.loads(text) == value
    assert not set(text) & {"\x1b", "\x9b", "\u202e"}
    assert "Bücher" in text and "\n  " in text  # readable: non-ASCII kept, indentation kept
