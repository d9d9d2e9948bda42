"""The parser's wiring: pages in from `parse`, items out to `store`.

Extraction runs in worker processes (pool.py, `HUTCH_PARSE_WORKERS`) with a time limit per
page (`HUTCH_PARSE_TIMEOUT`), a cap on each item's JSON (`HUTCH_MAX_ITEM_BYTES`) and on a
worker's memory (`HUTCH_PARSE_MEMORY_MB`), so neither a hostile page nor a costly spec can
stall the parser or take it down, and the event loop stays free for heartbeats and acks. A
page that goes over a limit, or fails to parse, goes dead with stage `parse` and the reason
(`parse_timeout`, `item_too_large`, `parse_memory`, `parse_crash`, `parse_error`,
`not_json` or `item_invalid` for a spec's JMESPath fields or item schema, and
`sitemap_invalid` or `sitemap_too_large` for a crawl's sitemap); replaying it re-parses
without a re-fetch.
"""

from __future__ import annotations

import time

from hutch.amqp import Dead, Delivery
from hutch.models import Item, Page
from hutch.service import Service
from hutch.services.parser.links import CrawlBounds
from hutch.services.parser.pool import Limits, ParseFailed, ParsePool
from hutch.topology import STORE_KEY
from hutch.urls import InvalidURL, check_url


class Parser(Service):
    name = "parser"

    async def start(self) -> None:
        s = self.settings
        limits = Limits(s.parse_timeout, s.max_item_bytes, s.parse_memory_mb * 1024 * 1024)
        self.pool = ParsePool(s.parse_workers, limits)
        await self.pool.start()
        await self.broker.consume(
            self.broker.topology.parse, Page, self._on_page, stage="parse", prefetch=s.parse_workers * 2
        )

    async def stop(self) -> None:
        await self.pool.close()

    async def _on_page(self, page: Page, _: Delivery) -> None:
        started = time.monotonic()
        try:
            spec = page.task.spec
            crawl = None
            if spec is not None and spec.follow:
                s = self.settings
                crawl = CrawlBounds(self._domain_of(page), s.max_links_per_page, s.max_url_bytes, s.max_body_bytes)
            fields, links = await self.pool.extract_page(
                page.text, page.final_url, page.status, spec, crawl, page.gzip_body, page.content_type
            )
        except ParseFailed as failed:
            self.metrics.parsed.labels(failed.reason).inc()
            raise Dead(failed.reason, failed.detail) from None
        self.metrics.parsed.labels("ok").inc()
        self.metrics.parse_seconds.observe(time.monotonic() - started)
        item = Item(task=page.task, status=page.status, fields=fields, parsed_at=time.time(), links=links)
        # Transient unless HUTCH_PERSIST_PAGES, as its page was (hutch.services.storer.lost).
        persistent = self.settings.persist_pages or bool(spec is not None and spec.archive)
        await self.broker.publish(self.broker.topology.work, STORE_KEY, item, persistent=persistent)

    @staticmethod
    def _domain_of(page: Page) -> str:
        """The domain the page was fetched from (after redirects): `same_domain` keeps to it."""
        try:
            return check_url(page.final_url).domain
        except InvalidURL:
            return page.task.domain


SERVICE = Parser
