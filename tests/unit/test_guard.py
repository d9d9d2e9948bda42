"""The SSRF guard's address rules, IPv6 embeddings included; no network.

6to4 (2002::/16) and Teredo (2001::/32) addresses carry an IPv4 address that a tunnel relay may
deliver to; Python's ipaddress calls 2002:0a00:0001::1 global, so the guard looks inside.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from hutch.services.fetcher.guard import ForbiddenTarget, GuardedBackend, KeptSocketStream, TargetGuard, why_forbidden


def reason(text: str) -> str | None:
    return why_forbidden(ipaddress.ip_address(text))


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("2002:0a00:0001::1", "10.0.0.1"),
        ("2002:7f00:0001::", "127.0.0.1"),
        ("2002:a9fe:a9fe::1", "169.254.169.254"),
        ("2002:c0a8:0101:1::5", "192.168.1.1"),
    ],
)
def test_a_6to4_address_embedding_a_private_ipv4_is_refused(address: str, embedded: str) -> None:
    found = reason(address)
    assert found is not None and found.startswith(f"6to4 address embedding {embedded}")


def test_a_teredo_address_whose_client_is_private_is_refused_naming_it() -> None:
    # Server 65.54.227.120, client 10.0.0.1 (stored inverted in the last 32 bits).
    found = reason("2001:0:4136:e378:8000:63bf:f5ff:fffe")
    assert found is not None and "Teredo address embedding 10.0.0.1" in found


@pytest.mark.parametrize("address", ["fec0::1", "fec0:1234::5", "feff:ffff::1"])
def test_site_local_ipv6_is_refused_outright(address: str) -> None:
    assert reason(address) == "site-local"


def test_a_6to4_address_embedding_a_public_ipv4_is_judged_like_any_address() -> None:
    assert reason("2002:0808:0808::1") is None  # 8.8.8.8 behind it: public
    assert reason("2606:4700:4700::1111") is None


@pytest.mark.parametrize(
    ("address", "expected"),
    [("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"), ("::1", "loopback"), ("fe80::1", "link-local")],
)
def test_mapped_and_plain_ipv6_keep_their_reasons(address: str, expected: str) -> None:
    assert reason(address) == expected


def test_the_guard_refuses_a_6to4_literal_in_a_url_host() -> None:
    guard = TargetGuard()
    with pytest.raises(ForbiddenTarget, match="6to4"):
        asyncio.run(guard.check("[2002:a00:1::1]", 80))


def test_an_allowlisted_host_port_passes_whatever_it_resolves_to() -> None:
    guard = TargetGuard(allowed=["intranet.test:8080"], overrides={("intranet.test", 8080): "2002:a00:1::1"})
    assert asyncio.run(guard.check("intranet.test", 8080)) == ["2002:a00:1::1"]


def test_a_guarded_connection_says_it_is_readable_only_once_the_server_has_sent_or_closed() -> None:
    """httpcore asks this of every idle pooled connection before each request; the answer
    comes from a poll of the socket kept at connect, and must still be right."""

    async def scenario() -> list[bool]:
        closing = asyncio.Event()
        seen: list[bool] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(4)
            writer.write(b"pong")
            await writer.drain()
            await closing.wait()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        guard = TargetGuard(allowed=[f"127.0.0.1:{port}"])
        stream = await GuardedBackend(guard).connect_tcp("127.0.0.1", port, timeout=5)
        assert isinstance(stream, KeptSocketStream)
        assert stream.get_extra_info("socket") is stream.socket is not None
        assert stream.get_extra_info("server_addr") == ("127.0.0.1", port)  # asked of the stream below
        seen.append(stream.get_extra_info("is_readable"))  # idle, nothing sent
        await stream.write(b"ping")
        assert await stream.read(4, timeout=5) == b"pong"
        seen.append(stream.get_extra_info("is_readable"))  # read all there was
        closing.set()
        for _ in range(100):  # the server's close arrives
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.01)
        seen.append(stream.get_extra_info("is_readable"))
        await stream.aclose()
        seen.append(stream.get_extra_info("is_readable"))  # closed here
        server.close()
        await server.wait_closed()
        return seen

    assert asyncio.run(scenario()) == [False, False, True, True]
