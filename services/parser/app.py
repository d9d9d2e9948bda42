"""The parser's wiring: pages in from `parse`, items out to `store`.

Extraction runs in a small thread pool (`HUTCH_PARSE_WORKERS`); lxml releases the GIL
for most of its work, and the event loop stays free for heartbeats and acks. A page that
fails to parse goes dead with stage `parse`; replaying it re-parses without a re-fetch.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from hutch.amqp import Dead, Delivery
from hutch.models import Item, Page
from hutch.service import Service
from hutch.services.parser.extract import extract


class Parser(Service):
    name = "parser"

    async def start(self) -> None:
        workers = self.settings.parse_workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="parse")
        await self.broker.consume(
            self.broker.topology.parse, Page, self._on_page, stage="parse", prefetch=workers * 4
        )

    async def stop(self) -> None:
        self.pool.shutdown(wait=True)

    async def _on_page(self, page: Page, _: Delivery) -> None:
        loop = asyncio.get_running_loop()
        try:
            fields = await loop.run_in_executor(
                self.pool, extract, page.text, page.final_url, page.status, page.task.spec
            )
        except Exception as exc:
            raise Dead("parse", f"{type(exc).__name__}: {exc}", task=page.task) from None
        item = Item(task=page.task, status=page.status, fields=fields, parsed_at=time.time())
        await self.broker.publish(self.broker.topology.work, "store", item)


SERVICE = Parser
