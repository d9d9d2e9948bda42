"""Turning response bytes into text: the declared charset, else the page's own, else a guess.

Order: a byte-order mark; the charset of the Content-Type header; a `<meta charset>` or
`<meta http-equiv=Content-Type>` in the first 4 KiB; UTF-8 when the bytes are valid UTF-8;
charset detection; UTF-8 with replacement as the last resort. A declared charset that Python
does not know, or a codec that is not a text encoding (base64, zlib), is skipped.
"""

from __future__ import annotations

import codecs
import re

from charset_normalizer import from_bytes

_META = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.IGNORECASE)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


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
    if not content_type:
        return None
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return _known(value)
    return None


def _decode(body: bytes, charset: str) -> str | None:
    try:
        return body.decode(charset, "replace")
    except (LookupError, UnicodeError):  # e.g. idna, which has no "replace" handler
        return None


def decode_body(body: bytes, content_type: str | None) -> tuple[str, str]:
    """Return (text, charset used)."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body.decode(name, "replace"), name
    declared = declared_charset(content_type)
    if declared is None:
        match = _META.search(body[:4096])
        declared = _known(match.group(1).decode("ascii", "ignore")) if match else None
    if declared is not None:
        text = _decode(body, declared)
        if text is not None:
            return text, declared
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    best = from_bytes(body[:65536]).best()
    guessed = _known(best.encoding) if best is not None else None
    if guessed is not None:
        text = _decode(body, guessed)
        if text is not None:
            return text, guessed
    return body.decode("utf-8", "replace"), "utf-8"
