"""Pausing, resuming, cancelling and weighting a job: one record appended to the `jobs` stream.

The stream is the job's control channel: every governor reads it whole at start and follows
it (a paused job's tasks wait in `frontier.paused`, a cancelled job's tasks end dead as
`cancelled` where they surface, a weight shares each domain's rate between its jobs), and
the storer records each job's state from it for `hutch status`. A record is appended with a
publisher confirm, so a command that returns 0 has its record on the stream.

What the store can tell is checked first: a job it does not know is refused (a typo would
otherwise pause nothing, silently), and so is pausing or resuming a job already cancelled
(its tasks are dead or going dead; a later record would not bring them back). Where the
store is not on this machine the check is skipped and the record goes out as asked. Where it
is, the command records the new state there itself once the broker confirmed the record (the
storer does the same when it reads it: applying a record twice changes nothing), so the
next command and `hutch status` see it at once.

A job with a proxy budget (its spec's `budget:`) is paused by the storer once its spend
reaches it, through the same stream (reason `budget`). Resuming such a job as it is would
only pause it again at its next proxied request, so it is refused where the store can tell;
`resume` takes a new budget, above what the job has spent, with the record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hutch.amqp import Broker
from hutch.models import MAX_BUDGET, JobControl
from hutch.services.control.submit import check_job_name
from hutch.store import Store, store_exists

Action = Literal["pause", "resume", "cancel", "weight"]
MAX_WEIGHT = 1000.0


class JobControlError(ValueError):
    """A control the store says makes no sense (an unknown job, a cancelled one), or a bad weight."""


class BudgetSpent(JobControlError):
    """A resume that would only pause again: the job's proxy budget is spent (or the new one is)."""


@dataclass(frozen=True)
class Known:
    """What the store knows of a job: its state and weight, or nothing (`exists` False)."""

    exists: bool
    state: str = "running"
    weight: float = 1.0
    budget: float | None = None  # its proxy budget; None: none
    spent: float = 0.0


def check_weight(value: float) -> float:
    """`value` when it is a valid job weight: a finite number above 0 and at most 1000."""
    if not math.isfinite(value) or not 0 < value <= MAX_WEIGHT:
        raise JobControlError(f"invalid weight {value!r}: use a number above 0 and at most {MAX_WEIGHT:g}")
    return value


def check_budget(value: float) -> float:
    """`value` when it is a valid proxy budget: a finite number above 0 and at most MAX_BUDGET."""
    if not math.isfinite(value) or not 0 < value <= MAX_BUDGET:
        raise JobControlError(f"invalid budget {value!r}: use a number above 0 (in the proxies' cost units)")
    return value


def check_control(job: str, action: Action, known: Known | None, budget: float | None = None) -> None:
    """Refuse a control the store can tell is wrong; `known` None: the store cannot tell.
    `budget`: the new proxy budget a resume brings."""
    if known is None:
        return
    if not known.exists:
        raise JobControlError(f"no job named {job!r} in the store")
    if known.state == "cancelled" and action in ("pause", "resume"):
        raise JobControlError(f"job {job!r} is cancelled: its tasks end as they surface and it cannot be {action}d")
    if action != "resume":
        return
    if budget is not None and budget <= known.spent:
        raise BudgetSpent(
            f"job {job!r} has spent {known.spent:.4g} on proxies: a budget of {budget:g} would pause it again; "
            "give more than it spent"
        )
    if budget is None and known.budget is not None and known.spent >= known.budget:
        raise BudgetSpent(
            f"job {job!r} has spent its proxy budget ({known.spent:.4g} of {known.budget:g}): resumed as it is, it "
            f"would pause again at its next proxied request; resume it with a budget above {known.spent:.4g} "
            "(--budget)"
        )


def known_job(store_location: str, job: str) -> Known | None:
    """The store's view of `job`; None when there is no store here to ask (none is created)."""
    if not store_exists(store_location):
        return None
    store = Store(store_location)
    try:
        return known_in(store, job)
    finally:
        store.close()


def known_in(store: Store, job: str) -> Known:
    """What `store` knows of `job`."""
    found = store.job_state(job)
    if found is None:
        return Known(False)
    budget, spent = store.job_budget(job) or (None, 0.0)
    return Known(True, found[0], found[1], budget, spent)


def note_control(store_location: str, control: JobControl) -> None:
    """Record `control` in the store here, as the storer will when it reads it from the stream."""
    store = Store(store_location)
    try:
        store.apply_job_control(control)
    finally:
        store.close()


def control_record(job: str, action: Action, weight: float | None = None, budget: float | None = None) -> JobControl:
    """The record for `action` on `job`, checked: a valid name, a weight for `weight` only, a
    budget for `resume` only."""
    check_job_name(job)
    if budget is not None and action != "resume":
        raise JobControlError(f"a {action} record takes no budget")
    if action == "weight":
        if weight is None:
            raise JobControlError("a weight record needs a weight")
        return JobControl(job=job, action=action, weight=check_weight(weight))
    if weight is not None:
        raise JobControlError(f"a {action} record takes no weight")
    if budget is not None:
        return JobControl(job=job, action=action, budget=check_budget(budget))
    return JobControl(job=job, action=action)


async def append_control(broker: Broker, control: JobControl) -> None:
    """Append `control` to the `jobs` stream and wait for the broker's confirm.

    A stream is published to like a queue, through the default exchange under its own name;
    `mandatory` makes a missing stream an error (PublishFailed) rather than a silent drop.
    """
    await broker.publish("", broker.topology.jobs, control)
