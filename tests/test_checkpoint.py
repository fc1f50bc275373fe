"""Checkpoint and resume: keys of calls (stable across processes, canonical for dicts
and sets), durable values, and a real batch job on 2 ranks killed mid-run (SIGKILL to
the whole job) and run again with the same checkpoint directory: only the rest runs,
and the results are those of a run without a checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from conftest import _clean_env, assert_none_left

from taskgraph.cluster.launch import job_environment, kill_group, python_command
from taskgraph.run.checkpoint import Checkpoint, call_key


def f(x, y=None):
    return x


def g(x):
    return x


def test_keys_are_canonical_and_tell_calls_apart():
    k = call_key(f, (1, {"b": 2, "a": {3, 1, 2}}), {"y": [1.5, "s"]})
    assert k == call_key(f, [1, {"a": {2, 3, 1}, "b": 2}], {"y": [1.5, "s"]})
    assert k != call_key(g, (1, {"b": 2, "a": {3, 1, 2}}), {"y": [1.5, "s"]})
    assert call_key(f, (1,), {}) != call_key(f, (1.0,), {})
    assert call_key(f, (np.arange(3),), {}) == call_key(f, (np.arange(3),), {})
    assert call_key(f, (np.arange(3),), {}) != call_key(f, (np.arange(3.0),), {})
    assert call_key(f, (lambda: 0,), {}) is None  # (cannot be pickled: not checkpointed)


def test_the_same_key_in_another_process():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from test_checkpoint import f; "
        "from taskgraph.run.checkpoint import call_key; "
        "print(call_key(f, ({'x': {'p', 'q', 'r'}, 'y': 2},), {}))"
    )
    here = os.path.dirname(__file__)
    outs = {
        subprocess.run(
            [sys.executable, "-c", code, here],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in (1, 2)
    }  # fmt: skip
    assert len(outs) == 1 and len(outs.pop()) == 64


def test_values_are_stored_whole_and_loaded_back(tmp_path):
    ck = Checkpoint(tmp_path / "ck")
    key = call_key(f, (1,), {})
    assert ck.load(key) == (False, None)
    assert ck.store(key, {"v": np.ones(2)})
    found, value = ck.load(key)
    assert found and np.array_equal(value["v"], np.ones(2))
    assert not [p for p in (tmp_path / "ck").rglob("*") if p.name.endswith(".tmp")]


ENSEMBLE = """
import os, sys, time
import taskgraph as tg

LOG = sys.argv[1]

@tg.task
def member(i):
    with open(LOG, "a") as fh:  # (one short write: lines of ranks never mix)
        fh.write(f"{i}\\n")
    time.sleep(0.15)
    return i * i + 1

@tg.task
def total(values):
    return sum(values)

with tg.Graph("ensemble") as g:
    members = [member(i) for i in range(40)]
    done = total(members)

c = tg.Cluster()
ck = sys.argv[2] if len(sys.argv) > 2 else None
run = c.run(g, workers=1, checkpoint=ck)
values = [run.result(m) for m in members]
if c.rank == 0:
    print("values", values, run.result(done), flush=True)
    print("summary", run.summary().headline(), flush=True)
"""


def _lines(path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_a_killed_ensemble_resumes_from_its_checkpoint(mpirun, tmp_path):
    script = tmp_path / "ensemble.py"
    script.write_text(textwrap.dedent(ENSEMBLE))
    ck, log = tmp_path / "ck", tmp_path / "log"
    marker = uuid.uuid4().hex
    env = job_environment(_clean_env(TASKGRAPH_TEST_JOB=marker))
    cmd = python_command(2, ["-m", "mpi4py", str(script), str(log), str(ck)])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + 60
        while len(_lines(log)) < 20 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, "the job ended before it was killed"
        os.killpg(proc.pid, signal.SIGKILL)  # (the whole job: mpiexec and its ranks)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
        proc.communicate(timeout=30)
    assert_none_left(marker)
    first = _lines(log)
    assert 20 <= len(first) < 40
    stored = len(list(ck.rglob("*.pkl")))
    assert stored >= len(first) - 2 * 2  # (at most the ones running on each rank are lost)

    again = mpirun(2, [str(script), str(log), str(ck)], timeout=90)
    assert again.returncode == 0, again.stderr[-3000:]
    counts: dict[str, int] = {}
    for line in _lines(log):
        counts[line] = counts.get(line, 0) + 1
    assert sorted(counts, key=int) == [str(i) for i in range(40)]
    assert max(counts.values()) <= 2  # (twice at most: those cut off mid-run)
    assert sum(c == 2 for c in counts.values()) <= 2
    assert f"succeeded ({stored} from the checkpoint)" in again.stdout  # (the total runs again)

    plain = mpirun(2, [str(script), str(tmp_path / "log2")], timeout=90)
    assert plain.returncode == 0, plain.stderr[-3000:]
    values = [line for line in again.stdout.splitlines() if line.startswith("values")]
    assert values == [line for line in plain.stdout.splitlines() if line.startswith("values")]
    assert len(values) == 1
