"""The sandbox's pure parts: config validation, page content and the decisions that make runs
reproducible. No sockets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hutch_sandbox import ConfigError, FaultConfig, SandboxConfig, expected_page, load_config
from hutch_sandbox.pages import charset_page, charset_text, render_page
from hutch_sandbox.rules import (
    Politeness,
    decide_block,
    decide_fault,
    draw,
    is_datacenter,
    latency_seconds,
)
from parsel import Selector


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sandbox.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- config -----------------------------------------------------------------------------------


def test_default_config_has_three_sites_hundreds_of_pages_and_two_proxies_per_tier() -> None:
    config = load_config(None)
    assert len(config.sites) >= 3
    assert sum(site.pages for site in config.sites) >= 300
    tiers = [proxy.tier for proxy in config.proxies]
    assert tiers.count("datacenter") == 2
    assert tiers.count("residential") == 2
    assert any(site.block is not None for site in config.sites)
    assert any(site.faults.hang > 0 for site in config.sites)
    assert all(site.faults.retry_after == "1" for site in config.sites)


def test_unknown_top_level_key_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "host: 127.0.0.1\nsites: []\nsited: []\n")
    with pytest.raises(ConfigError, match=r"sited: unknown key") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_misspelt_fault_key_is_refused_instead_of_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path, "sites:\n  - name: a\n    faults: {eror_500: 0.5}\n")
    with pytest.raises(ConfigError, match=r"sites\.0\.faults\.eror_500: unknown key"):
        load_config(path)


def test_probability_above_one_is_refused() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1"):
        FaultConfig(error_500=1.5)


def test_non_loopback_host_and_proxy_source_are_refused() -> None:
    with pytest.raises(ValueError, match="loopback"):
        SandboxConfig.model_validate({"host": "10.0.0.1"})
    proxy = {"name": "p", "tier": "datacenter", "source": "192.168.1.1"}
    with pytest.raises(ValueError, match="loopback"):
        SandboxConfig.model_validate({"proxies": [proxy]})


def test_duplicate_site_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate site name: a"):
        SandboxConfig.model_validate({"sites": [{"name": "a"}, {"name": "a"}]})


def test_latency_range_must_be_ordered_and_a_single_number_means_fixed() -> None:
    with pytest.raises(ValueError, match="latency_ms"):
        SandboxConfig.model_validate({"sites": [{"name": "a", "latency_ms": [50, 10]}]})
    config = SandboxConfig.model_validate({"sites": [{"name": "a", "latency_ms": 30}]})
    assert config.sites[0].latency_ms == (30, 30)


def test_retry_after_may_be_a_number_null_or_an_http_date(tmp_path: Path) -> None:
    text = (
        "sites:\n"
        "  - {name: a, faults: {retry_after: 2}}\n"
        "  - {name: b, faults: {retry_after: null}}\n"
        "  - {name: c, faults: {retry_after: 'Wed, 21 Oct 2015 07:28:00 GMT'}}\n"
    )
    config = load_config(_write(tmp_path, text))
    assert [site.faults.retry_after for site in config.sites] == [
        "2",
        None,
        "Wed, 21 Oct 2015 07:28:00 GMT",
    ]


def test_a_config_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(_write(tmp_path, "- just\n- a list\n"))


# -- pages ------------------------------------------------------------------------------------


def test_expected_page_depends_only_on_site_and_index() -> None:
    assert expected_page("books", 5) == expected_page("books", 5)
    assert expected_page("books", 5) != expected_page("shop", 5)
    assert expected_page("books", 5) != expected_page("books", 6)


def test_expected_page_has_the_served_fields() -> None:
    page = expected_page("books", 12)
    assert set(page) == {"title", "h1", "price", "description", "links"}
    assert page["price"].count(".") == 1
    assert float(page["price"]) >= 1.0


def test_links_point_below_the_page_so_they_exist_whatever_the_page_count() -> None:
    assert expected_page("books", 0)["links"] == []
    for i in range(1, 200):
        links = expected_page("books", i)["links"]
        assert links[0] == f"/page/{i - 1}"
        assert len(links) == len(set(links))
        assert all(0 <= int(link.rsplit("/", 1)[1]) < i for link in links)


def test_some_titles_are_not_ascii() -> None:
    titles = [expected_page("books", i)["title"] for i in range(30)]
    assert any(not title.isascii() for title in titles)
    assert any(title.isascii() for title in titles)


def test_rendered_page_carries_exactly_the_expected_fields() -> None:
    for i in (0, 1, 7, 42):
        page = expected_page("news", i)
        selector = Selector(text=render_page("news", i))
        assert selector.css("title::text").get() == page["title"]
        assert selector.css("h1::text").get() == page["h1"]
        assert selector.css("span.price::text").get() == page["price"]
        assert selector.css("p.desc::text").get() == page["description"]
        assert selector.css("a::attr(href)").getall() == page["links"]


def test_charset_text_fits_its_charset_and_is_not_ascii() -> None:
    for name in ("utf-8", "latin-1", "shift_jis", "cp1251", "euc-kr", "gbk"):
        text = charset_text(name)
        assert not text.isascii()
        assert text in charset_page(name, declare_meta=False).decode(name)
    assert '<meta charset="latin-1">' in charset_page("latin-1", declare_meta=True).decode("latin-1")


def test_unknown_charset_raises_lookup_error() -> None:
    with pytest.raises(LookupError):
        charset_text("no-such-charset")


# -- decisions --------------------------------------------------------------------------------


def test_fault_decisions_repeat_for_the_same_seed_site_path_and_count() -> None:
    faults = FaultConfig(error_500=0.2, reset=0.1, hang=0.05, rate_429=0.2)
    first = [decide_fault(faults, 7, "books", f"/page/{i}", c) for i in range(50) for c in range(3)]
    again = [decide_fault(faults, 7, "books", f"/page/{i}", c) for i in range(50) for c in range(3)]
    assert first == again
    other = [decide_fault(faults, 8, "books", f"/page/{i}", c) for i in range(50) for c in range(3)]
    assert first != other


def test_fault_rates_follow_the_configured_probabilities() -> None:
    faults = FaultConfig(error_500=0.1, rate_429=0.05)
    outcomes = [decide_fault(faults, 1, "s", f"/page/{i}", 0) for i in range(20_000)]
    assert 0.09 < outcomes.count("error_500") / len(outcomes) < 0.11
    # 429 loses to a 500 drawn on the same request: 0.05 * 0.9
    assert 0.04 < outcomes.count("rate_429") / len(outcomes) < 0.05


def test_a_retried_url_eventually_gets_through() -> None:
    faults = FaultConfig(error_500=0.5, reset=0.3)
    counts = [
        next(c for c in range(100) if decide_fault(faults, 7, "books", f"/page/{i}", c) is None)
        for i in range(100)
    ]
    assert max(counts) < 100
    assert any(count > 0 for count in counts)


def test_no_faults_are_drawn_when_every_probability_is_zero() -> None:
    assert all(decide_fault(FaultConfig(), 7, "a", f"/page/{i}", 0) is None for i in range(500))


def test_block_decision_is_reproducible_and_follows_its_probability() -> None:
    decisions = [decide_block(7, "shop", f"/page/{i}", 0, 0.6) for i in range(5000)]
    assert decisions == [decide_block(7, "shop", f"/page/{i}", 0, 0.6) for i in range(5000)]
    assert 0.57 < sum(decisions) / len(decisions) < 0.63
    assert not any(decide_block(7, "shop", f"/page/{i}", 0, 0.0) for i in range(100))


def test_latency_stays_in_range_and_draws_are_uniform_numbers() -> None:
    delays = [latency_seconds(7, "a", f"/page/{i}", 0, (50, 150)) for i in range(1000)]
    assert all(0.05 <= delay <= 0.15 for delay in delays)
    assert latency_seconds(7, "a", "/page/1", 0, (20, 20)) == 0.02
    assert all(0.0 <= draw(3, "x", i) < 1.0 for i in range(1000))


def test_datacenter_addresses_are_matched_by_network() -> None:
    networks = load_config(None).address_tiers.datacenter
    assert is_datacenter("127.0.0.1", networks)
    assert is_datacenter("127.0.1.2", networks)
    assert not is_datacenter("127.0.2.1", networks)
    assert not is_datacenter("not-an-ip", networks)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_politeness_bans_a_burst_and_lifts_the_ban_after_ban_seconds() -> None:
    clock = _Clock()
    politeness = Politeness(max_per_second=3, ban_seconds=5, clock=clock)
    assert [politeness.check("a") for _ in range(3)] == [None, None, None]
    assert politeness.check("a") == 5
    assert politeness.check("b") is None  # other addresses are unaffected
    clock.now += 4
    assert politeness.check("a") == pytest.approx(1)
    clock.now += 1.5
    assert politeness.check("a") is None


def test_politeness_allows_a_steady_rate_at_the_limit() -> None:
    clock = _Clock()
    politeness = Politeness(max_per_second=2, ban_seconds=5, clock=clock)
    for _ in range(20):
        assert politeness.check("a") is None
        clock.now += 0.5
