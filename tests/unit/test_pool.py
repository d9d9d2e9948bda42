"""The proxy pool file and round-robin choice: tiers, stable ids, hidden credentials, exclusions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hutch.services.proxy_manager.pool import PoolError, Proxy, RoundRobin, load_pool, parse_pool, proxy_id

POOL = """\
# the lab pool
http://dc1.example:8080
http://user:pass@dc2.example:8080 datacenter   # trailing comment
https://res1.example:3128 residential

socks5://mob1.example:1080 mobile
"""


# -- parsing -------------------------------------------------------------------------------------


def test_each_line_gives_a_proxy_with_its_tier_in_file_order() -> None:
    proxies = parse_pool(POOL)
    assert [(p.url, p.tier) for p in proxies] == [
        ("http://dc1.example:8080", "datacenter"),
        ("http://user:pass@dc2.example:8080", "datacenter"),
        ("https://res1.example:3128", "residential"),
        ("socks5://mob1.example:1080", "mobile"),
    ]


def test_a_line_without_a_tier_is_datacenter() -> None:
    assert parse_pool("http://p.example:8080\n")[0].tier == "datacenter"


def test_blank_lines_and_comments_give_no_proxy() -> None:
    assert parse_pool("\n# only a comment\n   \n\t# indented comment\n") == []


def test_an_empty_file_gives_an_empty_pool() -> None:
    assert parse_pool("") == []


def test_a_proxy_listed_twice_is_kept_once() -> None:
    proxies = parse_pool("http://p.example:8080\nhttp://p.example:8080 residential\n")
    assert len(proxies) == 1
    assert proxies[0].tier == "datacenter"


@pytest.mark.parametrize("tier", ["gold", "Residential", "dc"])
def test_an_unknown_tier_is_refused_with_its_line_number(tier: str) -> None:
    text = f"# header\nhttp://a.example:1\nhttp://b.example:2 {tier}\n"
    with pytest.raises(PoolError, match=rf"proxies.txt line 3: unknown tier '{tier}'"):
        parse_pool(text, "proxies.txt")


def test_more_than_url_and_tier_on_a_line_is_refused_with_its_line_number() -> None:
    with pytest.raises(PoolError, match="line 2: expected 'URL \\[tier\\]'"):
        parse_pool("http://a.example:1\nhttp://b.example:2 mobile extra\n")


@pytest.mark.parametrize(
    "line",
    ["ftp://a.example:21", "a.example:8080", "http://", "http:///path", "just-words", "socks4://a.example:1"],
)
def test_a_line_that_is_not_a_proxy_url_is_refused_with_its_line_number(line: str) -> None:
    with pytest.raises(PoolError, match="pool line 4: not a proxy URL"):
        parse_pool(f"\n\nhttp://ok.example:1\n{line}\n", "pool")


@pytest.mark.parametrize("line", ["http://a.example:abc", "http://a.example:99999"])
def test_a_proxy_url_with_a_bad_port_is_refused_with_its_line_number(line: str) -> None:
    with pytest.raises(PoolError, match="pool line 2"):
        parse_pool(f"http://ok.example:1\n{line}\n", "pool")


def test_load_pool_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "proxies.txt"
    path.write_text("http://a.example:1 mobile\nhttp://b.example:2 platinum\n", encoding="utf-8")
    with pytest.raises(PoolError, match=rf"{path.name} line 2"):
        load_pool(path)
    path.write_text("http://a.example:1 mobile\n", encoding="utf-8")
    assert [p.tier for p in load_pool(str(path))] == ["mobile"]


def test_a_missing_pool_file_is_refused_with_a_pool_error(tmp_path: Path) -> None:
    with pytest.raises(PoolError, match="cannot read proxy file"):
        load_pool(tmp_path / "absent.txt")


# -- ids and secrecy -----------------------------------------------------------------------------


def test_a_proxy_id_is_stable_across_parses() -> None:
    assert [p.id for p in parse_pool(POOL)] == [p.id for p in parse_pool(POOL)]


def test_a_proxy_id_does_not_depend_on_the_password() -> None:
    assert proxy_id("http://user:old@p.example:8080") == proxy_id("http://user:new@p.example:8080")


def test_a_proxy_id_depends_on_user_host_port_and_scheme() -> None:
    base = proxy_id("http://user:pw@p.example:8080")
    assert proxy_id("http://other:pw@p.example:8080") != base
    assert proxy_id("http://user:pw@q.example:8080") != base
    assert proxy_id("http://user:pw@p.example:8081") != base
    assert proxy_id("socks5://user:pw@p.example:8080") != base


def test_a_proxy_id_is_short_and_holds_nothing_of_the_url() -> None:
    pid = proxy_id("http://alice:hunter2@proxy.example:8080")
    assert pid.startswith("px-")
    assert len(pid) == 13
    for secret in ("alice", "hunter2", "proxy", "8080"):
        assert secret not in pid


def test_a_rotated_password_is_the_same_proxy_in_the_pool() -> None:
    proxies = parse_pool("http://u:one@p.example:1\nhttp://u:two@p.example:1\n")
    assert len(proxies) == 1


def test_the_repr_of_a_proxy_hides_its_url_and_credentials() -> None:
    proxy = parse_pool("http://alice:hunter2@proxy.example:8080 residential\n")[0]
    for text in (repr(proxy), str(proxy), f"{proxy!r}", repr([proxy])):
        assert "hunter2" not in text
        assert "alice" not in text
        assert "proxy.example" not in text
        assert proxy.id in text
        assert "residential" in text


# -- round robin ---------------------------------------------------------------------------------


def make_pool(n: int) -> list[Proxy]:
    return [Proxy(f"px-{i}", f"http://p{i}.example:1", "datacenter") for i in range(n)]


def test_round_robin_takes_each_proxy_in_turn_and_wraps_around() -> None:
    rr = RoundRobin(make_pool(3))
    chosen = [rr.choose(set()) for _ in range(7)]
    assert [p.id for p in chosen if p] == ["px-0", "px-1", "px-2", "px-0", "px-1", "px-2", "px-0"]


def test_round_robin_skips_excluded_proxies() -> None:
    rr = RoundRobin(make_pool(4))
    chosen = [rr.choose({"px-1", "px-2"}) for _ in range(4)]
    assert [p.id for p in chosen if p] == ["px-0", "px-3", "px-0", "px-3"]


def test_an_exclusion_applies_only_to_the_call_it_is_given_to() -> None:
    rr = RoundRobin(make_pool(2))
    first = rr.choose({"px-0"})
    second = rr.choose(set())
    assert (first and first.id, second and second.id) == ("px-1", "px-0")


def test_when_every_proxy_is_excluded_one_is_still_chosen_rather_than_stalling() -> None:
    rr = RoundRobin(make_pool(3))
    everyone = {"px-0", "px-1", "px-2"}
    chosen = [rr.choose(everyone) for _ in range(3)]
    assert all(p is not None for p in chosen)
    assert len({p.id for p in chosen if p}) == 3  # the fallback keeps rotating too


def test_ids_that_are_not_in_the_pool_do_not_matter() -> None:
    rr = RoundRobin(make_pool(2))
    chosen = rr.choose({"px-unknown"})
    assert chosen is not None
    assert chosen.id == "px-0"


def test_an_empty_pool_chooses_nothing() -> None:
    rr = RoundRobin([])
    assert rr.choose(set()) is None
    assert rr.choose({"px-0"}) is None
