"""A system MPI (Debian's Open MPI) instead of the mpich wheel: same code, same results.

The mpi4py wheel carries both the MPICH and the Open MPI ABI and picks one from the
library it loads (MPI4PY_LIBMPI); TASKGRAPH_MPIEXEC names the launcher. `.ci/run`
installs openmpi-bin, so CI runs these; elsewhere they skip when it is missing.
"""

from __future__ import annotations

import glob
import os

import pytest
import scenarios
from test_executor import passed_ranks

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

LAUNCHER = "/usr/bin/mpiexec.openmpi"
LIBS = sorted(glob.glob("/usr/lib/*/libmpi.so.40"))

needs_openmpi = pytest.mark.skipif(
    not (os.path.exists(LAUNCHER) and LIBS),
    reason="no system Open MPI (apt-get install openmpi-bin)",
)


@pytest.fixture
def openmpi(monkeypatch):
    monkeypatch.setenv("TASKGRAPH_MPIEXEC", LAUNCHER)
    return {"MPI4PY_LIBMPI": LIBS[0], "OMPI_MCA_rmaps_base_oversubscribe": "1"}


@needs_openmpi
def test_the_library_is_really_open_mpi(mpirun, openmpi, tmp_path):
    probe = tmp_path / "which.py"
    probe.write_text("from mpi4py import MPI\nprint(MPI.Get_library_version().split(',')[0])\n")
    proc = mpirun(2, [str(probe)], env=openmpi, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Open MPI") == 2, proc.stdout


@needs_openmpi
@pytest.mark.parametrize(
    "name",
    [
        "cholesky_is_correct",
        "kernel_raises_then_next_run_works",
        "write_after_read_across_ranks",
        "futures_reduction_tree",
        "spawned_calls_are_stolen_and_their_errors_caught",
        "pairs_of_runs_in_flight_one_after_another",
    ],
)
def test_scenarios_under_open_mpi(name, mpirun, openmpi):
    proc = mpirun(3, [str(scenarios.__file__), name], env=openmpi, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert passed_ranks(proc.stdout, name) == {0, 1, 2}, proc.stdout + proc.stderr


@needs_openmpi
def test_an_exception_outside_a_run_ends_the_job_under_open_mpi(mpirun, openmpi, tmp_path):
    from test_batch import RAISES_ON_RANK_0

    script = tmp_path / "raises.py"
    script.write_text(RAISES_ON_RANK_0)
    proc = mpirun(2, [str(script)], env=openmpi, timeout=45)
    assert proc.returncode != 0
    assert "rank 0/2 raised ValueError" in proc.stderr
    assert "UNREACHABLE" not in proc.stdout
