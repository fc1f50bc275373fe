"""Plain arrays keep their layout across ranks: a C-ordered 2-D or 3-D array (NumPy's
default), a Fortran-ordered one and a datetime array, each pinned on one rank and read
or overwritten on another, give the sequential result on every rank (a C-ordered array
once arrived scrambled, received into a Fortran-ordered buffer)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import taskgraph as tg


@tg.task
def copy_plus(src, dst, k):
    dst[...] = src + k


@tg.task
def stamp(src, dst):
    dst[...] = src + np.timedelta64(1, "s")


def arrays() -> list[tuple[np.ndarray, np.ndarray]]:
    """(source, destination) pairs of several layouts and dtypes."""
    c2 = np.arange(12, dtype=np.float32).reshape(3, 4)
    c3 = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    f2 = np.asfortranarray(np.arange(15, dtype=np.int16).reshape(3, 5))
    return [(c2, np.zeros_like(c2)), (c3, np.zeros_like(c3)), (f2, np.zeros_like(f2))]


def main() -> None:
    c = tg.current_cluster()
    pairs = arrays()
    t0 = np.arange(6).astype("datetime64[s]").reshape(2, 3)
    t1 = np.zeros_like(t0)
    with tg.Graph("layouts") as g:
        for k, (src, dst) in enumerate(pairs):
            s = tg.Data(src, rank=0)  # read on rank 1, where the copy runs
            d = tg.Data(dst, rank=c.size - 1)
            copy_plus(s.r, d.w, k)
        stamp(tg.Data(t0, rank=0).r, tg.Data(t1, rank=c.size - 1).w)
    c.run(g).wait()
    for k, (src, dst) in enumerate(pairs):
        assert np.array_equal(dst, src + k), (k, dst)
    assert np.array_equal(t1, t0 + np.timedelta64(1, "s")), t1
    print(f"PASS {c.rank}/{c.size}", flush=True)


def test_in_one_process():
    pairs = arrays()
    with tg.Graph("layouts") as g:
        for k, (src, dst) in enumerate(pairs):
            copy_plus(tg.r(src), tg.w(dst), k)
    tg.Cluster().run(g).wait()
    for k, (src, dst) in enumerate(pairs):
        assert np.array_equal(dst, src + k)


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_layouts_survive_a_move_between_ranks(run_cli):
    proc = run_cli("run", "-n", "2", "--timeout", "120", __file__, timeout=140)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASS 0/2" in proc.stdout and "PASS 1/2" in proc.stdout, out


if __name__ == "__main__" and len(sys.argv) == 1:
    main()
