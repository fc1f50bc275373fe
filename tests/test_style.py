"""House style: ruff keeps the lint rules and the format; mypy checks the runtime's types."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

PATHS = ["taskgraph", "kernels", "tests", "benchmarks", "examples", "slurm", "notebooks"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is part of the test extras: pip install -e '.[test]'"
    proc = subprocess.run(
        [ruff, *command, *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_on_the_runtime():
    mypy = shutil.which("mypy")
    assert mypy, "mypy is part of the test extras: pip install -e '.[test]'"
    proc = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
