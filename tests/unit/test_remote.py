"""hutch.remote against a fake API (httpx's MockTransport): how requests are made and answers read."""

from __future__ import annotations

import json

import httpx
import pytest

from hutch.remote import Remote, RemoteRefused, RemoteUnavailable
from hutch.settings import Settings

SETTINGS = Settings(api_url="http://api.test:8080/", api_token="s3cret")


def remote_with(handler: httpx.MockTransport) -> Remote:
    remote = Remote(SETTINGS)
    remote.http = httpx.Client(base_url=remote.url, headers=remote.http.headers, transport=handler)
    return remote


def test_items_split_on_newlines_only_so_a_line_separator_inside_a_string_stays() -> None:
    body = json.dumps({"title": "a\u2028b\u0085c"}, ensure_ascii=False) + "\n" + '{"title":"d"}\n'
    remote = remote_with(httpx.MockTransport(lambda request: httpx.Response(200, content=body.encode())))
    lines = list(remote.items("job"))
    assert [json.loads(line)["title"] for line in lines] == ["a\u2028b\u0085c", "d"]


def test_every_path_segment_is_escaped_and_the_token_goes_in_the_header_only() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"tasks": 0})

    remote = remote_with(httpx.MockTransport(answer))
    remote.delete("keep#x/../y")
    remote.trace("a?b")
    assert [r.url.raw_path for r in seen] == [b"/jobs/keep%23x%2F..%2Fy", b"/tasks/a%3Fb/trace"]
    assert all(r.headers["authorization"] == "Bearer s3cret" for r in seen)
    assert all(b"s3cret" not in r.url.raw_path for r in seen)


def test_a_4xx_is_refused_with_its_field_a_401_names_the_setting_and_a_5xx_is_unavailable() -> None:
    answers = iter(
        [
            httpx.Response(400, json={"error": "urls[2]: not a URL", "field": "urls[2]"}),
            httpx.Response(401, json={"error": "a bearer token is required", "field": None}),
            httpx.Response(503, json={"error": "the store cannot be reached", "field": None}),
        ]
    )
    remote = remote_with(httpx.MockTransport(lambda request: next(answers)))
    with pytest.raises(RemoteRefused) as refused:
        remote.submit("j", ["x"])
    assert (refused.value.status, refused.value.field) == (400, "urls[2]")
    with pytest.raises(RemoteRefused, match="HUTCH_API_TOKEN"):
        remote.jobs()
    with pytest.raises(RemoteUnavailable, match="503"):
        remote.jobs()


def test_an_api_that_cannot_be_reached_is_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    remote = remote_with(httpx.MockTransport(refuse))
    with pytest.raises(RemoteUnavailable, match=r"cannot reach the API at http://api\.test:8080"):
        remote.jobs()
