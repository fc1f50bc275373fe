"""Running a job's launcher with a hard bound: leftovers that hold the output pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from conftest import _clean_env, assert_none_left, processes_with

from taskgraph.cluster.launch import collect

pytestmark = pytest.mark.timeout(60)


def start(script: str, marker: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_clean_env(TASKGRAPH_TEST_JOB=marker),
    )


def test_a_child_that_holds_the_output_does_not_hang_the_caller():
    """The launcher exits (code 3) while a child it left holds stdout for 30 s."""
    marker = uuid.uuid4().hex
    proc = start("sleep 30 & echo launched; exit 3", marker)
    t0 = time.monotonic()
    out, err = collect(proc, timeout=20, linger=0.5)
    assert time.monotonic() - t0 < 5
    assert out == "launched\n" and proc.returncode == 3
    assert_none_left(marker)  # the child was killed with the group


def test_a_child_outside_the_group_still_does_not_hang_the_caller():
    marker = uuid.uuid4().hex
    proc = start("setsid sleep 30 & echo launched; exit 0", marker)
    t0 = time.monotonic()
    try:
        out, _ = collect(proc, timeout=20, linger=0.5)
        assert time.monotonic() - t0 < 5
        assert out == "launched\n" and proc.returncode == 0
    finally:
        for pid in processes_with(marker):  # the straggler outside the group: expected
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert_none_left(marker)


def test_a_job_that_runs_past_its_timeout_raises():
    marker = uuid.uuid4().hex
    proc = start("sleep 30", marker)
    with pytest.raises(subprocess.TimeoutExpired):
        collect(proc, timeout=0.5, linger=0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert_none_left(marker)


def test_a_quiet_job_returns_its_output_at_once():
    proc = start("echo out; echo err >&2", uuid.uuid4().hex)
    assert collect(proc, timeout=10) == ("out\n", "err\n")
    assert proc.returncode == 0


LISTENER_JOB = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
buf = bytearray(8)
if comm.rank == 0:
    comm.Send(buf, 1)
else:
    comm.Recv(buf, 0)
comm.Barrier()
open(sys.argv[1] + f".{comm.rank}", "w").close()
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def listeners(pid: int) -> tuple[set[str], set[str]]:
    """TCP addresses listened on by the launcher ``pid`` itself, and by the other
    processes under it (its proxies and the ranks) beyond those they inherited."""
    import psutil
    from conftest import listening

    root = psutil.Process(pid)
    launcher = listening(root)
    below: set[str] = set()
    for p in root.children(recursive=True):
        below |= listening(p)
    return launcher, below - launcher


@pytest.mark.mpi
def test_the_ranks_of_a_local_job_listen_on_no_external_address(tmp_path):
    """The ranks of a one-node job that taskgraph starts (``taskgraph run``, the
    tests; the engines get the same settings) open no TCP port beyond loopback for
    other users of a login node to reach: MPI moves their data through shared memory.
    (Hydra's own control port, which the ranks inherit, is left out: it binds to
    every interface and to nothing else.)"""
    from taskgraph.cluster.launch import job_environment, python_command

    script = tmp_path / "job.py"
    script.write_text(LISTENER_JOB)
    ready, done = tmp_path / "ready", tmp_path / "done"
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        python_command(2, [str(script), str(ready), str(done)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=job_environment(_clean_env(TASKGRAPH_TEST_JOB=marker)),
    )
    try:
        deadline = time.monotonic() + 40
        while not all(ready.with_suffix(f".{r}").exists() for r in (0, 1)):
            assert proc.poll() is None, collect(proc, 10)
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        _, found = listeners(proc.pid)
        done.touch()
        out, err = collect(proc, 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        assert_none_left(marker)
    assert proc.returncode == 0, err
    external = [a for a in found if not a.startswith(("127.", "::1:"))]
    assert not external, f"the job listens on {external} (all: {found})"
