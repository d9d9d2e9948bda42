"""The Prometheus files in deploy/ as promtool reads them: the alert rules load and their unit
tests pass (each alert fires on its condition and stays quiet on its look-alike), and the
scrape configurations for `hutch up` and compose are valid."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool (Debian's prometheus package) is not installed (make tools installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def run(promtool: str, *args: str) -> str:
    done = subprocess.run([promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_alert_rules_load(promtool: str) -> None:
    assert "SUCCESS" in run(promtool, "check", "rules", "alerts.yml")


def test_each_alert_fires_on_its_condition_and_not_on_its_look_alike(promtool: str) -> None:
    assert "SUCCESS" in run(promtool, "test", "rules", "alerts.test.yml")


@pytest.mark.parametrize("config", ["hutch-up.yml", "compose.yml"])
def test_the_scrape_configurations_are_valid(promtool: str, config: str) -> None:
    assert "SUCCESS" in run(promtool, "check", "config", config)
