"""`hutch trace TASK_ID`: one task's whole life as a timeline, read from the store.

Submit, every attempt (which fetcher, the outcome and status, the proxy's id, the delay
before the next one and where the task went), the item stored or the dead letter and any
replay, in time order, each with the task's trace id. The store keeps these for every
task, and each attempt records its trace id, so this works with no trace exporter: with
one, the trace id finds the same task's spans (and the fetch span of each attempt) in the
trace backend.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from hutch.models import task_id
from hutch.services.control import overapi
from hutch.services.control.terminal import json_text, shown
from hutch.settings import Settings, redact_url
from hutch.store import Store

# The service that writes a dead letter of each stage.
SERVICE_OF_STAGE = {"fetch": "fetcher", "parse": "parser", "store": "storer", "governor": "governor"}


def timeline(found: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a task's life, oldest first (`Store.timeline`'s answer)."""
    task = found["task"]
    trace_id = _trace_of(task.get("message"))
    rows: list[dict[str, Any]] = [
        {"at": task["created_at"], "service": "control", "outcome": "submitted", "trace_id": trace_id}
    ]
    for a in found["attempts"]:
        rows.append({
            "at": a["at"],
            "service": f"fetcher {a['fetcher']}" if a.get("fetcher") else "fetcher",
            "attempt": a["n"],
            "outcome": a["outcome"],
            "status": a["status"],
            "proxy_id": a["proxy_id"],
            "tier": a["tier"],
            "elapsed": a["elapsed"],
            "delay": a["delay"],
            "next": a["next"],
            "trace_id": a.get("trace_id") or trace_id,
            "span_id": a.get("span_id"),
        })
    if found["item"] is not None:
        rows.append({"at": found["item"]["stored_at"], "service": "storer", "outcome": "stored",
                     "status": found["item"]["status"], "trace_id": trace_id})
    for d in found["dead"]:
        rows.append({"at": d["dead_at"], "service": SERVICE_OF_STAGE.get(d["stage"], d["stage"]),
                     "outcome": f"dead ({d['reason']})", "detail": d["detail"], "trace_id": trace_id})
        if d["replayed_at"] is not None:
            rows.append({"at": d["replayed_at"], "service": "control", "outcome": "replayed", "trace_id": trace_id})
    rows.sort(key=lambda row: row["at"])
    return rows


def _trace_of(message: str | None) -> str | None:
    if not message:
        return None
    try:
        found = json.loads(message).get("trace_id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def _local(settings: Settings, wanted: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    store = Store(settings.store_location)
    try:
        found = store.timeline(wanted)
    finally:
        store.close()
    if found is None:
        raise LookupError(f"no task {wanted} in the store at {redact_url(settings.store_location)}")
    return found["task"], timeline(found)


def run(settings: Settings, args: argparse.Namespace) -> int:
    wanted = args.task_id if args.task_id else task_id(args.job, args.url)
    if settings.api_url:
        found = overapi.trace(settings, wanted)
        task, rows = found["task"], found["timeline"]
    else:
        task, rows = _local(settings, wanted)
    if args.json:
        print(json_text({"task": {k: v for k, v in task.items() if k != "message"}, "timeline": rows}, indent=2))
        return 0
    print(
        f"task {shown(task['id'])}  job {shown(task['job'])}  {shown(task['state'])} after "
        f"{task['attempts']} attempt(s)"
    )
    print(f"url  {shown(task['url'])}")
    start = rows[0]["at"]
    print(
        f"{'time (UTC)':<23} {'+s':>8}  {'service':<24} {'outcome':<22} {'status':>6}  {'proxy':<14} "
        f"{'delay':>6}  {'next':<8} trace"
    )
    for row in rows:
        when = datetime.datetime.fromtimestamp(row["at"], datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]
        delay = f"{row['delay']:g}" if row.get("delay") is not None else "-"
        print(
            f"{when:<23} {row['at'] - start:>8.3f}  {shown(row['service']):<24} {shown(row['outcome']):<22} "
            f"{row.get('status') or '-':>6}  {shown(row.get('proxy_id') or '-'):<14} {delay:>6}  "
            f"{shown(row.get('next') or '-'):<8} {shown(row.get('trace_id') or '-')}"
        )
        if row.get("detail"):
            print(f"{'':<34}{shown(row['detail'])[:200]}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "trace", help="one task's life as a timeline: every attempt, its service, outcome, proxy, delay and trace id"
    )
    p.add_argument("task_id", nargs="?", help="the task's id (hutch dlq show, the JSON logs, a span's hutch.task.id)")
    p.add_argument("--job", help="with --url: the task of this URL in this job")
    p.add_argument("--url", help="the URL as submitted")
    p.add_argument("--json", action="store_true", help="the task and its timeline as JSON")
    return p
