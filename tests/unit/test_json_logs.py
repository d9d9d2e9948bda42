"""JSON log lines carry the job, task, domain, attempt and trace id of the work in hand."""

from __future__ import annotations

import json
import logging

import pytest

from hutch import telemetry
from hutch.models import Task


def line(formatter: logging.Formatter, message: str, exc: BaseException | None = None) -> dict[str, object]:
    record = logging.LogRecord("hutch.test", logging.WARNING, __file__, 1, message, (), None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    found: dict[str, object] = json.loads(formatter.format(record))
    return found


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_json_logs", True)  # as setup_logging(..., "json") sets it


def test_a_line_about_a_task_names_it_and_its_trace(json_logs: None) -> None:
    formatter = telemetry.JsonFormatter("fetcher")
    task = Task(id="t1", job="shop", url="http://a.example/x", domain="a.example", attempts=2)
    with telemetry.about(task):
        found = line(formatter, f"slow answer from {task.domain}")
    assert found["service"] == "fetcher" and found["level"] == "WARNING" and found["logger"] == "hutch.test"
    assert found["message"] == "slow answer from a.example"
    assert (found["job"], found["task_id"], found["domain"], found["attempt"]) == ("shop", "t1", "a.example", 2)
    assert found["trace_id"] == task.trace_id
    outside = line(formatter, "idle")
    assert "task_id" not in outside and "trace_id" not in outside


def test_an_exception_is_one_field_of_one_line() -> None:
    try:
        raise ValueError("bad\\nthing")
    except ValueError as exc:
        found = line(telemetry.JsonFormatter("parser"), "failed", exc)
    assert "ValueError" in str(found["exception"])
