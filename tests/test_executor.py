"""The shared executor suite at 1 rank (in-process, no MPI) and 2 and 3 ranks (mpiexec)."""

from __future__ import annotations

import re

import pytest
import scenarios

pytestmark = pytest.mark.timeout(180)


def passed_ranks(output: str, name: str) -> set[int]:
    """Ranks that printed PASS (rank output may interleave on one line)."""
    return {int(r) for r in re.findall(rf"PASS {name} (\d+)/\d+", output)}


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_one_rank_without_mpi(name):
    scenarios.SCENARIOS[name]()


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_under_mpiexec(name, ranks, mpirun):
    proc = mpirun(ranks, [str(scenarios.__file__), name], timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert passed_ranks(proc.stdout, name) == set(range(ranks)), proc.stdout + proc.stderr
