"""Turning response bytes into text: the declared charset, else the page's own, else a guess.

Order: a byte-order mark; the charset of the Content-Type header; a `<meta charset>` or
`<meta http-equiv=Content-Type>` in the first 4 KiB; charset detection; UTF-8 with
replacement as the last resort. A declared charset Python does not know is skipped.
"""

from __future__ import annotations

import codecs
import re

from charset_normalizer import from_bytes

_META = re.compile(
    rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.IGNORECASE
)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _known(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("\"'")).name
    except LookupError:
        return None


def declared_charset(content_type: str | None) -> str | None:
    if not content_type:
        return None
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return _known(value)
    return None


def decode_body(body: bytes, content_type: str | None) -> tuple[str, str]:
    """Return (text, charset used)."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body.decode(name, "replace"), name
    charset = declared_charset(content_type)
    if charset is None:
        match = _META.search(body[:4096])
        charset = _known(match.group(1).decode("ascii", "ignore")) if match else None
    if charset is None and body:
        best = from_bytes(body[:65536]).best()
        charset = _known(best.encoding) if best is not None else None
    charset = charset or "utf-8"
    return body.decode(charset, "replace"), charset
