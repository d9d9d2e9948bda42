"""robots.txt for the governor: matching on Hutch's User-Agent, delays, and the cache's states."""

from __future__ import annotations

import pytest

from hutch.services.governor.robots import RobotsCache, RobotsRules, origin_of, robots_url

UA = "Hutch/0.1 (scraping job system)"

TEXT = """
User-agent: *
Disallow: /private
Crawl-delay: 2

User-agent: Hutch
Disallow: /no-hutch
Allow: /
Crawl-delay: 0.5
Request-rate: 1/4s
"""


def test_the_group_for_hutch_is_used_rather_than_the_star_group() -> None:
    rules = RobotsRules.parse(TEXT, UA)
    assert rules.allowed("http://a.example/private/x") is True
    assert rules.allowed("http://a.example/no-hutch/x") is False


def test_the_star_group_applies_when_no_group_names_hutch() -> None:
    rules = RobotsRules.parse("User-agent: *\nDisallow: /private\n", UA)
    assert rules.allowed("http://a.example/private") is False
    assert rules.allowed("http://a.example/public") is True


def test_crawl_delay_and_request_rate_become_a_rate_cap_the_lower_wins() -> None:
    rules = RobotsRules.parse(TEXT, UA)
    assert rules.crawl_delay == 0.5
    assert rules.request_rate == pytest.approx(0.25)
    assert rules.rate_cap == pytest.approx(0.25)


def test_a_fractional_crawl_delay_is_read() -> None:
    rules = RobotsRules.parse("User-agent: *\nCrawl-delay: 0.25\n", UA)
    assert rules.rate_cap == pytest.approx(4.0)


@pytest.mark.parametrize(("line", "rate"), [("1/5", 0.2), ("3/1m", 0.05), ("2/1h", 2 / 3600)])
def test_request_rate_units(line: str, rate: float) -> None:
    rules = RobotsRules.parse(f"User-agent: *\nRequest-rate: {line}\n", UA)
    assert rules.rate_cap == pytest.approx(rate)


def test_rules_without_delays_set_no_cap_and_garbage_is_ignored() -> None:
    rules = RobotsRules.parse("User-agent: *\nCrawl-delay: soon\nDisallow:\n", UA)
    assert rules.rate_cap is None
    assert rules.allowed("http://a.example/x") is True


def test_a_dollar_anchored_wildcard_disallows_every_pdf_and_only_pdfs() -> None:
    rules = RobotsRules.parse("User-agent: *\nDisallow: /*.pdf$\n", UA)
    assert rules.allowed("http://a.example/files/report.pdf") is False
    assert rules.allowed("http://a.example/report.pdf") is False
    assert rules.allowed("http://a.example/report.pdf?download=1") is True  # `$` ends the match
    assert rules.allowed("http://a.example/report.pdfx") is True
    assert rules.allowed("http://a.example/page/1") is True


def test_a_wildcard_in_the_middle_matches_a_query_string() -> None:
    rules = RobotsRules.parse("User-agent: *\nDisallow: /*?sort=\n", UA)
    assert rules.allowed("http://a.example/books?sort=price") is False
    assert rules.allowed("http://a.example/a/b/c?sort=") is False
    assert rules.allowed("http://a.example/books?page=2") is True
    assert rules.allowed("http://a.example/books") is True


def test_the_longest_match_wins_not_the_first_rule() -> None:
    rules = RobotsRules.parse("User-agent: *\nAllow: /\nDisallow: /private\n", UA)
    assert rules.allowed("http://a.example/private/x") is False
    assert rules.allowed("http://a.example/public") is True


def test_a_longer_allow_opens_a_path_inside_a_disallowed_one() -> None:
    rules = RobotsRules.parse("User-agent: *\nDisallow: /private\nAllow: /private/press\n", UA)
    assert rules.allowed("http://a.example/private/press/1") is True
    assert rules.allowed("http://a.example/private/x") is False


def test_a_group_is_matched_on_the_product_token_not_on_words_of_the_comment() -> None:
    rules = RobotsRules.parse("User-agent: scraping\nDisallow: /\n", UA)
    assert rules.allowed("http://a.example/x") is True


def test_only_the_first_half_mebibyte_of_a_huge_robots_txt_is_read() -> None:
    filler = "# " + "x" * 1000 + "\n"
    text = "User-agent: *\nDisallow: /early\n" + filler * 600 + "Disallow: /late\n"
    rules = RobotsRules.parse(text, UA)
    assert rules.allowed("http://a.example/early") is False
    assert rules.allowed("http://a.example/late") is True


def test_allow_all_and_disallow_all_need_no_file() -> None:
    assert RobotsRules.allow_all(UA).allowed("http://a.example/x") is True
    assert RobotsRules.disallow_all(UA, "gone").allowed("http://a.example/x") is False


def test_origin_and_robots_url() -> None:
    assert origin_of("HTTP://User@Example.COM:8080/a/b?c") == "http://example.com:8080"
    assert robots_url("https://example.com") == "https://example.com/robots.txt"


# -- the cache ------------------------------------------------------------------------------


@pytest.fixture
def cache() -> RobotsCache:
    return RobotsCache(UA, ttl=100.0, retry=10.0, attempts=3, fetch_deadline=60.0)


URL = "http://a.example/page/1"


def test_an_unknown_origin_must_be_fetched_first_and_pages_wait_meanwhile(cache: RobotsCache) -> None:
    assert cache.check(URL, 0.0)[0] == "fetch"
    cache.fetching("http://a.example", "robots-1", 0.0)
    verdict, until, _ = cache.check(URL, 1.0)
    assert (verdict, until) == ("wait", 60.0)


def test_a_2xx_is_parsed_and_cached_until_the_ttl(cache: RobotsCache) -> None:
    cache.fetching("http://a.example", "robots-1", 0.0)
    cache.result("http://a.example", 200, "User-agent: *\nDisallow: /page/1\n", 1.0)
    assert cache.check(URL, 2.0)[0] == "deny"
    assert cache.check("http://a.example/page/2", 2.0)[0] == "allow"
    assert cache.check(URL, 101.0)[0] == "fetch"  # stale: fetched again


@pytest.mark.parametrize("status", [401, 403, 404, 410])
def test_a_4xx_means_allow_all(cache: RobotsCache, status: int) -> None:
    cache.result("http://a.example", status, "", 1.0)
    assert cache.check(URL, 2.0)[0] == "allow"


@pytest.mark.parametrize("outcome", ["forbidden_target", "invalid_url"])
def test_an_origin_hutch_may_not_fetch_gets_no_robots_verdict_of_its_own(cache: RobotsCache, outcome: str) -> None:
    cache.result("http://a.example", None, "", 1.0, outcome)
    assert cache.check(URL, 2.0)[0] == "allow"


@pytest.mark.parametrize("status", [500, 503, 429, None])
def test_a_5xx_429_or_no_answer_waits_and_retries_then_disallows(cache: RobotsCache, status: int | None) -> None:
    cache.result("http://a.example", status, "", 0.0)
    assert cache.check(URL, 1.0)[:2] == ("wait", 10.0)
    assert cache.check(URL, 10.0)[0] == "fetch"
    cache.result("http://a.example", status, "", 10.0)
    assert cache.check(URL, 11.0)[:2] == ("wait", 30.0)  # the retry delay doubles
    cache.result("http://a.example", status, "", 30.0)
    verdict, _, why = cache.check(URL, 31.0)
    assert verdict == "deny"
    assert "after 3 tries" in why


def test_a_success_after_failures_resets_the_count(cache: RobotsCache) -> None:
    cache.result("http://a.example", 503, "", 0.0)
    cache.result("http://a.example", 200, "", 10.0)
    assert cache.check(URL, 11.0)[0] == "allow"
    assert cache.origins["http://a.example"].failures == 0


def test_a_robots_fetch_that_never_reports_counts_as_a_failure(cache: RobotsCache) -> None:
    cache.fetching("http://a.example", "robots-1", 0.0)
    verdict, until, _ = cache.check(URL, 60.0)
    assert verdict == "wait"
    assert cache.origins["http://a.example"].failures == 1
    assert until == 70.0


def test_a_returned_robots_task_is_fetched_again_without_a_failure(cache: RobotsCache) -> None:
    cache.fetching("http://a.example", "robots-1", 0.0)
    cache.returned("robots-1", 0.5)
    assert cache.check(URL, 1.0)[0] == "fetch"
    assert cache.origins["http://a.example"].failures == 0


def test_robots_tasks_never_sent_end_in_a_disallowed_origin_not_a_loop() -> None:
    cache = RobotsCache("hutch-test", retry=10.0, attempts=2, max_returns=3)
    now = 0.0
    for n in range(1, 7):
        assert cache.check(URL, now)[0] == "fetch"
        cache.fetching("http://a.example", f"robots-{n}", now)
        cache.returned(f"robots-{n}", now)
        if n == 3:  # the third return in a row is one failed fetch: retried after `retry`
            assert cache.origins["http://a.example"].failures == 1
            assert cache.check(URL, now)[0] == "wait"
            now += 10.0
    verdict, _, why = cache.check(URL, now)
    assert verdict == "deny"
    assert "unreachable" in why


def test_origins_are_cached_separately(cache: RobotsCache) -> None:
    cache.result("http://a.example", 200, "User-agent: *\nDisallow: /\n", 0.0)
    assert cache.check("http://a.example/x", 1.0)[0] == "deny"
    assert cache.check("http://a.example:8080/x", 1.0)[0] == "fetch"
    assert cache.check("https://a.example/x", 1.0)[0] == "fetch"
