"""What a user installs: Hutch's wheel holds the services and the common package, never the sandbox.

The sandbox serves fake sites and hostile pages; it belongs to the tests, the benchmarks and
the demo, so it is a distribution of its own (`sandbox/`). These tests build both wheels from
the repository, as `pip wheel` would for a user or for the image, and read what is inside.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    # With build isolation, as a user's `pip wheel` or the image's build: the build backend
    # comes from the index, like the editable install's.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        timeout=120,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="module")
def hutch_wheel(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    with build_wheel(ROOT, tmp_path_factory.mktemp("hutch-wheel")) as wheel:
        return wheel.namelist()


def test_hutch_wheel_carries_every_service_and_no_sandbox(hutch_wheel: list[str]) -> None:
    for module in ("amqp/broker.py", "models.py", "services/fetcher/app.py", "services/governor/lines.py"):
        assert f"hutch/{module}" in hutch_wheel
    assert not [name for name in hutch_wheel if "sandbox" in name.split("/")[0] or "/sandbox/" in name]


def test_sandbox_wheel_carries_its_sites_and_default_config(tmp_path: Path) -> None:
    with build_wheel(ROOT / "sandbox", tmp_path) as wheel:
        names = wheel.namelist()
    assert "hutch_sandbox/site.py" in names
    assert "hutch_sandbox/hostile/pages.py" in names
    assert "hutch_sandbox/default.yaml" in names
    assert not [name for name in names if name.startswith("hutch/")]


def test_hutch_sandbox_names_the_missing_distribution_in_one_sentence(tmp_path: Path) -> None:
    # A Hutch installed without the sandbox (the image, a user's pip install): the command
    # says what to install, with exit status 2 and no traceback.
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "hutch_sandbox.py").write_text("raise ImportError('not installed here')\n")
    done = subprocess.run(
        [sys.executable, "-c", "from hutch.services.control.cli import main; main(['sandbox'])"],
        env={"PYTHONPATH": str(hide), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "pip install -e ./sandbox" in done.stderr
    assert "Traceback" not in done.stderr
