"""Running a job's launcher with a hard bound: leftovers that hold the output pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from conftest import _clean_env, assert_none_left, processes_with

from taskgraph.launch import collect

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
