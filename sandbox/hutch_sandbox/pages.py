"""What the sandbox's sites serve, as pure functions, so tests can predict every byte.

A normal page is derived from (site name, page index) and nothing else; ``expected_page`` gives
the fields exactly as served, which lets an end-to-end test compare each stored item field by
field. Links on page i only point to pages below i (always including i - 1), so they are valid
whatever a site's page count, and crawling from a site's last page reaches every page.

The other bodies (challenge, block, charset samples) live here too, with the markers a scraper's
detection code looks for.
"""

from __future__ import annotations

import codecs
import hashlib
import random
from html import escape
from typing import TypedDict

__all__ = [
    "BLOCK_MARKER",
    "CHALLENGE_MARKER",
    "PageFields",
    "block_page",
    "challenge_page",
    "charset_page",
    "charset_text",
    "expected_page",
    "index_page",
    "render_page",
]

CHALLENGE_MARKER = "cf-challenge"
BLOCK_MARKER = "hutch-blocked"

_ADJECTIVES = (
    "Quiet", "Golden", "Crimson", "Lucky", "Brave", "Silent", "Velvet", "Rusty", "Nordic",
    "Ancient", "Tiny", "Clever", "Hidden", "Bright", "Wandering", "Émigré", "Señorial", "Grüne",
)  # fmt: skip
_NOUNS = (
    "Teapot", "Lantern", "Harbor", "Compass", "Garden", "Atlas", "Violin", "Kettle", "Orchard",
    "Library", "Café", "Crème", "Smørrebrød", "Façade", "Bridge", "Meadow", "Clock", "Mirror",
)  # fmt: skip
_MAKERS = (
    "Müller", "Dvořák", "Núñez", "Søren", "Łukasz", "Smith", "Okafor", "Tanaka", "Rossi",
    "Novak", "Garcia", "Kim", "Dubois", "Larsen", "Schröder", "Patel",
)  # fmt: skip
_WORDS = (
    "quiet", "river", "paper", "amber", "window", "stone", "bright", "winter", "signal", "market",
    "garden", "naïve", "über", "façade", "copper", "thread", "little", "morning", "harbor", "salt",
    "ladder", "velvet", "simple", "distant", "green", "pocket", "crème", "north", "lamp", "orchard",
)  # fmt: skip

# Sample texts for /charset/<name>; the first one the charset can encode entirely is served.
_CHARSET_SAMPLES = (
    "Café Müller · 東京の本屋 · Привет · Ωμέγα",
    "서울의 서점",
    "北京的书店",
    "東京の古本屋で見つけた本",
    "臺北的書店",
    "Привет, книжный магазин",
    "Ωμέγα βιβλιοπωλείο",
    "Café Müller: crème brûlée, naïve façade, Straße",
    "plain ASCII text",
)


class PageFields(TypedDict):
    title: str
    h1: str
    price: str
    description: str
    links: list[str]


def _number(site: str, index: int, label: str) -> int:
    digest = hashlib.sha256(f"{site}\x1f{index}\x1f{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _pick(options: tuple[str, ...], site: str, index: int, label: str) -> str:
    return options[_number(site, index, label) % len(options)]


def expected_page(site_name: str, i: int) -> PageFields:
    """The fields of /page/<i> on site ``site_name``, exactly as served (text unescaped).

    Keys: ``title``, ``h1``, ``price`` (text such as "12.34"), ``description`` and ``links``
    (site-relative paths such as "/page/3", in document order).
    """
    if i < 0:
        raise ValueError("page index must be >= 0")
    adjective = _pick(_ADJECTIVES, site_name, i, "adjective")
    noun = _pick(_NOUNS, site_name, i, "noun")
    maker = _pick(_MAKERS, site_name, i, "maker")
    cents = 100 + _number(site_name, i, "price") % 99_900
    length = 8 + _number(site_name, i, "length") % 8
    words = [_pick(_WORDS, site_name, i, f"word{k}") for k in range(length)]
    description = " ".join(words).capitalize() + "."
    targets: list[int] = []
    if i > 0:
        targets.append(i - 1)
        for k in range(2):
            target = _number(site_name, i, f"link{k}") % i
            if target not in targets:
                targets.append(target)
    return {
        "title": f"{adjective} {noun} {i}",
        "h1": f"{noun} by {maker}",
        "price": f"{cents // 100}.{cents % 100:02d}",
        "description": description,
        "links": [f"/page/{target}" for target in targets],
    }


def render_page(site_name: str, i: int, size_kb: int = 0) -> str:
    """The HTML of /page/<i>: the only anchors are the page's links.

    With ``size_kb`` above 0 the page is a documentation page of about that many KiB: the
    same fields, inside the markup a real one carries (head assets, navigation, a sidebar,
    sections of prose, code, tables and lists, a footer, inline script). Its extra anchors
    point only at fragments (``#...``), so the page's links stay exactly ``links``.
    """
    page = expected_page(site_name, i)
    items = "".join(f'<li><a href="{link}">{link}</a></li>' for link in map(escape, page["links"]))
    fields = (
        f"<h1>{escape(page['h1'])}</h1>\n"
        f'<span class="price">{escape(page["price"])}</span>\n'
        f'<p class="desc">{escape(page["description"])}</p>\n'
        f'<ul class="links">{items}</ul>\n'
    )
    if size_kb <= 0:
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(page['title'])}</title></head>\n"
            f"<body>\n{fields}</body></html>\n"
        )
    return _documentation_page(site_name, i, page["title"], fields, size_kb * 1024)


def _documentation_page(site_name: str, i: int, title: str, fields: str, size: int) -> str:
    rng = random.Random(_number(site_name, i, "document"))

    def words(low: int, high: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))

    head = (
        "<!DOCTYPE html>\n<html lang=\"en\" data-content_root=\"../\">\n<head>\n"
        '  <meta charset="utf-8">\n  <meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"  <title>{escape(title)}</title>\n"
        '  <link rel="stylesheet" type="text/css" href="/_static/pygments.css?v=4f649999">\n'
        '  <link rel="stylesheet" type="text/css" href="/_static/theme.css?v=19f00094">\n'
        '  <script src="/_static/documentation_options.js?v=5929fcd5"></script>\n'
        "  <style>.highlight .k{color:#008000;font-weight:bold}.highlight .s{color:#ba2121}</style>\n"
        "</head>\n<body>\n"
    )
    nav = "".join(
        f'<li class="toctree-l{1 + k % 3}"><a class="reference internal" href="#s{k}">{words(1, 4)}</a></li>\n'
        for k in range(40)
    )
    parts = [
        head,
        '<div class="related" role="navigation" aria-label="Related">\n<ul>\n',
        nav,
        '</ul>\n</div>\n<div class="document"><div class="body" role="main">\n<section id="top">\n',
        fields,
    ]
    tail = (
        "</section>\n</div></div>\n"
        '<div class="footer" role="contentinfo">&#169; Copyright the authors. '
        "Built with a static site generator.</div>\n"
        "<script>document.querySelectorAll('a.headerlink').forEach(function(a){a.title='Link';});</script>\n"
        "</body>\n</html>\n"
    )
    total = sum(map(len, parts)) + len(tail)
    k = 0
    while total < size:
        heading = words(2, 5).capitalize()
        section = [f'<section id="s{k}">\n<h2>{heading}<a class="headerlink" href="#s{k}">¶</a></h2>\n']
        for _ in range(rng.randint(2, 4)):
            section.append(
                f"<p>{words(30, 70).capitalize()} <code class=\"docutils literal\"><span class=\"pre\">"
                f"{rng.choice(_WORDS)}()</span></code> {words(10, 30)}.</p>\n"
            )
        shape = k % 3
        if shape == 0:
            lines = "\n".join(
                f'<span class="k">def</span> <span class="nf">{rng.choice(_WORDS)}_{n}</span>'
                f'(<span class="n">x</span>): <span class="k">return</span> <span class="s">"{words(1, 3)}"</span>'
                for n in range(rng.randint(3, 8))
            )
            section.append(
                f'<div class="highlight-python notranslate"><div class="highlight"><pre>{lines}</pre></div></div>\n'
            )
        elif shape == 1:
            rows = "".join(
                f'<tr class="row-{"odd" if n % 2 else "even"}"><td><p>{rng.choice(_WORDS)}</p></td>'
                f"<td><p>{words(4, 12)}</p></td></tr>\n"
                for n in range(rng.randint(4, 10))
            )
            section.append(f'<table class="docutils align-default"><tbody>\n{rows}</tbody></table>\n')
        else:
            entries = "".join(f"<li><p>{words(6, 18)}</p></li>\n" for _ in range(rng.randint(3, 7)))
            section.append(f'<ul class="simple">\n{entries}</ul>\n')
        section.append("</section>\n")
        text = "".join(section)
        parts.append(text)
        total += len(text)
        k += 1
    parts.append(tail)
    return "".join(parts)


def index_page(site_name: str, pages: int) -> str:
    """The site root: a link to every page."""
    items = "".join(f'<li><a href="/page/{i}">page {i}</a></li>' for i in range(pages))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(site_name)}'
        f"</title></head>\n<body><ul>{items}</ul></body></html>\n"
    )


def challenge_page() -> str:
    """A 200 page that is really an anti-bot interstitial, recognisable by ``CHALLENGE_MARKER``."""
    return (
        "<!DOCTYPE html>\n<html><head><title>Just a moment...</title></head>\n"
        f'<body><div id="{CHALLENGE_MARKER}" class="{CHALLENGE_MARKER}">'
        "Checking your browser before accessing the site.</div></body></html>\n"
    )


def block_page() -> str:
    """The body of a 403 block, recognisable by ``BLOCK_MARKER``."""
    return (
        "<!DOCTYPE html>\n<html><head><title>Access denied</title></head>\n"
        f'<body><p class="{BLOCK_MARKER}">Your address has been blocked.</p></body></html>\n'
    )


def charset_text(name: str) -> str:
    """The sample text /charset/<name> carries; raises LookupError for an unknown text codec."""
    codecs.lookup(name)
    for sample in _CHARSET_SAMPLES:
        try:
            sample.encode(name)
        except UnicodeEncodeError:
            continue
        return sample
    raise LookupError(f"{name} cannot encode even ASCII")  # pragma: no cover - e.g. EBCDIC oddities


def charset_page(name: str, declare_meta: bool) -> bytes:
    """The /charset/<name> body encoded in ``name``, with a <meta charset> tag if asked."""
    meta = f'<meta charset="{escape(name)}">' if declare_meta else ""
    html = (
        f"<!DOCTYPE html>\n<html><head>{meta}<title>charset {escape(name)}</title></head>\n"
        f'<body><p class="sample">{charset_text(name)}</p></body></html>\n'
    )
    return html.encode(name)
