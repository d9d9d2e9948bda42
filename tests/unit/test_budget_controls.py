"""`hutch resume [--budget B]` on a job whose proxy budget is spent, and how `hutch status`
shows a budget and the pause it caused; `hutch dlq show` never prints a header or cookie value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hutch.models import Event, FieldRule, JobControl, Spec, Task
from hutch.services.control.cli import budget_text, build_parser, job_state_text, main
from hutch.services.control.jobs import BudgetSpent, JobControlError, Known, check_control, control_record
from hutch.store import JobCounts, Store

SECRET = "s3cr3t-session-token"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


@pytest.fixture
def store_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HUTCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HUTCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:9/")  # nothing listens
    monkeypatch.setenv("HUTCH_CONNECT_TIMEOUT", "1")
    return tmp_path / "data" / "hutch.sqlite3"


def spent_job(path: Path, budget: float = 5.0, spent: float = 5.02) -> None:
    store = Store(f"sqlite:///{path}")
    store.add_job("j", {"fields": {}, "budget": budget})
    store.add_tasks([("t1", "j", "http://a.test/", "a.test")])
    event = Event(
        kind="outcome", task_id="t1", job="j", domain="a.test", attempt=1, at=1.0, outcome="ok", proxy_id="px-1",
        tier="mobile", cost=spent, next="retry", delay=1.0,
    )  # fmt: skip
    store.apply_event(event)
    store.apply_job_control(JobControl(job="j", action="pause", reason="budget"))
    store.close()


def test_resume_takes_a_budget_and_nothing_else_does() -> None:
    assert build_parser().parse_args(["resume", "j", "--budget", "7.5"]).budget == 7.5
    assert build_parser().parse_args(["resume", "j"]).budget is None
    assert control_record("j", "resume", budget=7.5).budget == 7.5
    with pytest.raises(JobControlError):
        control_record("j", "pause", budget=7.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pause", "j", "--budget", "1"])


@pytest.mark.parametrize("budget", ["0", "-1", "inf", "nan", "lots"])
def test_a_budget_that_is_not_a_number_above_0_is_refused(budget: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["resume", "j", "--budget", budget], capsys)
    assert code == 2 and "budget" in err


def test_resuming_a_job_whose_budget_is_spent_is_refused_and_says_how(
    store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spent_job(store_path)
    code, _, err = run(["resume", "j"], capsys)
    assert code == 2
    assert err == (
        "hutch: job 'j' has spent its proxy budget (5.02 of 5): resumed as it is, it would pause again at its next "
        "proxied request; resume it with a budget above 5.02 (--budget)\n"
    )
    code, _, err = run(["resume", "j", "--budget", "5.01"], capsys)
    assert code == 2 and "would pause it again" in err


def test_a_budget_above_the_spend_gets_past_the_check(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spent_job(store_path)
    code, _, err = run(["resume", "j", "--budget", "10"], capsys)
    assert code == 2 and "HUTCH_AMQP_URL" in err  # refused only by the broker nothing listens on


def test_check_control_on_budgets() -> None:
    spent = Known(True, "paused", budget=5.0, spent=5.02)
    with pytest.raises(BudgetSpent):
        check_control("j", "resume", spent)
    with pytest.raises(BudgetSpent):
        check_control("j", "resume", spent, budget=5.02)
    check_control("j", "resume", spent, budget=5.03)
    check_control("j", "pause", spent)
    check_control("j", "cancel", spent)
    check_control("j", "resume", Known(True, "paused", budget=5.0, spent=4.0))
    check_control("j", "resume", Known(True, "paused"))


def test_status_shows_the_reason_and_the_budget() -> None:
    paused = JobCounts("j", 10, 2, 0, 0, 8, state="paused", budget=5.0, spent=5.02, reason="budget")
    assert job_state_text(paused) == "paused: budget"
    assert budget_text(paused) == "paused: proxy budget 5.00 spent (5.02); hutch resume j --budget B"
    running = JobCounts("j", 10, 2, 0, 0, 8, budget=0.5, spent=0.0123)
    assert budget_text(running) == "proxy budget 0.5, 0.0123 spent"
    assert job_state_text(running) == "running"


def test_status_prints_the_budget_line_under_the_table(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spent_job(store_path)
    code, out, _ = run(["status"], capsys)
    assert code == 0
    assert "paused: budget" in out
    assert "job j: paused: proxy budget 5.00 spent (5.02); hutch resume j --budget B" in out
    code, out, _ = run(["status", "j", "--json"], capsys)
    (row,) = json.loads(out)
    assert (row["state"], row["reason"], row["budget"], row["spent"]) == ("paused", "budget", 5.0, 5.02)


def test_dlq_show_prints_header_names_and_no_values(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rule = FieldRule(kind="css", expr="title::text")
    spec = Spec(fields={"title": rule}, headers={"Authorization": f"Bearer {SECRET}"}, cookies={"sid": SECRET})
    task = Task(id="t1", job="j", url="http://a.test/", domain="a.test", spec=spec)
    store = Store(f"sqlite:///{store_path}")
    store.record_dead(task.dead_letter("fetch", "not_found", "HTTP 404"), "m1")
    (entry,) = store.dead_entries()
    store.close()
    code, out, _ = run(["dlq", "show", str(entry["id"])], capsys)
    assert code == 0
    assert SECRET not in out
    shown = json.loads(out)["letter"]["task"]["spec"]
    assert shown["headers"] == {"Authorization": "[redacted]"} and shown["cookies"] == {"sid": "[redacted]"}
