"""A job's request options: the headers and cookies its spec asks every fetch to send.

A spec's `headers:` and `cookies:` are outside input that ends up on the wire, so they are
checked before anything is queued (at spec load, and again wherever a `Spec` is decoded from
a message, so a hand-made intake message is held to the same rules): header and cookie names
are RFC 9110 tokens; header values are visible ASCII, spaces and tabs (httpx encodes them as
ASCII, and h11 refuses CR, LF and NUL: either would fail the request with an error that
quotes the value); cookie values are RFC 6265 cookie-octets. At most `MAX_ENTRIES` of each,
and `MAX_BYTES` for the whole head they add. Headers the fetcher must own are refused: the
framing and hop-by-hop ones, `Host`, `Accept-Encoding` (the fetcher undoes only the encodings
it offers, within its caps), every `Proxy-*` (the proxy-manager's), and `Cookie` when
`cookies:` is given (the cookies become that header).

Every error names the key and never quotes a value: a value may be a credential (a session
cookie, an `Authorization` token), and errors are printed, logged and kept in dead letters.
For the same reason what shows a task, a spec or a dead letter to a person runs it through
`redact` first; the broker and the store hold the values as they hold the rest of the spec.

Credentials stay on the host they were given for, as a browser's host-only cookie does: the
`Cookie` header (from `cookies:` or `headers:`) and `Authorization` are sent only while the
URL fetched has the host of the URL submitted; after a redirect to another host they are
left out, and the other headers go on (curl's rule for `--location`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

MAX_ENTRIES = 50  # headers, and cookies, one spec may give
MAX_BYTES = 8 * 1024  # the request head they add, counted as sent (`Name: value` and CRLF)
_NAME_CHARS = 100  # of a name quoted in an error

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[\t\x20-\x7e]*")
_COOKIE_VALUE = re.compile(r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*|"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"')
# What the fetcher sends or must decide itself; `proxy-*` is refused by its prefix.
OWNED = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade",
    "expect", "accept-encoding",
})  # fmt: skip
CREDENTIALS = frozenset({"cookie", "authorization"})  # kept to the submitted URL's host
REDACTED = "[redacted]"


class OptionsError(ValueError):
    """Headers or cookies a spec may not give; the message names the key, never a value."""


def _name(where: str, name: object) -> str:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        shown = repr(name)[:_NAME_CHARS] if isinstance(name, str) else type(name).__name__
        raise OptionsError(f"{where}: {shown} is not a valid name (letters, digits and !#$%&'*+-.^_`|~ only)")
    return name


def check_headers(data: object, with_cookies: bool = False) -> dict[str, str]:
    """`data` as a spec's `headers:`, checked; `with_cookies` when the spec gives `cookies:` too."""
    if not isinstance(data, Mapping):
        raise OptionsError("headers: expected a mapping of header names to values")
    if len(data) > MAX_ENTRIES:
        raise OptionsError(f"headers: {len(data)} headers; at most {MAX_ENTRIES}")
    checked: dict[str, str] = {}
    seen: set[str] = set()
    for key, value in data.items():
        name = _name("headers", key)
        where = f"headers: {name!r}"
        lower = name.lower()
        if lower in seen:
            raise OptionsError(f"{where}: given twice (header names are case-insensitive)")
        seen.add(lower)
        if lower in OWNED or lower.startswith("proxy-"):
            raise OptionsError(f"{where}: the fetcher sets this header itself; it cannot be given")
        if lower == "cookie" and with_cookies:
            raise OptionsError(f"{where}: give cookies in cookies: only (they are sent as one Cookie header)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise OptionsError(f"{where}: the value must be text, got {type(value).__name__}")
        text = str(value).strip(" \t")
        if not _VALUE.fullmatch(text):
            raise OptionsError(
                f"{where}: the value holds a character a header cannot carry (CR, LF, NUL or another control "
                "character, or non-ASCII text: percent-encode it)"
            )
        checked[name] = text
    return checked


def check_cookies(data: object) -> dict[str, str]:
    """`data` as a spec's `cookies:`, checked."""
    if not isinstance(data, Mapping):
        raise OptionsError("cookies: expected a mapping of cookie names to values")
    if len(data) > MAX_ENTRIES:
        raise OptionsError(f"cookies: {len(data)} cookies; at most {MAX_ENTRIES}")
    checked: dict[str, str] = {}
    for key, value in data.items():
        name = _name("cookies", key)
        where = f"cookies: {name!r}"
        if name in checked:
            raise OptionsError(f"{where}: given twice")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise OptionsError(f"{where}: the value must be text, got {type(value).__name__}")
        text = str(value)
        if not _COOKIE_VALUE.fullmatch(text):
            raise OptionsError(
                f"{where}: the value holds a character a cookie cannot carry (a space, a control character, "
                '" , ; \\ or non-ASCII text: percent-encode it)'
            )
        checked[name] = text
    return checked


def cookie_header(cookies: Mapping[str, str]) -> str:
    """The `Cookie` header that carries `cookies` (RFC 6265: `a=1; b=2`)."""
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


def check_size(headers: Mapping[str, str], cookies: Mapping[str, str]) -> None:
    """The request head `headers` and `cookies` add stays within `MAX_BYTES`."""
    size = sum(len(name) + len(value) + 4 for name, value in headers.items())
    if cookies:
        size += len("Cookie") + len(cookie_header(cookies)) + 4
    if size > MAX_BYTES:
        raise OptionsError(f"headers: and cookies: add {size:,} bytes to each request; at most {MAX_BYTES:,}")


def check_options(headers: object, cookies: object) -> tuple[dict[str, str], dict[str, str]]:
    """A spec's `headers:` and `cookies:` (either may be empty), checked together."""
    checked_cookies = check_cookies(cookies) if cookies else {}
    checked_headers = check_headers(headers, with_cookies=bool(checked_cookies)) if headers else {}
    check_size(checked_headers, checked_cookies)
    return checked_headers, checked_cookies


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def request_headers(
    headers: Mapping[str, str], cookies: Mapping[str, str], fetch_url: str, submitted_url: str
) -> dict[str, str]:
    """What one attempt sends beside the fetcher's own headers: the job's `headers`, and its
    `cookies` as one `Cookie` header; credentials only while `fetch_url` (a redirect's next
    hop) has the host of `submitted_url`."""
    if not headers and not cookies:
        return {}
    same_host = _host(fetch_url) == _host(submitted_url) != ""
    sent = {name: value for name, value in headers.items() if same_host or name.lower() not in CREDENTIALS}
    if cookies and same_host:
        sent["Cookie"] = cookie_header(cookies)
    return sent


# A JSON mapping of strings under `"headers"` or `"cookies"`, whole or cut short (a dead
# letter keeps at most 64 KiB of an undecodable body), and each of its string values.
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_OPTIONS_IN_JSON = re.compile(
    rf'("(?:headers|cookies)"\s*:\s*)(\{{\s*(?:{_JSON_STRING}\s*:\s*(?:{_JSON_STRING}|"(?:[^"\\]|\\.)*$)\s*,?\s*)*\}}?)'
)
_VALUE_IN_JSON = re.compile(rf'(:\s*)(?:{_JSON_STRING}|"(?:[^"\\]|\\.)*$)')


def _redact_json_text(text: str) -> str:
    if '"headers"' not in text and '"cookies"' not in text:
        return text
    return _OPTIONS_IN_JSON.sub(
        lambda m: m.group(1) + _VALUE_IN_JSON.sub(lambda v: f'{v.group(1)}"{REDACTED}"', m.group(2)), text
    )


def redact(value: Any) -> Any:
    """`value` (a task, spec or dead letter as JSON data) with every header and cookie value
    of a spec replaced by `[redacted]`, names kept; JSON text inside it (a letter's raw body, a
    task's stored message) is redacted too. What a person is shown goes through this."""
    if isinstance(value, dict):
        shown: dict[Any, Any] = {}
        for key, item in value.items():
            if key == "spec" and isinstance(item, dict):
                item = {
                    k: ({n: REDACTED for n in v} if k in ("headers", "cookies") and isinstance(v, dict) else redact(v))
                    for k, v in item.items()
                }
                shown[key] = item
            else:
                shown[key] = redact(item)
        return shown
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str):
        return _redact_json_text(value)
    return value
