"""`hutch dlq`: list, inspect, replay and purge dead letters.

The storer's ledger (the store's `dead` table) indexes every dead letter with its stage,
reason, domain and the whole letter (the task and its attempt history). Replay republishes
the matching letters with confirms and marks each replayed only once the broker has it, so
an interrupted replay is resumed by running it again and nothing is sent twice: a task goes
back to the frontier (its attempts reset with `--reset-attempts`), and a page that
failed to parse goes straight back to the parser, without a re-fetch. A letter that could
not be decoded at all has no task to replay and is left in the ledger. `show` prints a
letter with the values of its spec's headers and cookies redacted (`hutch.request_options`);
a replay sends them as they were.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from hutch.amqp import Broker
from hutch.models import DeadLetter
from hutch.request_options import redact
from hutch.services.control import overapi
from hutch.services.control.terminal import json_text, shown
from hutch.settings import Settings
from hutch.store import Store
from hutch.topology import PARSE_KEY

BATCH = 200


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {"job": args.job, "domain": args.domain, "reason": args.reason}


def _open(settings: Settings) -> Store:
    return Store(settings.store_location)


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    limit = args.limit if args.limit is not None else (None if args.json else 50)
    if settings.api_url:
        groups, entries = overapi.dead(settings, _filters(args), limit)
    else:
        store = _open(settings)
        try:
            groups = store.dead_groups(**_filters(args))
            entries = store.dead_entries(**_filters(args), limit=limit)
        finally:
            store.close()
    if args.json:
        print(json_text({"groups": groups, "entries": entries}))
        return 0
    total = sum(group["count"] for group in groups)
    print(f"{total} dead letters")
    print(f"{'count':>7}  {'reason':<18} domain")
    for group in groups:
        print(f"{group['count']:>7}  {shown(group['reason']):<18} {shown(group['domain'] or '-')}")
    if entries:
        print()
        print(f"{'id':>6}  {'stage':<8} {'reason':<18} {'tries':>5}  url")
        for entry in entries:
            print(
                f"{entry['id']:>6}  {shown(entry['stage']):<8} {shown(entry['reason']):<18} "
                f"{entry['attempts'] if entry['attempts'] is not None else '-':>5}  "
                f"{shown(entry['url'] or '(undecodable)')}"
            )
        if limit is not None and len(entries) == limit:
            print(f"(first {limit}; --limit to see more)")
    return 0


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    if settings.api_url:
        print(json_text(overapi.dead_entry(settings, args.id), indent=2))
        return 0
    store = _open(settings)
    try:
        entry = store.dead_entry(args.id)
    finally:
        store.close()
    if entry is None:
        raise LookupError(f"no dead letter with id {args.id}")
    entry["letter"] = json.loads(entry["letter"])
    print(json_text(redact(entry), indent=2))  # a job's header and cookie values may be credentials
    return 0


StoreCall = Callable[[Callable[[Store], Any]], Awaitable[Any]]


async def replay_with(
    broker: Broker, call: StoreCall, filters: dict[str, Any], reset_attempts: bool
) -> tuple[int, int]:
    """Republish matching dead letters on `broker`, the store reached through `call` (an
    `AsyncStore.run`, or a plain call in the CLI); returns (replayed, skipped as not
    replayable). Each batch is marked replayed once the broker confirmed all of it."""
    replayed = skipped = 0
    entries = await call(lambda s: s.dead_entries(**filters))
    topology = broker.topology
    for start in range(0, len(entries), BATCH):
        chunk = [entry["id"] for entry in entries[start : start + BATCH]]
        letters = await call(functools.partial(_entries, chunk))
        sends = []
        ids = []
        for full in letters:
            assert full is not None
            letter = DeadLetter.model_validate_json(full["letter"])
            if letter.page is not None:
                sends.append(broker.publish(topology.work, PARSE_KEY, letter.page))
            elif letter.task is not None:
                task = letter.task.model_copy(update={"permit": None})
                if reset_attempts:
                    task = task.model_copy(update={"attempts": 0, "failed_proxies": []})
                sends.append(broker.publish(topology.frontier, topology.shard_key(task.domain), task))
            else:
                skipped += 1
                continue
            ids.append(full["id"])
        await asyncio.gather(*sends)
        await call(functools.partial(_mark_replayed, ids))
        replayed += len(ids)
    return replayed, skipped


def _entries(ids: list[int], store: Store) -> list[dict[str, Any] | None]:
    return [store.dead_entry(i) for i in ids]


def _mark_replayed(ids: list[int], store: Store) -> None:
    store.mark_replayed(ids)


async def replay(settings: Settings, filters: dict[str, Any], reset_attempts: bool) -> tuple[int, int]:
    """Republish matching dead letters; returns (replayed, skipped as not replayable)."""
    store = _open(settings)
    broker = await Broker(settings, "control").connect()

    async def call(fn: Callable[[Store], Any]) -> Any:
        return fn(store)

    try:
        return await replay_with(broker, call, filters, reset_attempts)
    finally:
        await broker.close()
        store.close()


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    if settings.api_url:
        replayed, skipped = overapi.replay(settings, _filters(args), args.reset_attempts)
    else:
        replayed, skipped = asyncio.run(replay(settings, _filters(args), args.reset_attempts))
    print(f"replayed {replayed} dead letters" + (f"; {skipped} undecodable ones left" if skipped else ""))
    return 0


def _confirmed(count: int, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise PermissionError(f"purging {count} dead letters needs --yes when not asked at a terminal")
    return input(f"purge {count} dead letters? [y/N] ").strip().lower() in ("y", "yes")


def cmd_purge(settings: Settings, args: argparse.Namespace) -> int:
    if settings.api_url:
        groups, _ = overapi.dead(settings, _filters(args), 1)
        count = sum(group["count"] for group in groups)
        if not count:
            print("nothing to purge")
            return 0
        if not _confirmed(count, args.yes):
            print("nothing purged")
            return 1
        print(f"purged {overapi.purge(settings, _filters(args))} dead letters")
        return 0
    store = _open(settings)
    try:
        entries = store.dead_entries(**_filters(args))
        if not entries:
            print("nothing to purge")
            return 0
        if not _confirmed(len(entries), args.yes):
            print("nothing purged")
            return 1
        purged = store.mark_purged(entry["id"] for entry in entries)
    finally:
        store.close()
    print(f"purged {purged} dead letters")
    return 0


def add_parser(sub: Any) -> None:
    """Register `hutch dlq ...` on the main parser's subparsers."""
    dlq = sub.add_parser("dlq", help="list, show, replay and purge dead letters")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--job", help="only this job")
        p.add_argument("--domain", help="only this domain (host[:port])")
        p.add_argument("--reason", help="only this reason (e.g. not_found, timeout, decode)")

    p = actions.add_parser("list", help="counts by reason and domain, then the entries")
    filters(p)
    p.add_argument("--limit", type=int, help="entries to list (default 50; all with --json)")
    p.add_argument("--json", action="store_true", help='print {"groups": [...], "entries": [...]}')
    p.set_defaults(dlq_run=cmd_list)

    p = actions.add_parser("show", help="one dead letter whole, with its attempt history")
    p.add_argument("id", type=int)
    p.set_defaults(dlq_run=cmd_show)

    p = actions.add_parser("replay", help="republish matching dead letters")
    filters(p)
    p.add_argument("--reset-attempts", action="store_true", help="give replayed tasks a fresh attempt budget")
    p.set_defaults(dlq_run=cmd_replay)

    p = actions.add_parser("purge", help="drop matching dead letters from the ledger")
    filters(p)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(dlq_run=cmd_purge)
