"""A small website to crawl, under `/crawl/` on every site: a fixed graph of links.

What a crawler meets on real sites, each on purpose, and nothing random, so a test can work
out the breadth-first set of pages it should reach (`hrefs` gives every page's links exactly
as written):

- pagination: each category lists its items over `PAGES` pages (`?page=N&sort=name`), each
  page linking to the next and back to the first;
- cycles: every page links back to the index, and the index links to itself;
- one page spelled many ways: relative (`cat/1?...`, `../item/...`), absolute, an upper-case
  scheme, a fragment (`#top`), the query's keys in another order;
- links that are not pages (`mailto:`, `javascript:`) and links to another domain (the same
  site under `localhost` instead of 127.0.0.1, or the other way round);
- a section robots.txt may disallow (`/crawl/private/`, disallowed by the crawl tests'
  sandbox config) and a printable copy of every item (`/crawl/print/`) that a `deny:` rule
  leaves out;
- a chain of "next item" links, so the depth at which a page is first reached depends on
  the path taken: an item is reachable from its category page and from the item before it.

`page(path, query, host, port)` renders a page or returns None (a 404). `hrefs(...)` gives
the links of a page; the HTML holds exactly these, in `<a href>` attributes.
"""

from __future__ import annotations

from html import escape

CATEGORIES = 3
PAGES = 3  # listing pages per category
PER_PAGE = 4  # items per listing page
ITEMS = PAGES * PER_PAGE  # per category


def _other_host(host: str, port: int) -> str:
    """The same site under the other loopback name: another domain to a crawler."""
    return f"localhost:{port}" if host.split(":")[0] != "localhost" else f"127.0.0.1:{port}"


def _listing(category: int, page: int, host: str) -> list[str]:
    start = (page - 1) * PER_PAGE
    links = [f"/crawl/item/{category}-{start + k}" for k in range(1, PER_PAGE + 1)]
    if page < PAGES:
        links.append(f"?page={page + 1}&sort=name")  # the next page, relative to this one
    links += [
        f"/crawl/cat/{category}?sort=name&page=1",  # the first page, keys in another order
        f"HTTP://{host}/crawl/cat/{category}?page={page}&sort=name#top",  # itself, other spelling
        "/crawl/",
    ]
    return links


def _item(category: int, n: int, host: str, port: int) -> list[str]:
    listing = (n - 1) // PER_PAGE + 1
    links = [
        f"../cat/{category}?page={listing}&sort=name",
        f"/crawl/print/{category}-{n}",
        f"/crawl/private/{category}-{n}",
        f"http://{_other_host(host, port)}/crawl/item/{category}-{n}",
        "/crawl/#top",
    ]
    if n < ITEMS:
        links.insert(0, f"{category}-{n + 1}")  # relative: /crawl/item/<c>-<n+1>
    return links


def hrefs(path: str, query: dict[str, str], host: str, port: int) -> list[str] | None:
    """The links of the page at `path` (with `query`) as written in it; None: no such page."""
    parts = path.strip("/").split("/")
    if parts == ["crawl"]:
        return [
            *(f"cat/{c}?sort=name&page=1" for c in range(1, CATEGORIES + 1)),
            f"http://{host}/crawl/cat/1?page=1&sort=name#top",
            "./",
            "/crawl/private/",
            f"http://{_other_host(host, port)}/crawl/",
            "mailto:someone@example.invalid",
            "javascript:void(0)",
        ]
    if len(parts) == 3 and parts[1] == "cat" and parts[2].isdigit():
        number, listing = int(parts[2]), query.get("page", "1")
        if 1 <= number <= CATEGORIES and listing.isdigit() and 1 <= int(listing) <= PAGES:
            return _listing(number, int(listing), host)
        return None
    if len(parts) == 3 and parts[1] in ("item", "print", "private"):
        category, dash, n = parts[2].partition("-")
        if not (dash and category.isdigit() and n.isdigit()):
            return None
        if not (1 <= int(category) <= CATEGORIES and 1 <= int(n) <= ITEMS):
            return None
        if parts[1] == "item":
            return _item(int(category), int(n), host, port)
        return ["/crawl/"] if parts[1] == "print" else [f"/crawl/private/secret-{parts[2]}", "/crawl/"]
    if path.rstrip("/") == "/crawl/private" or (len(parts) == 3 and parts[1] == "private"):
        return ["/crawl/"]
    return None


def page(path: str, query: dict[str, str], host: str, port: int) -> str | None:
    """The page's HTML, its title the path and query; None: no such page."""
    links = hrefs(path, query, host, port)
    if links is None:
        return None
    name = path + ("?" + "&".join(f"{k}={v}" for k, v in sorted(query.items())) if query else "")
    anchors = "\n".join(f'<li><a href="{escape(link)}">{escape(link)}</a></li>' for link in links)
    return (
        f"<!doctype html>\n<html><head><title>{escape(name)}</title></head>\n"
        f'<body><h1 class="page">{escape(name)}</h1>\n<ul>\n{anchors}\n</ul></body></html>\n'
    )
