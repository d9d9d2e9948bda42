"""The sandbox on real loopback sockets, spoken to with httpx as a scraper would."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hutch_sandbox import (
    BLOCK_MARKER,
    CHALLENGE_MARKER,
    Sandbox,
    SandboxConfig,
    charset_text,
    expected_page,
    wait_for_ready_file,
)
from parsel import Selector

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

PROXIES = [
    {"name": "dc1", "tier": "datacenter", "source": "127.0.1.1"},
    {"name": "res1", "tier": "residential", "source": "127.0.2.1"},
]


@asynccontextmanager
async def sandbox(
    sites: list[dict[str, Any]] | None = None,
    proxies: list[dict[str, Any]] | None = None,
    access_log: Path | None = None,
) -> AsyncIterator[Sandbox]:
    config = SandboxConfig.model_validate(
        {
            "seed": 7,
            "sites": sites if sites is not None else [{"name": "books", "pages": 20}],
            "proxies": proxies if proxies is not None else PROXIES,
        }
    )
    async with Sandbox(config, access_log=access_log) as sb:
        yield sb


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def client(proxy: str | None = None, timeout: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(proxy=proxy, timeout=timeout, trust_env=False)


# -- pages ------------------------------------------------------------------------------------


async def test_a_page_serves_exactly_the_fields_of_expected_page() -> None:
    async with sandbox() as sb, client() as http:
        for i in (0, 3, 19):
            response = await http.get(sb.sites["books"].page_url(i))
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/html; charset=utf-8"
            page = expected_page("books", i)
            selector = Selector(text=response.text)
            assert selector.css("title::text").get() == page["title"]
            assert selector.css("h1::text").get() == page["h1"]
            assert selector.css("span.price::text").get() == page["price"]
            assert selector.css("p.desc::text").get() == page["description"]
            assert selector.css("a::attr(href)").getall() == page["links"]
        missing = await http.get(sb.sites["books"].page_url(20))
        assert missing.status_code == 404


async def test_urls_proxy_file_and_allowed_targets_describe_the_running_sandbox() -> None:
    async with sandbox() as sb:
        books = sb.sites["books"]
        assert books.port > 0
        assert books.base_url == f"http://127.0.0.1:{books.port}"
        assert books.domain == f"127.0.0.1:{books.port}"
        assert sb.urls() == [f"{books.base_url}/page/{i}" for i in range(20)]
        assert sb.allowed_targets() == [books.domain]
        lines = sb.proxy_file_text().splitlines()
        assert lines == [f"{sb.proxies['dc1'].url} datacenter", f"{sb.proxies['res1'].url} residential"]


async def test_keep_alive_connections_serve_several_requests() -> None:
    async with sandbox() as sb, client() as http:
        for i in range(5):
            response = await http.get(sb.sites["books"].page_url(i))
            assert response.headers["connection"] == "keep-alive"
        head = await http.head(sb.sites["books"].page_url(1))
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) > 0
        after = await http.get(sb.sites["books"].page_url(2))
        assert expected_page("books", 2)["title"] in after.text
        async with client() as other:  # a second client: a connection of its own
            await other.get(sb.sites["books"].page_url(3))
        records = [r for r in sb.log if r.kind == "site"]
        assert len(records) == 8
        first, second = {r.client_port for r in records[:7]}, {r.client_port for r in records[7:]}
        assert len(first) == 1 and len(second) == 1 and first != second and None not in first


# -- trouble paths ----------------------------------------------------------------------------


async def test_status_path_answers_that_status() -> None:
    async with sandbox() as sb, client() as http:
        response = await http.get(f"{sb.sites['books'].base_url}/status/404")
        assert response.status_code == 404
        assert response.text == "status 404\n"
        assert (await http.get(f"{sb.sites['books'].base_url}/status/204")).status_code == 204


async def test_reset_path_breaks_the_connection_and_is_logged_as_reset() -> None:
    async with sandbox() as sb, client() as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"{sb.sites['books'].base_url}/reset")
        assert sb.site_log("books")[-1].status == "reset"


async def test_hang_path_never_answers_and_is_logged_as_hang() -> None:
    async with sandbox() as sb, client(timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{sb.sites['books'].base_url}/hang")
        assert sb.site_log("books")[-1].status == "hang"


async def test_trickle_path_sends_headers_then_a_byte_at_a_time() -> None:
    async with sandbox() as sb, client(timeout=3) as http:
        url = f"{sb.sites['books'].base_url}/trickle"
        async with http.stream("GET", url) as response:
            assert response.status_code == 200
            first = await anext(response.aiter_raw())
            assert first == b"."


async def test_big_path_streams_the_requested_number_of_bytes() -> None:
    async with sandbox() as sb, client() as http:
        response = await http.get(f"{sb.sites['books'].base_url}/big?bytes=300000")
        assert response.status_code == 200
        assert len(response.content) == 300_000


async def test_redirects_are_followed_and_loops_never_end() -> None:
    async with sandbox() as sb:
        base = sb.sites["books"].base_url
        async with httpx.AsyncClient(follow_redirects=True, max_redirects=5) as http:
            response = await http.get(f"{base}/redirect?to=/page/4")
            assert str(response.url) == f"{base}/page/4"
            assert response.history[0].status_code == 302
            with pytest.raises(httpx.TooManyRedirects):
                await http.get(f"{base}/loop/0")
        async with client() as http:
            first = await http.get(f"{base}/loop/7")
            assert first.headers["location"] == "/loop/8"


async def test_flaky_key_fails_the_first_k_requests_then_serves_the_page() -> None:
    async with sandbox() as sb, client() as http:
        url = f"{sb.sites['books'].base_url}/flaky/3?fail=2&code=503"
        statuses = [(await http.get(url)).status_code for _ in range(4)]
        assert statuses == [503, 503, 200, 200]
        assert expected_page("books", 3)["title"] in (await http.get(url)).text
        other = await http.get(f"{sb.sites['books'].base_url}/flaky/other")
        assert other.status_code == 500


async def test_retry_after_path_answers_429_with_the_header() -> None:
    async with sandbox() as sb, client() as http:
        response = await http.get(f"{sb.sites['books'].base_url}/retry-after/3")
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3"


async def test_challenge_block_and_robots_paths() -> None:
    sites = [{"name": "books", "pages": 5, "robots_txt": "User-agent: *\nDisallow: /private\n"}]
    async with sandbox(sites) as sb, client() as http:
        base = sb.sites["books"].base_url
        challenge = await http.get(f"{base}/challenge")
        assert challenge.status_code == 200 and CHALLENGE_MARKER in challenge.text
        assert "<title>Just a moment...</title>" in challenge.text
        block = await http.get(f"{base}/block")
        assert block.status_code == 403 and BLOCK_MARKER in block.text
        robots = await http.get(f"{base}/robots.txt")
        assert robots.text == "User-agent: *\nDisallow: /private\n"


@pytest.mark.parametrize("charset", ["utf-8", "latin-1", "shift_jis", "cp1251"])
async def test_charset_pages_decode_with_the_declared_charset(charset: str) -> None:
    async with sandbox() as sb, client() as http:
        response = await http.get(f"{sb.sites['books'].base_url}/charset/{charset}")
        assert response.headers["content-type"] == f"text/html; charset={charset}"
        assert charset_text(charset) in response.text


async def test_charset_can_be_declared_only_in_meta_or_not_at_all() -> None:
    async with sandbox() as sb, client() as http:
        base = sb.sites["books"].base_url
        meta = await http.get(f"{base}/charset/shift_jis?declare=meta")
        assert meta.headers["content-type"] == "text/html"
        assert b'<meta charset="shift_jis">' in meta.content
        assert charset_text("shift_jis") in meta.content.decode("shift_jis")
        bare = await http.get(f"{base}/charset/latin-1?declare=none")
        assert b"<meta" not in bare.content
        assert charset_text("latin-1") in bare.content.decode("latin-1")


# -- configured faults, bans and blocks -------------------------------------------------------


async def test_configured_faults_are_injected_and_logged() -> None:
    sites = [
        {"name": "errors", "pages": 5, "faults": {"error_503": 1.0, "retry_after": "2"}},
        {"name": "resets", "pages": 5, "faults": {"reset": 1.0}},
        {"name": "hangs", "pages": 5, "faults": {"hang": 1.0}},
    ]
    async with sandbox(sites) as sb, client(timeout=0.3) as http:
        response = await http.get(sb.sites["errors"].page_url(1))
        assert response.status_code == 503 and response.headers["retry-after"] == "2"
        with pytest.raises(httpx.TransportError):
            await http.get(sb.sites["resets"].page_url(1))
        with pytest.raises(httpx.ReadTimeout):
            await http.get(sb.sites["hangs"].page_url(1))
        assert [(r.site, r.status, r.fault) for r in sb.log] == [
            ("errors", 503, "error_503"),
            ("resets", "reset", "reset"),
            ("hangs", "hang", "hang"),
        ]
        # trouble paths ignore the fault configuration
        assert (await http.get(f"{sb.sites['errors'].base_url}/status/200")).status_code == 200


async def test_a_rerun_with_the_same_seed_sees_the_same_faults() -> None:
    sites = [{"name": "books", "pages": 30, "faults": {"error_500": 0.3, "rate_429": 0.2}}]

    async def statuses() -> list[int]:
        async with sandbox(sites) as sb, client() as http:
            urls = sb.urls() * 2
            return [(await http.get(url)).status_code for url in urls]

    first = await statuses()
    assert first == await statuses()
    assert {200, 500, 429} <= set(first)


async def test_politeness_bans_a_bursting_address_then_lets_it_back() -> None:
    sites = [{"name": "news", "pages": 5, "politeness": {"max_per_second": 3, "ban_seconds": 0.5}}]
    async with sandbox(sites) as sb, client() as http:
        url = sb.sites["news"].page_url(1)
        statuses = [(await http.get(url)).status_code for _ in range(6)]
        assert statuses == [200, 200, 200, 403, 403, 403]
        banned = await http.get(url)
        assert banned.headers["retry-after"] == "1"
        await asyncio.sleep(0.6)
        assert (await http.get(url)).status_code == 200
        assert [r.fault for r in sb.site_log("news")].count("ban") == 4


async def test_datacenter_addresses_are_blocked_and_residential_ones_are_not() -> None:
    sites = [
        {"name": "shop", "pages": 5, "block": {"datacenter_probability": 1.0, "style": "status_403"}},
        {"name": "mall", "pages": 5, "block": {"datacenter_probability": 1.0, "style": "challenge_200"}},
    ]
    async with sandbox(sites) as sb:
        async with client() as direct:  # 127.0.0.1 counts as datacenter
            blocked = await direct.get(sb.sites["shop"].page_url(1))
            assert blocked.status_code == 403 and BLOCK_MARKER in blocked.text
            challenged = await direct.get(sb.sites["mall"].page_url(1))
            assert challenged.status_code == 200 and CHALLENGE_MARKER in challenged.text
        async with client(proxy=sb.proxies["dc1"].url) as datacenter:
            assert (await datacenter.get(sb.sites["shop"].page_url(1))).status_code == 403
        async with client(proxy=sb.proxies["res1"].url) as residential:
            page = await residential.get(sb.sites["shop"].page_url(1))
            assert page.status_code == 200
            assert expected_page("shop", 1)["title"] in page.text
        assert [r.fault for r in sb.site_log("shop")] == ["block", "block", None]


# -- proxies ----------------------------------------------------------------------------------


async def test_a_request_through_a_proxy_arrives_from_the_proxy_source_address() -> None:
    async with sandbox() as sb, client(proxy=sb.proxies["dc1"].url) as http:
        response = await http.get(sb.sites["books"].page_url(2))
        assert response.status_code == 200
        assert expected_page("books", 2)["title"] in response.text
        assert sb.site_log("books")[-1].client == "127.0.1.1"
        record = sb.proxy_log("dc1")[-1]
        assert (record.site, record.status, record.client) == ("books", 200, "127.0.0.1")
        assert record.path == sb.sites["books"].page_url(2)


async def test_connect_tunnels_reach_the_site_from_the_proxy_source_address() -> None:
    async with sandbox() as sb:
        proxy, site = sb.proxies["res1"], sb.sites["books"]
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(f"CONNECT {site.domain} HTTP/1.1\r\nHost: {site.domain}\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(f"GET /status/201 HTTP/1.1\r\nHost: {site.domain}\r\nConnection: close\r\n\r\n".encode())
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 201 Created")
        assert sb.site_log("books")[-1].client == "127.0.2.1"


async def test_a_site_reset_passes_through_the_proxy_as_a_connection_error() -> None:
    async with sandbox() as sb, client(proxy=sb.proxies["dc1"].url) as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"{sb.sites['books'].base_url}/reset")


async def test_proxies_refuse_targets_outside_loopback() -> None:
    async with sandbox() as sb, client(proxy=sb.proxies["dc1"].url) as http:
        response = await http.get("http://example.com/")
        assert response.status_code == 403
        assert sb.proxy_log("dc1")[-1].status == 403


async def test_a_down_proxy_resets_and_a_failing_proxy_answers_502() -> None:
    proxies = [
        {"name": "dead", "tier": "datacenter", "source": "127.0.1.1", "down": True},
        {"name": "bad", "tier": "datacenter", "source": "127.0.1.2", "fail": 1.0},
    ]
    async with sandbox(proxies=proxies) as sb:
        async with client(proxy=sb.proxies["dead"].url) as http:
            with pytest.raises(httpx.TransportError):
                await http.get(sb.sites["books"].page_url(1))
        async with client(proxy=sb.proxies["bad"].url) as http:
            assert (await http.get(sb.sites["books"].page_url(1))).status_code == 502
        assert sb.site_log("books") == []
        assert [(r.proxy, r.fault) for r in sb.log] == [("dead", "down"), ("bad", "fail")]


async def test_a_proxy_with_auth_wants_credentials() -> None:
    proxies = [{"name": "locked", "tier": "residential", "source": "127.0.2.5", "auth": "u:p"}]
    async with sandbox(proxies=proxies) as sb:
        locked = sb.proxies["locked"]
        assert locked.url == f"http://u:p@127.0.0.1:{locked.port}"
        async with client(proxy=f"http://127.0.0.1:{locked.port}") as http:
            response = await http.get(sb.sites["books"].page_url(1))
            assert response.status_code == 407
        async with client(proxy=locked.url) as http:
            assert (await http.get(sb.sites["books"].page_url(1))).status_code == 200


# -- log, stop, process -----------------------------------------------------------------------


async def test_access_log_file_gets_one_json_line_per_request(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    async with sandbox(access_log=path) as sb, client() as http:
        await http.get(sb.sites["books"].page_url(1))
        await http.get(f"{sb.sites['books'].base_url}/status/418")
        lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert [(line["path"], line["status"]) for line in lines] == [("/page/1", 200), ("/status/418", 418)]
    assert set(lines[0]) >= {"ts", "site", "port", "method", "path", "client", "status", "fault"}
    assert lines[0]["port"] == sb.sites["books"].port
    assert abs(lines[0]["ts"] - time.time()) < 10


async def test_stop_closes_hanging_connections_promptly() -> None:
    async with sandbox() as sb, client(timeout=20) as http:
        pending = asyncio.create_task(http.get(f"{sb.sites['books'].base_url}/hang"))
        trickle = asyncio.create_task(http.get(f"{sb.sites['books'].base_url}/trickle"))
        await eventually(lambda: len(sb.site_log("books")) == 2)
        started = time.monotonic()
        await sb.stop()
        assert time.monotonic() - started < 1
        for task in (pending, trickle):
            with pytest.raises(httpx.TransportError):
                await task


async def test_the_command_line_writes_seed_files_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.yaml"
    config.write_text(
        "sites:\n  - {name: books, pages: 3}\n"
        "proxies:\n  - {name: dc1, tier: datacenter, source: 127.0.1.1}\n",
        encoding="utf-8",
    )
    ready, urls, proxies = tmp_path / "ready.json", tmp_path / "urls.txt", tmp_path / "proxies.txt"
    command = [
        sys.executable,
        "-m",
        "hutch_sandbox",
        "--config",
        str(config),
        "--urls-out",
        str(urls),
        "--proxies-out",
        str(proxies),
        "--access-log",
        str(tmp_path / "log.jsonl"),
        "--ready-file",
        str(ready),
    ]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    try:
        info = await asyncio.to_thread(wait_for_ready_file, ready, 15)
        assert info["urls_file"] == str(urls)
        assert urls.read_text().splitlines() == [
            f"{info['sites']['books']['base_url']}/page/{i}" for i in range(3)
        ]
        assert proxies.read_text() == f"{info['proxies']['dc1']['url']} datacenter\n"
        async with client() as http:
            assert (await http.get(f"{info['sites']['books']['base_url']}/page/1")).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, _ = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0
    output = stdout.decode()
    assert "books" in output and "sandbox stopped" in output
    assert not ready.exists()


async def test_a_proxy_answers_a_malformed_request_itself_and_says_so_in_proxy_status() -> None:
    async with sandbox() as sb:
        proxy = sb.proxies["dc1"]
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"NONSENSE\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        head = answer.decode("latin-1").split("\r\n\r\n", 1)[0]
        assert head.startswith("HTTP/1.1 4")
        assert f"Proxy-Status: 127.0.0.1:{proxy.port}; error=http_request_error" in head


async def test_a_proxy_names_its_own_failure_but_not_a_site_it_cannot_reach() -> None:
    failing = {"name": "flaky", "tier": "datacenter", "source": "127.0.1.9", "fail": 1.0}
    async with sandbox(proxies=[*PROXIES, failing]) as sb:
        async with client(sb.proxies["flaky"].url) as http:
            own = await http.get(sb.sites["books"].base_url + "/page/1")
        async with client(sb.proxies["dc1"].url) as http:
            unreachable = await http.get("http://127.0.0.1:1/")
    flaky, dc1 = sb.proxies["flaky"].port, sb.proxies["dc1"].port
    assert own.status_code == 502 and own.headers["proxy-status"] == f"127.0.0.1:{flaky}; error=proxy_internal_error"
    assert unreachable.status_code == 502
    assert unreachable.headers["proxy-status"] == f"127.0.0.1:{dc1}; error=destination_unavailable"
