"""What a fetch sends of a job's spec: its headers beside the fetcher's own, its cookies as one
Cookie header, credentials left out after a redirect to another host, and never a cookie a
site set for another request (the client is shared by every job behind one proxy).

httpx's mock transport answers in place of a socket, so this needs no network; the sandbox's
access log shows the same at a real site (tests/e2e/test_request_options.py).
"""

from __future__ import annotations

import httpx

from hutch.models import FieldRule, Spec, Task
from hutch.services.fetcher.app import _job_headers
from hutch.services.fetcher.fetch import fetch, make_client
from hutch.services.fetcher.guard import TargetGuard
from hutch.services.fetcher.policy import Policy

SPEC = Spec(
    fields={"title": FieldRule(kind="css", expr="title::text")},
    headers={"Accept-Language": "fr-CH", "User-Agent": "catalogue-bot/2", "Authorization": "Bearer t0ken"},
    cookies={"sid": "abc", "consent": "yes"},
)


def task(fetch_url: str | None = None, spec: Spec | None = SPEC) -> Task:
    return Task(id="t", job="j", url="http://shop.test/p/1", domain="shop.test", spec=spec, fetch_url=fetch_url)


async def sent_heads(headers: dict[str, str], times: int = 1) -> list[httpx.Headers]:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        body = httpx.ByteStream(b"<title>ok</title>")
        return httpx.Response(200, headers={"Set-Cookie": "tracker=site-set; Path=/"}, stream=body)

    client = make_client(proxy=None, guard=TargetGuard([]), user_agent="Hutch/0.1", connect_timeout=5, read_timeout=5)
    client._transport = httpx.MockTransport(answer)
    async with client:
        for _ in range(times):
            result = await fetch(
                client, "http://shop.test/p/1", domain="shop.test", guard=TargetGuard([]), proxy=None,
                policy=Policy(max_attempts=3), total_timeout=5, max_body_bytes=1024, headers=headers,
            )  # fmt: skip
            assert result.outcome == "ok", result
    return seen


async def test_a_jobs_headers_and_cookies_go_with_each_request_beside_the_fetchers_own() -> None:
    (head,) = await sent_heads(_job_headers(task()))
    assert head["accept-language"] == "fr-CH"
    assert head["user-agent"] == "catalogue-bot/2"  # the job's replaces HUTCH_USER_AGENT
    assert head["authorization"] == "Bearer t0ken"
    assert head.get_list("cookie") == ["sid=abc; consent=yes"]
    assert "gzip" in head["accept-encoding"]  # the fetcher's own, which the job cannot give


async def test_a_cookie_a_site_set_is_never_sent_again() -> None:
    first, second = await sent_heads({}, times=2)
    assert "cookie" not in first and "cookie" not in second
    first, second = await sent_heads(_job_headers(task()), times=2)
    assert second.get_list("cookie") == ["sid=abc; consent=yes"]


async def test_without_options_only_the_fetchers_headers_go() -> None:
    (head,) = await sent_heads(_job_headers(task(spec=None)))
    assert head["user-agent"] == "Hutch/0.1" and "cookie" not in head and "authorization" not in head


def test_a_redirects_next_hop_on_another_host_goes_without_credentials() -> None:
    assert _job_headers(task(fetch_url="http://cdn.other.test/p/1")) == {
        "Accept-Language": "fr-CH",
        "User-Agent": "catalogue-bot/2",
    }
    assert _job_headers(task(fetch_url="http://shop.test/login?next=/p/1"))["Cookie"] == "sid=abc; consent=yes"


def test_a_robots_fetch_sends_no_job_options() -> None:
    robots = task().model_copy(update={"purpose": "robots"})
    assert _job_headers(robots) == {}
