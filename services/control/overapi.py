"""The CLI's job commands through the API (`HUTCH_API_URL`): the data each command prints,
fetched from the API instead of the store and the broker, so the command prints it the same
way. Errors are `hutch.remote`'s (`RemoteRefused`, `RemoteUnavailable`), which the CLI
prints as its own."""

from __future__ import annotations

import codecs
import dataclasses
import tempfile
from pathlib import Path
from typing import IO, Any

from hutch.models import StatusRequest
from hutch.remote import Remote
from hutch.services.control.submit import valid_urls
from hutch.services.governor.status import DomainReport, FrontierDepth
from hutch.settings import Settings
from hutch.store import JobCounts

_COUNTS = {f.name for f in dataclasses.fields(JobCounts)}


def job_rows(settings: Settings, job: str | None) -> tuple[list[JobCounts], list[dict[str, Any]]]:
    """`hutch status [JOB]`: each job's counts, and the proxy costs of them all."""
    with Remote(settings) as remote:
        found = [remote.job(job)] if job is not None else remote.jobs()
    rows = [JobCounts(**{k: v for k, v in row.items() if k in _COUNTS}) for row in found]
    return rows, [cost for row in found for cost in row.get("costs", [])]


def domain_report(settings: Settings, request: StatusRequest) -> DomainReport:
    params = {"top": request.top, "sort": request.sort, "match": request.match, "paused_only": request.paused_only}
    with Remote(settings) as remote:
        found = remote.domains(params)
    frontier = FrontierDepth(shards=list(found["frontier"]["shards"]), paused=found["frontier"]["paused"])
    return DomainReport(found["domains"], found["total_domains"], found["governors"], frontier)


def submit(
    settings: Settings, job: str, path: Path, spec_path: str | None, tier_floor: str | None, weight: float | None
) -> dict[str, Any]:
    """The URL file streamed to the API; with lines skipped (`--skip-invalid`), only the valid
    ones (through a temporary file), since the API refuses a file with a bad line."""
    spec_text = Path(spec_path).read_text(encoding="utf-8") if spec_path else None
    with Remote(settings) as remote, tempfile.TemporaryFile() as valid:
        for url in valid_urls(path, settings.max_url_bytes):
            valid.write(url.encode() + b"\n")
        valid.seek(0)
        return remote.submit_file(job, valid, spec_text, tier_floor, weight)


def export(settings: Settings, job: str, out: IO[str], form: str = "jsonl") -> int | None:
    """The items written; None for CSV, which comes as bytes, not a row at a time."""
    count = 0
    text = codecs.getincrementaldecoder("utf-8")()  # a character may straddle two chunks
    with Remote(settings) as remote:
        for chunk in remote.items(job, form):
            out.write(text.decode(chunk))
            count += 1
    out.write(text.decode(b"", final=True))
    return count if form == "jsonl" else None


def control(settings: Settings, job: str, action: str, weight: float | None, budget: float | None = None) -> None:
    with Remote(settings) as remote:
        remote.control(job, action, weight, budget)


def delete(settings: Settings, job: str) -> dict[str, int]:
    with Remote(settings) as remote:
        return remote.delete(job)


def dead(settings: Settings, filters: dict[str, Any], limit: int | None) -> tuple[list[Any], list[Any]]:
    with Remote(settings) as remote:
        found = remote.dead(filters, limit if limit is not None else 10_000)
    return found["groups"], found["entries"]


def dead_entry(settings: Settings, entry_id: int) -> dict[str, Any]:
    with Remote(settings) as remote:
        return remote.dead_entry(entry_id)


def replay(settings: Settings, filters: dict[str, Any], reset_attempts: bool) -> tuple[int, int]:
    with Remote(settings) as remote:
        done = remote.replay(filters, reset_attempts)
    return done["replayed"], done["skipped"]


def purge(settings: Settings, filters: dict[str, Any]) -> int:
    with Remote(settings) as remote:
        return remote.purge(filters)


def trace(settings: Settings, task_id: str) -> dict[str, Any]:
    with Remote(settings) as remote:
        return remote.trace(task_id)
