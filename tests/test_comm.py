"""``taskgraph.run.comm`` and ``.singlecopy``: back-off, and large messages in one copy."""

from __future__ import annotations

import sys
import textwrap

import pytest

from taskgraph.run.comm import FIRST_SLEEP, LONG_SLEEP, next_sleep
from taskgraph.run.singlecopy import CMA_VARS, can_read_memory, wants_single_copy, yama_scope

CAP = 250e-6


def sleeps(waited_per_step: float, steps: int, cap: float = CAP) -> list[float]:
    """The sleeps of a poller that finds nothing ``steps`` times, waiting as it sleeps
    plus ``waited_per_step`` of work each time."""
    out, sleep, waited = [], 0.0, 0.0
    for _ in range(steps):
        sleep = next_sleep(sleep, waited, cap)
        waited += sleep + waited_per_step
        out.append(sleep)
    return out


def test_a_short_wait_doubles_from_the_first_sleep_up_to_the_cap():
    s = sleeps(0.0, 6)
    assert s[0] == FIRST_SLEEP
    assert s[1] == 2 * FIRST_SLEEP and s[2] == 4 * FIRST_SLEEP
    assert max(s) == CAP  # 20, 40, 80, 160, 250, 250 µs


def test_a_long_wait_sleeps_longer_but_never_more_than_a_twentieth_of_it():
    s = sleeps(0.0, 400)
    waited = 0.0
    for sleep in s:
        assert sleep <= max(CAP, 0.05 * waited) + 1e-12
        waited += sleep
    assert s[-1] == LONG_SLEEP
    # two seconds of waiting cost a few hundred wake-ups, not the 8,000 of a 250 µs cap
    n, waited = 0, 0.0
    while waited < 2.0:
        waited += s[min(n, len(s) - 1)]
        n += 1
    assert n < 600


@pytest.mark.parametrize("cap", [1e-5, CAP, 1e-3, 2e-2])
def test_the_cap_holds_while_the_wait_is_short(cap):
    assert next_sleep(1.0, 0.0, cap) == cap
    assert next_sleep(0.0, 0.0, cap) == min(cap, FIRST_SLEEP)


# -- single-copy transfers (CMA) -----------------------------------------------------


def never_called():
    raise AssertionError("the probe ran where the decision was already made")


@pytest.mark.parametrize(
    "setting, user_set, scope, probe, expected",
    [
        (None, False, None, lambda: True, True),  # no Yama, the syscall works
        (None, False, "0", lambda: True, True),  # Yama allows same-user processes
        (None, False, "1", never_called, False),  # descendants only: ranks are siblings
        (None, False, "2", never_called, False),
        (None, False, None, lambda: False, False),  # a seccomp filter forbids the call
        (None, True, None, never_called, False),  # the user's MPI setting stands
        (True, True, "1", never_called, False),  # ... even over TASKGRAPH_CMA=1
        (False, False, None, never_called, False),  # TASKGRAPH_CMA=0
        (True, False, "3", never_called, True),  # TASKGRAPH_CMA=1: the user knows
    ],
)
def test_when_large_messages_move_in_one_copy(setting, user_set, scope, probe, expected):
    assert wants_single_copy(setting, user_set, scope, probe) is expected


READ_PARENT = """
import ctypes, os, sys
class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
readv.restype = ctypes.c_ssize_t
dst = ctypes.create_string_buffer(16)
local, remote = IOVec(ctypes.addressof(dst), 16), IOVec(int(sys.argv[1]), 16)
n = readv(os.getppid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print("read" if n == 16 and dst.raw == b"taskgraph-probe!" else "refused")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CMA is Linux's")
def test_the_memory_probe_agrees_with_another_process_reading_ours():
    """The probe reads this process's own memory; what MPICH does is read another
    rank's. Where Yama does not decide, the two must agree (a seccomp filter that
    forbids the call forbids both)."""
    import ctypes
    import subprocess

    if yama_scope() not in (None, "0"):
        pytest.skip("Yama restricts ptrace here: the decision does not rest on the probe")
    mine = ctypes.create_string_buffer(b"taskgraph-probe!", 16)
    child = subprocess.run(
        [sys.executable, "-c", READ_PARENT, str(ctypes.addressof(mine))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert child.returncode == 0, child.stderr
    assert can_read_memory() is (child.stdout.strip() == "read"), child.stdout


RANK_SCRIPT = textwrap.dedent(
    """
    import os
    import numpy as np
    import taskgraph as tg

    cluster = tg.current_cluster()
    setting = os.environ.get("MPIR_CVAR_CH4_CMA_ENABLE")
    os.write(1, f"CMA {cluster.rank} {setting}\\n".encode())  # one write: ranks share a pipe
    n = 1 << 18  # 2 MiB tiles, well above MPICH's single-copy threshold (8 KiB)
    X = tg.TiledMatrix.from_function((2 * n, 1), n, lambda i, j, s: i + 1.0, grid=(2, 1))

    @tg.kernel(modes="r,rw", dims="mn,mn")
    def add(src, dst):
        dst += src

    with tg.Graph("swap") as g:
        for k in range(6):
            add(X[k % 2, 0].r, X[1 - k % 2, 0].rw)
    cluster.run(g).wait()
    full = X.gather()
    if cluster.rank == 0:
        top, bottom = full[:n, 0], full[n:, 0]
        # 1, 2 -> (1, 3) -> (4, 3) -> (4, 7) -> (11, 7) -> (11, 18) -> (29, 18)
        assert (top == 29).all() and (bottom == 18).all(), (top[:3], bottom[:3])
        print("OK", flush=True)
    """
)


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "1"),  # auto, on this machine: allowed
        ({"TASKGRAPH_CMA": "0"}, "None"),
        ({"MPIR_CVAR_CH4_CMA_ENABLE": "0"}, "0"),  # the user's own setting stands
    ],
)
def test_ranks_start_mpi_with_single_copy_where_allowed(
    mpirun, tmp_path, monkeypatch, env, expected
):
    if yama_scope() not in (None, "0") or not can_read_memory():
        pytest.skip("this machine forbids reading another process's memory")
    script = tmp_path / "cma.py"
    script.write_text(RANK_SCRIPT)
    for name in CMA_VARS:  # none from the test's own environment
        monkeypatch.delenv(name, raising=False)
    proc = mpirun(2, [str(script)], timeout=90, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("CMA"))
    assert lines == [f"CMA 0 {expected}", f"CMA 1 {expected}"], proc.stdout
    assert "OK" in proc.stdout


@pytest.mark.parametrize("env, expected", [({}, True), ({"TASKGRAPH_CMA": "0"}, False)])
def test_job_scripts_get_the_setting_as_shell_exports(run_cli, monkeypatch, env, expected):
    """``taskgraph mpi-env`` (what the engines job script evals before its engines start
    MPI) prints the export where single copy is allowed, and nothing where it is not."""
    if yama_scope() not in (None, "0") or not can_read_memory():
        pytest.skip("this machine forbids reading another process's memory")
    for name in CMA_VARS:
        monkeypatch.delenv(name, raising=False)
    proc = run_cli("mpi-env", timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("export MPIR_CVAR_CH4_CMA_ENABLE=1\n" if expected else "")
