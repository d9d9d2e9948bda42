"""The reconciler's decisions: which silent tasks are lost, rescued or stalled, and which are left."""

from __future__ import annotations

import dataclasses

import pytest

from hutch.models import Spec, Task
from hutch.services.storer.reconcile import (
    Config,
    Observed,
    Verdict,
    decide,
    domains_to_look_at,
    empty_since,
    rebuild,
)
from hutch.store import Silent

CONFIG = Config(permit_ttl=30.0, fetch_deadline=40.0, margin=100.0, max_rescues=3)
NOW = 10_000.0
UP = Observed(fetchers_up=True, empty_for={"example.com": 100.0})


def silent(state: str = "in_flight", due_at: float = 0.0, rescues: int = 0, **extra: object) -> Silent:
    fields: dict[str, object] = {
        "id": "t1",
        "job": "j",
        "url": "http://example.com/a",
        "domain": "example.com",
        "state": state,
        "attempts": 1,
        "incarnation": 0,
        "rescues": rescues,
        "due_at": due_at,
        "message": None,
        "spec": None,
    }
    fields.update(extra)
    return Silent(**fields)  # type: ignore[arg-type]


def test_a_task_in_flight_past_its_permit_and_fetch_deadline_and_margin_is_rescued() -> None:
    task = silent(due_at=NOW - 170.01)
    assert decide(task, NOW, CONFIG, UP).action == "rescue"
    assert decide(task, NOW, CONFIG, UP).why == "in_flight_expired"


def test_a_task_in_flight_within_its_deadlines_is_left_alone() -> None:
    verdict = decide(silent(due_at=NOW - 169.0), NOW, CONFIG, UP)
    assert (verdict.action, verdict.why) == ("leave", "not_yet")


def test_a_task_in_flight_while_no_fetcher_consumes_fetch_ready_is_left_waiting_there() -> None:
    verdict = decide(silent(due_at=NOW - 10_000), NOW, CONFIG, Observed(fetchers_up=False))
    assert (verdict.action, verdict.why) == ("leave", "no_fetcher")


def test_a_task_in_flight_is_left_while_fetch_ready_holds_tasks_it_may_be_one_of() -> None:
    waiting = Observed(fetchers_up=True, fetch_ready_waiting=True)
    verdict = decide(silent(due_at=NOW - 10_000), NOW, CONFIG, waiting)
    assert (verdict.action, verdict.why) == ("leave", "in_fetch_ready")


def test_a_retry_long_overdue_from_its_tier_with_an_empty_domain_queue_is_rescued() -> None:
    verdict = decide(silent("retrying", due_at=NOW - 101), NOW, CONFIG, UP)
    assert (verdict.action, verdict.why) == ("rescue", "retry_overdue")


def test_a_retry_in_a_long_tier_before_it_is_due_is_left_alone() -> None:
    # Due in an hour: it waits in its delay tier.
    verdict = decide(silent("retrying", due_at=NOW + 3600), NOW, CONFIG, UP)
    assert (verdict.action, verdict.why) == ("leave", "not_yet")
    # Due a moment ago: the tier is returning it, within the margin.
    assert decide(silent("retrying", due_at=NOW - 99), NOW, CONFIG, UP).action == "leave"


def test_an_overdue_retry_is_left_unless_its_domain_queue_was_seen_empty_for_the_whole_margin() -> None:
    overdue = silent("retrying", due_at=NOW - 10_000)
    # Not empty at the last look, or of unknown depth: it may be in the backlog.
    verdict = decide(overdue, NOW, CONFIG, Observed(fetchers_up=True, empty_for={}))
    assert (verdict.action, verdict.why) == ("leave", "in_backlog")
    # Empty for a moment only: a governor may be holding it, waiting for a token.
    assert decide(overdue, NOW, CONFIG, Observed(fetchers_up=True, empty_for={"example.com": 99.0})).action == "leave"
    assert decide(overdue, NOW, CONFIG, Observed(fetchers_up=True, empty_for={"example.com": 100.0})).action == "rescue"


def test_nothing_is_touched_while_outcome_events_wait_for_the_storer() -> None:
    behind = Observed(fetchers_up=True, store_behind=True, empty_for={"example.com": 1e6})
    for task in (silent(due_at=0.0), silent("retrying", due_at=0.0)):
        assert decide(task, NOW, CONFIG, behind) == Verdict("leave", "store_behind")


def test_a_domain_queue_counts_as_empty_from_its_first_empty_look_until_a_look_finds_tasks() -> None:
    since = empty_since({}, {"a": 0, "b": 3, "c": None}, now=10.0)
    assert since == {"a": 10.0}
    since = empty_since(since, {"a": 0, "b": 0}, now=20.0)
    assert since == {"a": 10.0, "b": 20.0}
    since = empty_since(since, {"a": 2, "b": 0}, now=30.0)
    assert since == {"b": 20.0}


@pytest.mark.parametrize("state", ["new", "queued", "stored", "dead"])
def test_tasks_in_any_other_state_are_never_touched(state: str) -> None:
    assert decide(silent(state, due_at=0.0), NOW, CONFIG, UP).action == "leave"


def test_a_task_lost_again_after_its_last_rescue_is_stalled() -> None:
    assert decide(silent(due_at=0.0, rescues=2), NOW, CONFIG, UP).action == "rescue"
    verdict = decide(silent(due_at=0.0, rescues=3), NOW, CONFIG, UP)
    assert (verdict.action, verdict.why) == ("stall", "in_flight_expired")
    no_rescues = dataclasses.replace(CONFIG, max_rescues=0)
    assert decide(silent("retrying", due_at=0.0), NOW, no_rescues, UP).action == "stall"


def test_only_domains_of_overdue_retries_are_looked_at() -> None:
    tasks = [
        silent("retrying", due_at=0.0, domain="a.test"),
        silent("retrying", due_at=NOW, domain="b.test"),
        silent("in_flight", due_at=0.0, domain="c.test"),
    ]
    assert domains_to_look_at(tasks, NOW, CONFIG) == {"a.test"}


def test_a_rescued_task_is_its_latest_message_with_the_new_incarnation_and_no_permit() -> None:
    latest = Task(
        id="t1", job="j", url="http://example.com/a", domain="example.com", attempts=2,
        permit={"id": "p", "issued": 1.0, "expires": 2.0}, incarnation=1,
    )  # fmt: skip
    task = rebuild(silent(message=latest.model_dump_json(), incarnation=1), 2)
    assert (task.attempts, task.incarnation, task.permit) == (2, 2, None)
    assert task.model_copy(update={"incarnation": 1, "permit": latest.permit}) == latest


def test_a_task_recorded_without_its_message_is_rebuilt_from_its_row_and_job_spec() -> None:
    spec = Spec.model_validate({"fields": {"title": {"kind": "css", "expr": "title"}}})
    task = rebuild(silent(spec=spec.model_dump_json(), attempts=2), 1)
    assert (task.id, task.url, task.domain, task.attempts, task.incarnation) == (
        "t1", "http://example.com/a", "example.com", 2, 1,
    )  # fmt: skip
    assert task.spec == spec
