"""Hostile answers: redirects to targets Hutch must refuse. See the package docstring.

Each route answers one 302 whose `Location` breaks one rule of the URL validator (or, for
the metadata address, the SSRF guard). Before the validator, the four malformed hosts reached
the resolver, which raised where nothing expected it, and their tasks never ended. The
redirect loop is `/loop/0` on every site. `redirect-raw?to=X` sends `X` exactly as given
(Latin-1 on the wire, as a site may), unlike `/redirect`, which percent-encodes it: a host
that only UTS 46 mapping makes valid (`ªshop.test` is `ashop.test`) reaches the fetcher as is.
"""

from __future__ import annotations

from hutch_sandbox.hostile import route
from hutch_sandbox.site import Outcome, Reply

LONG_LABEL = "a" * 70  # over the 63-byte label limit
LONG_HOST = ".".join(["h" * 50] * 6)  # 305 bytes, over the 253-byte host limit

TARGETS = {
    "redirect-empty-label": "http://a..example.com/x",
    "redirect-long-label": f"http://{LONG_LABEL}.example.com/x",
    "redirect-long-host": f"http://{LONG_HOST}/x",
    "redirect-bare-xn": "http://xn--/x",
    "redirect-file": "file:///etc/passwd",
    "redirect-metadata": "http://169.254.169.254/latest/meta-data/",
    # A terminal escape (clear screen) in a relative Location: h11 passes any byte but NUL
    # and white space in a header value.
    "redirect-control": "/cleared\x1b[2J",
}


def _redirect(target: str) -> Outcome:
    return Reply(302, b"moved\n", headers=[("Location", target)])


def _register(name: str, target: str) -> None:
    @route(name)
    def answer(query: dict[str, str]) -> Outcome:
        return _redirect(target)


for _name, _target in TARGETS.items():
    _register(_name, _target)


@route("redirect-raw")
def raw(query: dict[str, str]) -> Outcome:
    target = query.get("to", "")
    try:
        target.encode("latin-1")
    except UnicodeEncodeError:
        return Reply(400, b"?to= must be Latin-1\n")
    return _redirect(target)
