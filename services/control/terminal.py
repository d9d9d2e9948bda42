"""Text from outside, made safe to print: the CLI never writes a control character raw.

URLs, reasons, details, job and domain names come from URL files, sites and stored letters.
A terminal obeys what it is sent: `ESC [ 2 J` clears the screen, `ESC ] 0 ;` retitles the
window, a C1 `CSI` (U+009B) does the same on some terminals, and a bidi override makes a line
read other than it is. So every such character is printed as an escape instead: `\\x1b`,
`\\x9b`, `\\u202e` in text, `\\u001b`-style escapes in JSON (still valid JSON).
"""

from __future__ import annotations

import json
import re
from typing import Any

# C0 controls, DEL, C1 controls, and the bidi embeddings, overrides and isolates.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# In JSON, C0 is escaped inside strings already, and outside them is only indentation.
_UNSAFE_IN_JSON = re.compile(r"[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object) -> str:
    """`text` (or its str()) with every control and bidi character escaped, the rest as is."""
    return _UNSAFE.sub(_escape, str(text))


def json_text(value: Any, **options: Any) -> str:
    """`json.dumps(value)` readable (non-ASCII kept) but with no control or bidi character raw.

    JSON escapes C0 itself; the others can only be inside strings, where `\\uXXXX` is valid.
    """
    text = json.dumps(value, ensure_ascii=False, **options)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
