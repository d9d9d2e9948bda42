"""The proxy pool file: both formats, tiers, costs, stable ids, hidden credentials, reloads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hutch.services.proxy_manager.pool import (
    DEFAULT_COST,
    PoolError,
    PoolFile,
    load_pool,
    load_pool_config,
    parse_pool,
    parse_tier_floors,
    parse_yaml_pool,
    proxy_id,
)

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


def test_a_third_word_is_the_cost_of_one_request() -> None:
    proxies = parse_pool("http://a.example:1 residential 0.004\nhttp://b.example:2 mobile\n")
    assert [(p.tier, p.cost) for p in proxies] == [("residential", 0.004), ("mobile", DEFAULT_COST["mobile"])]


def test_more_than_url_tier_and_cost_on_a_line_is_refused_with_its_line_number() -> None:
    with pytest.raises(PoolError, match="line 2: expected 'URL \\[tier \\[cost\\]\\]'"):
        parse_pool("http://a.example:1\nhttp://b.example:2 mobile 1 extra\n")


@pytest.mark.parametrize("cost", ["cheap", "-1", "nan", "inf"])
def test_a_cost_that_is_not_a_number_at_least_zero_is_refused_with_its_line_number(cost: str) -> None:
    with pytest.raises(PoolError, match="line 2: the cost must be a number"):
        parse_pool(f"http://a.example:1\nhttp://b.example:2 mobile {cost}\n")


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


# -- YAML ----------------------------------------------------------------------------------------

YAML = """\
proxies:
  - {url: "http://u:secret@dc1.example:8080", tier: datacenter, cost: 0.0002}
  - {url: "http://res1.example:3128", tier: residential}
  - {url: "http://dc2.example:8080"}
domains:
  shop.example: {tier_floor: residential}
  Big.Example:8443: {tier_floor: mobile}
"""


def test_a_yaml_pool_gives_proxies_with_tiers_costs_and_domain_floors() -> None:
    pool = parse_yaml_pool(YAML)
    assert [(p.tier, p.cost) for p in pool.proxies] == [
        ("datacenter", 0.0002),
        ("residential", DEFAULT_COST["residential"]),
        ("datacenter", DEFAULT_COST["datacenter"]),
    ]
    assert pool.tier_floors == {"shop.example": "residential", "big.example:8443": "mobile"}
    assert pool.tiers == ["datacenter", "residential"]


def test_a_yaml_file_is_read_as_yaml_by_its_extension(tmp_path: Path) -> None:
    path = tmp_path / "pool.yml"
    path.write_text(YAML, encoding="utf-8")
    assert len(load_pool(path)) == 3
    assert load_pool_config(path).tier_floors["shop.example"] == "residential"


@pytest.mark.parametrize(
    "text, message",
    [
        ("proxies: {url: x}\n", "'proxies' must be a list"),
        ("- just a list\n", "expected a mapping"),
        ("proxies: []\nextra: 1\n", "expected a mapping"),
        ("proxies:\n  - {url: 'http://a.example:1', colour: red}\n", "proxy 1: expected a mapping"),
        ("proxies:\n  - {url: 'http://a.example:1', tier: gold}\n", "proxy 1: unknown tier"),
        ("proxies: []\ndomains: {a.example: {tier_floor: gold}}\n", "needs tier_floor"),
    ],
)
def test_a_bad_yaml_pool_is_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(PoolError, match=message):
        parse_yaml_pool(text, "pool.yaml")


def test_a_yaml_syntax_error_names_the_line_but_never_quotes_it() -> None:
    text = 'proxies:\n  - {url: "http://alice:hunter2@p.example:1", tier: [\n'
    with pytest.raises(PoolError) as caught:
        parse_yaml_pool(text, "pool.yaml")
    assert "not valid YAML" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert "alice" not in str(caught.value)


def test_no_error_about_a_line_quotes_the_line() -> None:
    for line in ("http://alice:hunter2@p.example:1 gold", "http://alice:hunter2@p.example:1 mobile x y",
                 "http://alice:hunter2@p.example:bad", "ftp://alice:hunter2@p.example:1"):
        with pytest.raises(PoolError) as caught:
            parse_pool(line)
        assert "hunter2" not in str(caught.value) and "alice" not in str(caught.value)


def test_tier_floor_entries_from_the_setting_are_domain_equals_tier() -> None:
    assert parse_tier_floors(("Shop.example=residential", "x:81=mobile"), "s") == {
        "shop.example": "residential",
        "x:81": "mobile",
    }
    with pytest.raises(PoolError, match="expected domain=tier"):
        parse_tier_floors(("shop.example=gold",), "s")
    with pytest.raises(PoolError, match="expected domain=tier"):
        parse_tier_floors(("=residential",), "s")


# -- reloads -------------------------------------------------------------------------------------


def test_a_pool_file_reports_a_change_after_a_write_and_not_before(tmp_path: Path) -> None:
    path = tmp_path / "proxies.txt"
    path.write_text("http://a.example:1\n", encoding="utf-8")
    watched = PoolFile(path)
    assert watched.changed()  # never loaded yet
    assert [p.tier for p in watched.load().proxies] == ["datacenter"]
    assert not watched.changed()
    path.write_text("http://a.example:1\nhttp://b.example:2 residential\n", encoding="utf-8")
    os.utime(path, ns=(1, 1))  # a different mtime whatever the clock's resolution
    assert watched.changed()
    assert len(watched.load().proxies) == 2
    assert not watched.changed()


def test_a_pool_file_replaced_by_a_rename_counts_as_changed(tmp_path: Path) -> None:
    path = tmp_path / "proxies.txt"
    path.write_text("http://a.example:1\n", encoding="utf-8")
    watched = PoolFile(path)
    watched.load()
    fresh = tmp_path / "new.txt"
    fresh.write_text("http://b.example:2\n", encoding="utf-8")
    os.replace(fresh, path)
    assert watched.changed()


def test_a_vanished_pool_file_is_not_a_change_to_reload(tmp_path: Path) -> None:
    path = tmp_path / "proxies.txt"
    path.write_text("http://a.example:1\n", encoding="utf-8")
    watched = PoolFile(path)
    watched.load()
    path.unlink()
    assert not watched.changed()
