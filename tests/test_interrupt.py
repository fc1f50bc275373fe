"""Ctrl-C while waiting for a run: the run stops, nothing hangs, nothing is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from conftest import _clean_env, assert_none_left

from taskgraph.cluster.launch import kill_group, python_command

pytestmark = [pytest.mark.timeout(120)]

LONG_RUN = textwrap.dedent("""
    import time
    import taskgraph as tg

    @tg.kernel(modes="rw", dims="mn")
    def nap(t):
        time.sleep(0.05)

    size = tg.current_cluster().size
    B = tg.TiledMatrix.zeros((2 * size, 2), 2, grid=(size, 1))
    with tg.Graph("naps") as g:
        for _ in range(2000):  # 100 s of naps on every rank
            for i in range(size):
                nap(B[i, 0].rw)
    print("STARTED", flush=True)
    try:
        tg.current_cluster().run(g).wait()
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        raise
""")


def start(cmd: list[str], marker: str) -> subprocess.Popen:
    key, value = marker.split("=")
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_clean_env(**{key: value}),
    )


def wait_for_start(proc: subprocess.Popen, count: int) -> None:
    seen = 0
    deadline = time.monotonic() + 60
    while seen < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line.count("STARTED")
    assert seen == count, "the job never started"
    time.sleep(1.0)  # let the runs get going


def interrupt_and_wait(proc: subprocess.Popen, marker: str) -> tuple[float, str]:
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        assert_none_left(marker.split("=")[1])
        pytest.fail("the job did not stop within 15 s of Ctrl-C")
    assert_none_left(marker.split("=")[1])
    return time.monotonic() - t0, out + err


def test_ctrl_c_stops_a_one_rank_run(tmp_path):
    script = tmp_path / "long.py"
    script.write_text(LONG_RUN)
    marker = f"TASKGRAPH_TEST_JOB={uuid.uuid4().hex}"
    proc = start([sys.executable, str(script)], marker)
    wait_for_start(proc, 1)
    took, output = interrupt_and_wait(proc, marker)
    assert took < 5, f"stopping took {took:.1f} s"
    assert "INTERRUPTED" in output and "KeyboardInterrupt" in output
    assert proc.returncode != 0


@pytest.mark.mpi
def test_ctrl_c_stops_every_rank(tmp_path):
    script = tmp_path / "long.py"
    script.write_text(LONG_RUN)
    marker = f"TASKGRAPH_TEST_JOB={uuid.uuid4().hex}"
    proc = start(python_command(2, [str(script)]), marker)
    wait_for_start(proc, 2)
    took, output = interrupt_and_wait(proc, marker)
    assert took < 10, f"stopping took {took:.1f} s"
    assert proc.returncode != 0
