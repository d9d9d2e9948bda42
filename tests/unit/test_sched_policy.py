"""HUTCH_SCHED_POLICY: what `set_sched_policy` asks of Linux, what it reports, and a refusal."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from hutch import service
from hutch.service import sched_policy_of, set_sched_policy

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling policies")

CHILD = """
import os, subprocess, sys
from hutch.service import set_sched_policy
print(set_sched_policy(sys.argv[1]), os.sched_getscheduler(0))
later = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                       capture_output=True, text=True, check=True)
print(later.stdout.strip())
"""


@pytest.mark.parametrize(("policy", "expected"), [("batch", os.SCHED_BATCH), ("normal", os.SCHED_OTHER)])
def test_the_process_and_what_it_starts_later_run_under_the_policy_asked_for(policy: str, expected: int) -> None:
    # In a process of its own: the test's process keeps its policy.
    done = subprocess.run([sys.executable, "-c", CHILD, policy], capture_output=True, text=True, check=True)
    reported, own, child = done.stdout.split()
    assert (reported, int(own), int(child)) == (policy, expected, expected)


def test_a_refused_policy_is_logged_and_the_service_runs_on_under_the_one_it_has(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(service.os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.WARNING, logger="hutch.service"):
        assert set_sched_policy("batch") == sched_policy_of(0)
    assert "cannot enter SCHED_BATCH" in caplog.text and "Operation not permitted" in caplog.text
