"""`hutch pause|resume|cancel|weight`, `--weight` and the `status --domains` options: what the
command line accepts, what it refuses (one sentence, exit 2) before any broker is asked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hutch.models import DeadLetter, Item, Task
from hutch.services.control.cli import build_parser, domain_request, job_state_text, main
from hutch.services.control.jobs import (
    JobControlError,
    Known,
    check_control,
    check_weight,
    control_record,
    known_job,
)
from hutch.store import JobCounts, Store


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    return int(done.value.code or 0), capsys.readouterr().err


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store folder of the test's own and a broker address where nothing listens."""
    monkeypatch.setenv("HUTCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HUTCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:9/")
    monkeypatch.setenv("HUTCH_CONNECT_TIMEOUT", "1")
    return tmp_path / "data" / "hutch.sqlite3"


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
def test_each_control_command_takes_one_job(action: str) -> None:
    args = build_parser().parse_args([action, "crawl-1"])
    assert (args.command, args.job) == (action, "crawl-1")


def test_weight_takes_a_job_and_a_weight() -> None:
    args = build_parser().parse_args(["weight", "crawl-1", "2.5"])
    assert (args.job, args.weight) == ("crawl-1", 2.5)


@pytest.mark.parametrize("command", ["submit", "run"])
def test_submit_and_run_accept_a_weight(command: str) -> None:
    args = build_parser().parse_args([command, "urls.txt", "--weight", "1000"])
    assert args.weight == 1000.0
    assert build_parser().parse_args([command, "urls.txt"]).weight is None


@pytest.mark.parametrize("weight", ["0", "-1", "1000.5", "nan", "inf", "heavy"])
def test_a_weight_outside_0_to_1000_is_refused_with_exit_2(weight: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["weight", "j", weight], capsys)
    assert code == 2
    assert "weight" in err and "Traceback" not in err


def test_check_weight_bounds() -> None:
    assert check_weight(0.001) == 0.001
    assert check_weight(1000) == 1000
    for bad in (0.0, -2.0, 1000.01, math.nan, math.inf):
        with pytest.raises(JobControlError):
            check_weight(bad)


def test_an_invalid_job_name_is_refused_before_the_broker_is_asked(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["pause", "../etc"], capsys)
    assert code == 2
    assert err.startswith("hutch: invalid job name") and err.count("\n") == 1


def test_a_job_the_store_does_not_know_is_refused(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Store(f"sqlite:///{env}").close()
    code, err = run(["cancel", "nosuchjob"], capsys)
    assert (code, err) == (2, "hutch: no job named 'nosuchjob' in the store\n")


def test_pausing_a_cancelled_job_is_refused(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(f"sqlite:///{env}")
    store.add_job("j", None)
    store.apply_job_control(control_record("j", "cancel"))
    store.close()
    code, err = run(["pause", "j"], capsys)
    assert code == 2
    assert "is cancelled" in err


def test_an_unreachable_broker_is_one_sentence_and_exit_2(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(f"sqlite:///{env}")
    store.add_job("j", None)
    store.close()
    code, err = run(["pause", "j"], capsys)
    assert code == 2
    assert err.startswith("hutch: ") and "HUTCH_AMQP_URL" in err and err.count("\n") == 1


def test_without_a_store_here_the_control_is_not_checked_against_it(env: Path) -> None:
    assert known_job(f"sqlite:///{env}", "j") is None
    assert not env.exists()  # asking created no store


def test_check_control_refuses_only_what_the_store_can_tell() -> None:
    check_control("j", "pause", None)
    check_control("j", "cancel", Known(True, "cancelled"))
    check_control("j", "weight", Known(True, "cancelled"))
    with pytest.raises(JobControlError, match="no job named"):
        check_control("j", "resume", Known(False))
    with pytest.raises(JobControlError, match="cannot be resumed"):
        check_control("j", "resume", Known(True, "cancelled"))


def test_control_records_carry_a_weight_only_when_weighting() -> None:
    assert control_record("j", "weight", 2.0).weight == 2.0
    assert control_record("j", "pause").weight is None
    with pytest.raises(JobControlError):
        control_record("j", "weight")
    with pytest.raises(JobControlError):
        control_record("j", "pause", 2.0)


def test_domain_options_build_the_governors_query() -> None:
    args = build_parser().parse_args(
        ["status", "--domains", "--top", "5", "--sort", "throttled", "--match", "*.shop", "--paused"]
    )
    request = domain_request(args)
    assert (request.top, request.sort, request.match, request.paused_only) == (5, "throttled", "*.shop", True)
    default = domain_request(build_parser().parse_args(["status", "--domains"]))
    assert (default.top, default.sort, default.match, default.paused_only) == (20, "held", None, False)


@pytest.mark.parametrize("bad", [["--top", "0"], ["--top", "10001"], ["--top", "x"], ["--sort", "backlog"]])
def test_domain_options_out_of_bounds_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(["status", "--domains", *bad], capsys)
    assert code == 2


def test_domain_options_without_domains_are_refused(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["status", "--top", "5"], capsys)
    assert (code, err) == (2, "hutch: --top, --sort, --match and --paused go with --domains\n")


def test_a_jobs_state_reads_as_a_word_with_its_weight_when_not_one() -> None:
    assert job_state_text(JobCounts("j", 4, 1, 0, 0, 3)) == "running"
    assert job_state_text(JobCounts("j", 4, 1, 0, 0, 3, state="paused", weight=2.0)) == "paused w=2"
    assert job_state_text(JobCounts("j", 4, 2, 2, 0, 0, cancelled=2, state="cancelled")) == "cancelled, finished"
    assert job_state_text(JobCounts("j", 4, 4, 0, 0, 0)) == "finished"


def test_status_shows_each_jobs_state_and_its_json_carries_state_weight_and_finished(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(f"sqlite:///{env}")
    for job in ("a", "b"):
        store.add_job(job, None)
        store.add_tasks([(f"{job}1", job, f"http://{job}.example/", f"{job}.example")])
    store.apply_job_control(control_record("a", "pause"))
    store.apply_job_control(control_record("b", "weight", 4.0))
    store.close()
    with pytest.raises(SystemExit):
        main(["status"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["job", "state"]
    assert table[1].split()[:2] == ["a", "paused"]
    assert table[2].split()[:3] == ["b", "running", "w=4"]
    with pytest.raises(SystemExit):
        main(["status", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["job"], r["state"], r["weight"], r["finished"]) for r in rows] == [
        ("a", "paused", 1.0, False),
        ("b", "running", 4.0, False),
    ]


@pytest.mark.parametrize("command", ["submit", "run"])
def test_submitting_to_a_cancelled_job_is_refused(
    command: str, env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(f"sqlite:///{env}")
    store.add_job("gone", None)
    store.apply_job_control(control_record("gone", "cancel"))
    store.close()
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.example/\n")
    code, err = run([command, str(urls), "--job", "gone"], capsys)
    assert code == 2
    assert "is cancelled" in err and "new job" in err


def test_jobs_delete_removes_a_done_job_whole_and_refuses_one_still_running(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(f"sqlite:///{env}")
    for job in ("done", "busy"):
        store.add_job(job, None)
        store.add_tasks([(f"{job}{n}", job, f"http://{job}.example/{n}", f"{job}.example") for n in range(3)])
    for n in range(2):
        task = Task(id=f"done{n}", job="done", url=f"http://done.example/{n}", domain="done.example")
        store.store_item(Item(task=task, status=200, fields={"title": "t"}, parsed_at=1.0))
    gone = Task(id="done2", job="done", url="http://done.example/2", domain="done.example")
    store.record_dead(DeadLetter(stage="fetch", reason="not_found", detail="", task=gone), "m1")
    store.close()

    code, err = run(["jobs", "delete", "busy"], capsys)
    assert code == 2 and "has 3 tasks pending" in err and "hutch cancel busy" in err
    code, err = run(["jobs", "delete", "done"], capsys)
    assert code == 0, err
    assert "deleted job done: 3 tasks, 2 items, 0 attempts, 1 dead letters" in err
    code, err = run(["jobs", "delete", "done"], capsys)
    assert code == 2 and "no job named 'done'" in err

    store = Store(f"sqlite:///{env}")
    try:
        assert [c.job for c in store.counts()] == ["busy"]
        assert store.dead_entries(job="done") == [] and list(store.items("done")) == []
        store.apply_job_control(control_record("busy", "cancel"))  # cancelled counts as done
    finally:
        store.close()
    code, err = run(["jobs", "delete", "busy"], capsys)
    assert code == 0 and "deleted job busy: 3 tasks" in err


def test_retention_picks_the_jobs_done_longer_ago_than_it(env: Path) -> None:
    store = Store(f"sqlite:///{env}")
    try:
        for job in ("old", "new", "open"):
            store.add_job(job, None)
            store.add_tasks([(f"{job}1", job, f"http://{job}.example/", f"{job}.example")])
        for job in ("old", "new"):
            task = Task(id=f"{job}1", job=job, url=f"http://{job}.example/", domain=f"{job}.example")
            store.record_dead(DeadLetter(stage="fetch", reason="not_found", detail="", task=task), job)
        store.db.execute("UPDATE tasks SET updated_at = 100 WHERE job IN ('old', 'open')")
        store.db.commit()
        assert store.finished_jobs(before=1000.0) == ["old"]  # `new` finished since, `open` never did
    finally:
        store.close()
