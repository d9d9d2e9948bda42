"""Sitemaps of the crawl site (`hutch_sandbox.crawlsite`), plain and gzipped, and hostile ones.

    /sitemap.xml                 a sitemap index: /sitemaps/pages.xml and /sitemaps/items.xml.gz
    /sitemaps/pages.xml          a urlset (application/xml): crawl pages, one spelled twice, a
                                 printable copy, one on another domain, one outside /crawl/
    /sitemaps/items.xml.gz       a urlset in a gzip file (application/x-gzip, no
                                 Content-Encoding), declared ISO-8859-1: items, one of them twice
    /sitemaps/bomb.xml.gz?mib=N  a gzip file whose urlset goes on with N MiB of white space
                                 (default 256; about 1 KiB on the wire per MiB)
    /sitemaps/entities.xml       a urlset behind a "billion laughs" DTD: ten levels of entities,
                                 each ten of the one below, a loc made of the last
    /sitemaps/broken.xml         a urlset with an unescaped `&` in its second loc

Every URL is absolute, on the host the request named (the other domain is the same site under
the other loopback name, as the crawl site's own links to it). `locs(name, host, port)` gives
a sitemap's `<loc>` texts as written (entities unescaped), so a test can work out what a crawl
should admit. Like every fixed path, these answers skip the site's faults and latency.
"""

from __future__ import annotations

import functools
import gzip
import struct
import zlib
from html import escape

from hutch_sandbox.site import Outcome, Reply

__all__ = ["GZIP", "NAMESPACE", "XML", "answer", "locs"]

NAMESPACE = "http://www.sitemaps.org/schemas/sitemap/0.9"
XML = "application/xml"
GZIP = "application/x-gzip"
MAX_BOMB_MIB = 4096
BLOCK = b" " * (1 << 20)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, no time, unknown OS
FINAL_BLOCK = b"\x03\x00"  # an empty final deflate block (fixed Huffman)


def _other_host(host: str, port: int) -> str:
    return f"localhost:{port}" if host.split(":")[0] != "localhost" else f"127.0.0.1:{port}"


def locs(name: str, host: str, port: int) -> list[str]:
    """The URLs a sitemap lists, in order, as written (before XML escaping)."""
    if name == "sitemap.xml":
        return [f"http://{host}/sitemaps/pages.xml", f"http://{host}/sitemaps/items.xml.gz"]
    if name == "pages.xml":
        return [
            f"http://{host}/crawl/",
            f"http://{host}/crawl/cat/1?page=1&sort=name",
            f"http://{host}/crawl/cat/1?sort=name&page=1",  # the one before, its keys in another order
            f"http://{host}/crawl/cat/3?page=2&sort=name",
            f"http://{host}/crawl/print/1-1",  # left out by the crawl tests' deny: rule
            f"http://{_other_host(host, port)}/crawl/item/1-1",  # another domain
            f"http://{host}/status/200",  # outside /crawl/: left out by an allow: rule
        ]
    if name == "items.xml.gz":
        return [
            f"http://{host}/crawl/item/2-5",
            f"http://{host}/crawl/item/3-12",
            f"http://{host}/crawl/item/1-7",
            f"HTTP://{host}/crawl/item/2-5#top",  # the first one again
        ]
    raise KeyError(name)


def _urlset(urls: list[str], declaration: str = '<?xml version="1.0" encoding="UTF-8"?>') -> str:
    entries = "".join(f"  <url><loc>{escape(url, quote=False)}</loc><priority>0.5</priority></url>\n" for url in urls)
    return f'{declaration}\n<urlset xmlns="{NAMESPACE}">\n{entries}</urlset>\n'


def _index(urls: list[str]) -> str:
    entries = "".join(f"  <sitemap><loc>{escape(url, quote=False)}</loc></sitemap>\n" for url in urls)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{NAMESPACE}">\n{entries}</sitemapindex>\n'


def _entities() -> str:
    levels = ['<!ENTITY lol0 "lol">'] + [f'<!ENTITY lol{n} "{f"&lol{n - 1};" * 10}">' for n in range(1, 10)]
    dtd = "\n".join(f"  {level}" for level in levels)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE urlset [\n{dtd}\n]>\n'
        f'<urlset xmlns="{NAMESPACE}">\n  <url><loc>http://laughs.example/&lol9;</loc></url>\n</urlset>\n'
    )


@functools.cache
def _bomb(mib: int) -> bytes:
    """A valid gzip file: a urlset's start, then `mib` MiB of spaces at deflate's best ratio.

    Each MiB is one deflate segment ending in a full flush, so one compressed MiB is repeated
    instead of compressing them all; only the checksum is computed over the whole."""
    prefix = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NAMESPACE}">\n'.encode()
    head = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    start = head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH)
    block = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = block.compress(BLOCK) + block.flush(zlib.Z_FULL_FLUSH)
    check = zlib.crc32(prefix)
    for _ in range(mib):
        check = zlib.crc32(BLOCK, check)
    size = len(prefix) + mib * len(BLOCK)
    return GZIP_HEADER + start + segment * mib + FINAL_BLOCK + struct.pack("<II", check, size & 0xFFFFFFFF)


def answer(path: str, query: dict[str, str], host: str, port: int) -> Outcome:
    """The answer for `/sitemap.xml` or `/sitemaps/<name>` (a 404 for any other name)."""
    if path == "/sitemap.xml":
        return Reply(200, _index(locs("sitemap.xml", host, port)).encode(), XML)
    name = path.removeprefix("/sitemaps/")
    if name == "pages.xml":
        return Reply(200, _urlset(locs(name, host, port)).encode(), XML)
    if name == "items.xml.gz":
        text = _urlset(locs(name, host, port), '<?xml version="1.0" encoding="ISO-8859-1"?>')
        return Reply(200, gzip.compress(text.encode("latin-1"), 9, mtime=0), GZIP)
    if name == "bomb.xml.gz":
        mib = query.get("mib", "256")
        if not mib.isdigit() or not 0 < int(mib) <= MAX_BOMB_MIB:
            return Reply(400, f"mib must be between 1 and {MAX_BOMB_MIB}\n".encode())
        return Reply(200, _bomb(int(mib)), GZIP)
    if name == "entities.xml":
        return Reply(200, _entities().encode(), XML)
    if name == "broken.xml":
        text = _urlset([f"http://{host}/crawl/", f"http://{host}/crawl/cat/1?page=1&sort=name"])
        return Reply(200, text.replace("&amp;", "&").encode(), XML)
    return Reply(404, b"no such sitemap\n")
