"""Every tutorial notebook runs in batch, the way the README says to run it there:
``taskgraph run -n 2 NOTEBOOK.ipynb`` (converted, then 2 local MPI ranks), and the job
script of ``taskgraph sbatch NOTEBOOK.ipynb`` under a stub ``srun`` that hands over to
mpiexec. Notebooks are found by glob: a new one is covered without a change here.

Each run is in a temporary directory (notebooks write files), with
``TASKGRAPH_QUICK=1`` (small sizes), and must print what the notebook prints in
Jupyter (``EXPECTED`` of ``test_notebooks``), and nothing that says it went wrong.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, _clean_env, assert_none_left
from test_notebooks import EXPECTED, PATHS
from test_sbatch import slurm_env, start_job

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

JOB_TIMEOUT = 240  # seconds for one notebook's batch run
BAD = ("(BAD)", "(MISMATCH)", "Traceback")


def bounded(cmd: list[str], cwd: Path, env: dict, marker: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a process group of its own; kill it all past JOB_TIMEOUT."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        assert_none_left(marker)
        pytest.fail(f"{' '.join(cmd)} ran past {JOB_TIMEOUT} s")
    assert_none_left(marker)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def check_output(notebook: Path, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]
    for bad in BAD:
        assert bad not in proc.stdout + proc.stderr, (bad, proc.stdout[-3000:], proc.stderr[-3000:])
    for pattern in EXPECTED.get(notebook.stem, []):
        assert re.search(pattern, proc.stdout), (pattern, proc.stdout[-4000:])


@pytest.mark.parametrize("notebook", PATHS, ids=lambda p: p.stem)
def test_notebook_runs_with_taskgraph_run(notebook, tmp_path):
    marker = uuid.uuid4().hex
    env = _clean_env(TASKGRAPH_TEST_JOB=marker, TASKGRAPH_QUICK="1", TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "taskgraph.batch.cli", "run", "-n", "2", str(notebook)]
    check_output(notebook, bounded(cmd, tmp_path, env, marker))


@pytest.mark.parametrize("notebook", PATHS, ids=lambda p: p.stem)
def test_notebook_runs_as_a_job_from_taskgraph_sbatch(notebook, tmp_path):
    job = tmp_path / "job.sh"
    marker = uuid.uuid4().hex
    env = slurm_env(tmp_path, marker, TASKGRAPH_QUICK="1")
    cmd = [sys.executable, "-m", "taskgraph.batch.cli", "sbatch", str(notebook)]
    cmd += ["--ntasks-per-node", "2", "--cpus-per-task", "1", "--time", "5:00", "-o", str(job)]
    made = bounded(cmd, ROOT, env, marker)
    assert made.returncode == 0, made.stderr
    bash = start_job(job, env)
    try:
        out, err = bash.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(bash.pid, signal.SIGKILL)
        bash.communicate()
        assert_none_left(marker)
        pytest.fail(f"bash job.sh for {notebook.name} ran past {JOB_TIMEOUT} s")
    assert_none_left(marker)
    check_output(notebook, subprocess.CompletedProcess(bash.args, bash.returncode, out, err))
    assert "taskgraph: job 4242: 2 ranks x 1 threads" in out
