"""Response bytes to text: BOM, header charset, meta charset, detection, and what is skipped."""

from __future__ import annotations

import codecs

import pytest

from hutch.services.fetcher.charsets import declared_charset, decode_body

FRENCH = "Café Müller: crème brûlée, naïve façade, Straße"
JAPANESE = "東京の古本屋で見つけた本"
FRENCH_PROSE = (
    "Il était une fois, dans une forêt lointaine, un vieux château où vivait une reine très âgée. "
    "Chaque matin, elle se promenait près de la rivière et écoutait les oiseaux chanter. Les "
    "habitants du village voisin lui apportaient du pain frais, des pommes et du fromage."
)


def page(text: str, head: str = "") -> str:
    return (
        f"<!DOCTYPE html>\n<html><head>{head}<title>sample</title></head>\n"
        f'<body><p class="sample">{text}</p></body></html>\n'
    )


# -- the Content-Type header ---------------------------------------------------------------------


def test_the_header_charset_is_used() -> None:
    body = page(FRENCH).encode("latin-1")
    text, charset = decode_body(body, "text/html; charset=ISO-8859-1")
    assert FRENCH in text
    assert charset == "cp1252"  # as browsers read a declared latin-1


def test_the_header_charset_wins_over_a_meta_charset() -> None:
    body = page(JAPANESE, '<meta charset="utf-8">').encode("shift_jis")
    text, charset = decode_body(body, "text/html; charset=Shift_JIS")
    assert JAPANESE in text
    assert charset == "cp932"  # as browsers read a declared Shift_JIS


@pytest.mark.parametrize(
    "content_type",
    ['text/html; charset="utf-8"', "text/html;charset=UTF-8", "text/html; boundary=x; Charset = utf-8"],
)
def test_the_header_charset_may_be_quoted_spaced_or_capitalised(content_type: str) -> None:
    assert declared_charset(content_type) == "utf-8"


@pytest.mark.parametrize("content_type", [None, "", "text/html", "text/html; boundary=x", "charset=utf-8"])
def test_a_header_without_a_charset_parameter_declares_nothing(content_type: str | None) -> None:
    assert declared_charset(content_type) is None


def test_an_unknown_header_charset_is_skipped_for_the_meta_charset() -> None:
    body = page(FRENCH, '<meta charset="windows-1252">').encode("cp1252")
    text, charset = decode_body(body, "text/html; charset=x-no-such-charset")
    assert FRENCH in text
    assert charset == "cp1252"


def test_an_unknown_header_charset_falls_through_to_detection() -> None:
    body = page(JAPANESE).encode("shift_jis")
    text, _ = decode_body(body, "text/html; charset=klingon")
    assert JAPANESE in text


# -- the meta tag --------------------------------------------------------------------------------


def test_a_meta_charset_is_used_without_a_header_charset() -> None:
    body = page(FRENCH, '<meta charset="iso-8859-1">').encode("latin-1")
    text, charset = decode_body(body, "text/html")
    assert FRENCH in text
    assert charset == "cp1252"


def test_a_meta_http_equiv_content_type_is_used() -> None:
    head = '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">'
    body = page(JAPANESE, head).encode("shift_jis")
    text, charset = decode_body(body, None)
    assert JAPANESE in text
    assert charset == "cp932"


def test_an_unquoted_upper_case_meta_charset_is_used() -> None:
    body = page(FRENCH, "<META CHARSET=windows-1252>").encode("cp1252")
    assert decode_body(body, None)[1] == "cp1252"


def test_an_unknown_meta_charset_is_skipped() -> None:
    body = page(JAPANESE, '<meta charset="no-such-thing">').encode("shift_jis")
    text, charset = decode_body(body, None)
    assert JAPANESE in text
    assert charset != "no-such-thing"


# -- byte-order marks ----------------------------------------------------------------------------


def test_a_utf8_bom_wins_over_a_contradicting_header_and_is_dropped() -> None:
    body = codecs.BOM_UTF8 + page(FRENCH).encode("utf-8")
    text, charset = decode_body(body, "text/html; charset=iso-8859-1")
    assert charset == "utf-8"
    assert FRENCH in text
    assert not text.startswith("\ufeff")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_bom_is_honoured_in_either_byte_order(encoding: str) -> None:
    bom = codecs.BOM_UTF16_LE if encoding.endswith("le") else codecs.BOM_UTF16_BE
    body = bom + page(JAPANESE, '<meta charset="utf-8">').encode(encoding)
    text, charset = decode_body(body, "text/html; charset=utf-8")
    assert charset == encoding
    assert JAPANESE in text
    assert not text.startswith("\ufeff")


# -- detection -----------------------------------------------------------------------------------


def test_undeclared_latin1_prose_is_detected() -> None:
    text, _ = decode_body(page(FRENCH_PROSE).encode("latin-1"), None)
    assert FRENCH_PROSE in text


def test_an_undeclared_short_latin1_page_is_not_read_as_central_european() -> None:
    text, _ = decode_body(page(FRENCH).encode("latin-1"), None)
    assert FRENCH in text


def test_undeclared_shift_jis_text_is_detected() -> None:
    text, _ = decode_body(page(JAPANESE).encode("shift_jis"), "text/html")
    assert JAPANESE in text


def test_undeclared_utf8_text_is_read_as_utf8() -> None:
    text, _ = decode_body(page(FRENCH + " " + JAPANESE).encode("utf-8"), None)
    assert FRENCH in text
    assert JAPANESE in text


def test_an_empty_body_is_empty_utf8_text() -> None:
    assert decode_body(b"", None) == ("", "utf-8")


def test_bytes_invalid_in_the_declared_charset_are_replaced_not_raised() -> None:
    text, charset = decode_body(b"<p>ok \xff\xfe\xfd end</p>", "text/html; charset=utf-8")
    assert charset == "utf-8"
    assert text.startswith("<p>ok ")
    assert text.endswith(" end</p>")
    assert "\ufffd" in text


def test_the_returned_charset_is_a_python_codec_name() -> None:
    _, charset = decode_body(page(FRENCH).encode("latin-1"), "text/html; charset=latin1")
    assert codecs.lookup(charset).name == charset


# -- hostile declarations ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["base64", "hex", "zlib", "rot13", "idna"])
def test_a_declared_codec_that_is_not_a_text_encoding_is_skipped(name: str) -> None:
    text, charset = decode_body(b"<p>hello</p>", f"text/html; charset={name}")
    assert text == "<p>hello</p>"
    assert charset != codecs.lookup(name).name


def test_a_meta_charset_naming_a_non_text_codec_is_skipped() -> None:
    text, _ = decode_body(b'<meta charset="uu"><p>hello</p>', None)
    assert "hello" in text
