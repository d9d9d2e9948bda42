"""Turning response bytes into text as a browser would, with w3lib's encoding helpers.

In the order of w3lib's `html_to_unicode` (w3lib is installed with parsel): a byte-order
mark, then the Content-Type header's charset, then a `<meta charset>` or `<meta
http-equiv=Content-Type>`, each name mapped as browsers map it (a declared `latin-1` or
`ascii` is read as windows-1252, `shift_jis` as cp932). A declared charset that Python does
not know, or a codec that is not a text encoding (base64, uu, idna), is passed over.

An undeclared page is UTF-8 when its bytes are valid UTF-8. Otherwise charset-normalizer
guesses; a single-byte guess gives way to windows-1252, the browsers' default for undeclared
Western pages (a short French page is otherwise often guessed as cp1250, and è comes out as
č), while a multi-byte guess (Shift-JIS, GB 18030...) stands. UTF-8 with replacement is the
last resort.

A crawl's page whose body is a gzip file is the one exception (`page_text`): it is kept as
bytes for the parser, which reads it as a sitemap when it is one.
"""

from __future__ import annotations

import base64
import codecs
from functools import lru_cache

from charset_normalizer import from_bytes
from w3lib.encoding import html_body_declared_encoding, http_content_type_encoding, read_bom, to_unicode

WESTERN = "cp1252"


def _known(name: str | None) -> str | None:
    if not name:
        return None
    try:
        info = codecs.lookup(name.strip().strip("\"'"))
    except LookupError:
        return None
    # base64, zlib, rot13 and friends are codecs too, but not text encodings.
    return info.name if getattr(info, "_is_text_encoding", True) else None


def declared_charset(content_type: str | None) -> str | None:
    """The charset the Content-Type header declares, when Python knows it as a text encoding."""
    if not content_type:
        return None
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return _known(value)
    return None


@lru_cache(maxsize=64)
def _single_byte(charset: str) -> bool:
    """Every byte one character: a Western, Cyrillic, Greek... code page, not a multi-byte one."""
    try:
        return len(bytes(range(0x80, 0x100)).decode(charset, "replace")) == 0x80
    except (LookupError, UnicodeError):
        return False


def _guess(body: bytes) -> str | None:
    """The encoding of an undeclared body (w3lib's `auto_detect_fun`)."""
    try:
        body.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    best = from_bytes(body[:65536]).best()
    guessed = _known(best.encoding) if best is not None else None
    if guessed is not None and _single_byte(guessed):
        return WESTERN
    return guessed


def decode_body(body: bytes, content_type: str | None) -> tuple[str, str]:
    """Return (text, charset used)."""
    bom_charset, bom = read_bom(body)
    if bom_charset is not None and bom is not None:
        return to_unicode(body[len(bom) :], bom_charset), bom_charset
    for declared in (http_content_type_encoding(content_type), html_body_declared_encoding(body)):
        text = _decoded(body, declared)
        if text is not None:
            return text, str(declared)
    guessed = _guess(body)
    text = _decoded(body, guessed)
    if text is not None:
        return text, str(guessed)
    return body.decode("utf-8", "replace"), "utf-8"


def _decoded(body: bytes, charset: str | None) -> str | None:
    """`body` read as `charset`, or None when that is no text encoding Python can use."""
    if _known(charset) is None:
        return None
    try:
        return to_unicode(body, str(charset))
    except (LookupError, UnicodeError):  # idna, say, has no "replace" handler
        return None


GZIP_MAGIC = b"\x1f\x8b"


def page_text(body: bytes, content_type: str | None, crawl: bool) -> tuple[str, str | None]:
    """A page's text for the parser and, for a crawl's gzip file, its body as base64.

    `sitemap.xml.gz` is served as a file (application/gzip, no Content-Encoding): binary that
    no text can carry. In a crawl a body that starts with gzip's magic bytes goes to the parser
    as it is, base64, with no text; the parser inflates it under the body cap, and reads a
    body that is not a sitemap as text exactly as `decode_body` would have made it
    (services/parser/sitemaps.py). Every other body is `decode_body`'s text.
    """
    if crawl and body.startswith(GZIP_MAGIC):
        return "", base64.b64encode(body).decode("ascii")
    return decode_body(body, content_type)[0], None
