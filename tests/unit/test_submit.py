"""Checking a URL file before a submit: line numbers, skipped lines, comments and encodings.

Only `check_urls` (and the `valid_urls` reader it pairs with) are tested: `submit` needs a broker.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from hutch.services.control import submit as submit_module
from hutch.services.control.submit import (
    JobNameError,
    UrlFileError,
    check_job_name,
    check_urls,
    default_job_name,
    submissions,
    valid_urls,
)


def url_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "urls.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_valid_url_is_counted(tmp_path: Path) -> None:
    path = url_file(tmp_path, "http://a.example/1\nhttps://b.example/2\nhttp://127.0.0.1:8001/3\n")
    checked = check_urls(path)
    assert checked.valid == 3
    assert checked.skipped == []


def test_blank_lines_and_comments_are_ignored(tmp_path: Path) -> None:
    path = url_file(tmp_path, "# my job\n\nhttp://a.example/1\n   \n  # indented comment\nhttp://a.example/2")
    assert check_urls(path).valid == 2


def test_surrounding_white_space_on_a_line_is_ignored(tmp_path: Path) -> None:
    path = url_file(tmp_path, "   http://a.example/1\t \r\n")
    assert check_urls(path).valid == 1


def test_an_invalid_line_refuses_the_file_with_its_line_number(tmp_path: Path) -> None:
    path = url_file(tmp_path, "# header\nhttp://a.example/1\n\nftp://b.example/2\nnot a url\n")
    with pytest.raises(UrlFileError, match=r"urls.txt line 4: not an http or https URL: 'ftp://b.example/2'"):
        check_urls(path)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("http://a b.example/", "white space"),
        ("http:///nohost", "no host"),
        ("http://a.example:99999/", "port"),
        ("http://a..example.com/x", "not a valid domain name"),
        ("http://xn--/x", "not a valid domain name"),
        ("http://u:p@a.example/", "credentials"),
        ("http://a.example/\x1b[2J", "control character"),
    ],
)
def test_the_refusal_says_why_the_line_is_invalid(tmp_path: Path, line: str, why: str) -> None:
    path = url_file(tmp_path, f"http://ok.example/\n{line}\n")
    with pytest.raises(UrlFileError, match=f"line 2: .*{why}"):
        check_urls(path)


def test_skip_invalid_collects_the_skipped_lines_with_number_text_and_reason(tmp_path: Path) -> None:
    path = url_file(
        tmp_path, "http://a.example/1\nftp://b.example/\n# comment\nhttp://c.example/3\nhttp:///x\n"
    )
    checked = check_urls(path, skip_invalid=True)
    assert checked.valid == 2
    assert [(number, text) for number, text, _ in checked.skipped] == [
        (2, "ftp://b.example/"),
        (5, "http:///x"),
    ]
    assert "not an http or https URL" in checked.skipped[0][2]
    assert "no host" in checked.skipped[1][2]


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n  # and more\n"])
def test_a_file_without_any_url_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(UrlFileError, match="holds no valid URL"):
        check_urls(url_file(tmp_path, text))


def test_a_file_whose_every_line_is_skipped_is_refused(tmp_path: Path) -> None:
    path = url_file(tmp_path, "ftp://a.example/\nnope\n")
    with pytest.raises(UrlFileError, match="holds no valid URL"):
        check_urls(path, skip_invalid=True)


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_bytes("http://a.example/1\nhttp://b.example/café\n".encode("latin-1"))
    with pytest.raises(UrlFileError, match="is not UTF-8 text"):
        check_urls(path)


def test_a_missing_file_is_refused_with_a_url_file_error(tmp_path: Path) -> None:
    with pytest.raises(UrlFileError, match="cannot read"):
        check_urls(tmp_path / "absent.txt")


def test_non_ascii_urls_in_a_utf8_file_are_valid(tmp_path: Path) -> None:
    path = url_file(tmp_path, "http://bücher.example/straße\n")
    assert check_urls(path).valid == 1


def test_a_utf8_file_with_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"http://a.example/1\nhttp://a.example/2\n")
    assert check_urls(path).valid == 2


def test_valid_urls_yields_the_urls_check_urls_counted(tmp_path: Path) -> None:
    path = url_file(tmp_path, "# c\n  http://a.example/1 \nftp://x/\n\nhttp://b.example/2\n")
    assert list(valid_urls(path)) == ["http://a.example/1", "http://b.example/2"]
    assert check_urls(path, skip_invalid=True).valid == 2


def test_a_line_over_the_url_byte_cap_is_refused_with_its_line_number(tmp_path: Path) -> None:
    path = url_file(tmp_path, "http://a.example/1\nhttp://a.example/" + "x" * 100 + "\n")
    with pytest.raises(UrlFileError, match=r"line 2: URL is 117 bytes, over the limit of 64"):
        check_urls(path, max_url_bytes=64)
    assert list(valid_urls(path, max_url_bytes=64)) == ["http://a.example/1"]


def test_skip_invalid_refuses_nothing_it_lists_the_malformed_hosts_of_issue_10(tmp_path: Path) -> None:
    bad = ["http://a..example.com/x", f"http://{'a' * 70}.example/x", "http://xn--/x"]
    path = url_file(tmp_path, "\n".join(["http://ok.example/", *bad]) + "\n")
    checked = check_urls(path, skip_invalid=True)
    assert checked.valid == 1
    assert [number for number, _, _ in checked.skipped] == [2, 3, 4]


# -- job names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["job", "my-job_2.v1", "A", "j" * 100, "-dash", "_under"])
def test_a_job_name_of_letters_digits_dots_dashes_and_underscores_is_valid(name: str) -> None:
    assert check_job_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "../x", "a/b", "a\\b", "..", ".hidden", "j" * 101, "x\x1b[2J", "two words", "caf\u00e9", "a\x00b"]
)
def test_a_job_name_that_could_become_another_path_is_refused(name: str) -> None:
    with pytest.raises(JobNameError, match=r"invalid job name .* letters, digits"):
        check_job_name(name)


def test_the_refusal_escapes_the_name() -> None:
    with pytest.raises(JobNameError) as info:
        check_job_name("x\x1b[2J")
    assert "\x1b" not in str(info.value)


@pytest.mark.parametrize(
    ("file", "job"),
    [("urls.txt", "urls"), ("my urls!.txt", "my-urls-"), (".hidden.txt", "hidden"), ("...txt", "job"),
     ("x" * 150 + ".txt", "x" * 100), ("b\u00fccher.txt", "b-cher")],
)
def test_the_default_job_name_from_a_file_name_is_always_valid(file: str, job: str) -> None:
    assert default_job_name(Path(file)) == job
    check_job_name(job)


def test_each_domains_first_url_goes_ahead_within_a_window_and_repeats_go_once() -> None:
    """A file sorted by site: every site's first URL leads its window, so each site's first
    fetch starts while the rest are recorded; the others keep the file's order."""
    urls = [f"http://site{s}.test/{n}" for s in range(3) for n in range(4)] + ["http://site0.test/0"]
    (message,) = submissions("job", urls, None)
    assert message.urls[:3] == ["http://site0.test/0", "http://site1.test/0", "http://site2.test/0"]
    assert message.urls[3:] == [u for u in urls[:-1] if not u.endswith("/0")]


def test_windows_and_messages_keep_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit_module, "LEAD_WINDOW", 6)
    monkeypatch.setattr(submit_module, "MAX_SUBMISSION_URLS", 4)
    urls = [f"http://a.test/{n}" for n in range(5)] + [f"http://b.test/{n}" for n in range(5)]
    messages = [m.urls for m in submissions("job", urls, None)]
    # Window 1: a/0..a/4, b/0 -> b/0 leads; window 2: b/1..b/4.
    assert messages == [
        ["http://a.test/0", "http://b.test/0", "http://a.test/1", "http://a.test/2"],
        ["http://a.test/3", "http://a.test/4"],
        ["http://b.test/1", "http://b.test/2", "http://b.test/3", "http://b.test/4"],
    ]
