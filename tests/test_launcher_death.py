"""``taskgraph run`` stopped from outside takes its job down with it (issue 23's
resume test kills the launcher): the job runs in a session of its own, so a signal
to the launcher alone reached none of its ranks, and they ran on to the end."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
from conftest import _clean_env, assert_none_left, mpi_segments, processes_with

from taskgraph.cluster.launch import sweep_segment_lists
from taskgraph.core.files import SEGMENT_LISTS

SCRIPT = """
import time
import taskgraph as tg

@tg.task
def sleeps(seconds):
    return tg.spawn(time.sleep, seconds).result()  # (a run that steals: boards)

c = tg.Cluster()
with tg.Graph("slow") as g:
    sleeps(60)
run = c.run(g)
print("rank", c.rank, "up", flush=True)
run.wait()
print("rank", c.rank, "ran to the end", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_launcher_ends_its_ranks(tmp_path, sig):
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(SCRIPT))
    marker = uuid.uuid4().hex
    env = _clean_env(TASKGRAPH_TEST_JOB=marker)
    cmd = [sys.executable, "-m", "taskgraph.batch.cli", "run", "-n", "2", str(script)]
    before = mpi_segments()
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        ups = [launcher.stdout.readline() for _ in range(2)]  # both ranks are running
        assert all("up" in line for line in ups), ups
        ranks = [p for p in processes_with(marker) if p != launcher.pid]
        assert ranks, "no process of the job found"
        launcher.send_signal(sig)
        launcher.wait(timeout=20)
        deadline = time.monotonic() + 15
        while [p for p in processes_with(marker)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_with(marker), "the job outlived its launcher"

        # a launcher killed outright left its job's MPI segment, the list of it and the
        # ranks' boards: its guard removes them once the job has ended (a SIGTERMed
        # launcher removes them itself); the next launcher's sweep is a backstop
        def left() -> tuple:
            lists = glob.glob(
                os.path.join(tempfile.gettempdir(), f"{SEGMENT_LISTS}{launcher.pid}-*")
            )
            boards = [b for r in ranks for b in glob.glob(f"/dev/shm/taskgraph-board-{r}-*")]
            return lists, mpi_segments() - before, boards

        deadline = time.monotonic() + 15
        while any(left()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(left()), left()
        sweep_segment_lists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.communicate(timeout=10)
        assert_none_left(marker)
