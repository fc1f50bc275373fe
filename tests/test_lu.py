"""Tiled LU without pivoting (taskgraph.linalg.lu_nopiv) against a sequential NumPy LU.

A diagonally dominant matrix needs no pivoting; its tiled LU must match the unblocked
one (``taskgraph.teach.lu_nopiv_numpy``, extended here to rectangular matrices) in this
process and on 2, 3 and 4 ranks, square, tall and wide, with ragged edge tiles.

Run as a script (``python tests/test_lu.py M N TILE``) on every rank of a job, rank 0
prints ``LU OK`` and the error.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from taskgraph.kernels import teaching as T

import taskgraph as tg
from taskgraph.linalg import lu_nopiv

TOL = 1e-13


def lu_numpy(a: np.ndarray) -> np.ndarray:
    """Unblocked LU without pivoting of an m x n matrix: L (unit) and U in one array."""
    f = np.array(a, dtype=np.float64)
    for k in range(min(f.shape)):
        f[k + 1 :, k] /= f[k, k]
        f[k + 1 :, k + 1 :] -= np.outer(f[k + 1 :, k], f[k, k + 1 :])
    return f


def dominant(m: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.random((m, n))
    a[range(min(m, n)), range(min(m, n))] += max(m, n)
    return np.asfortranarray(a)


def factorise(m: int, n: int, tile: int) -> float | None:
    """Tiled LU of a diagonally dominant m x n matrix on this job's ranks; the relative
    error against :func:`lu_numpy` on rank 0 (None elsewhere). Every rank calls it."""
    cluster = tg.Cluster()
    a = dominant(m, n)
    A = tg.TiledMatrix.from_numpy(a, tile, name="A", cluster=cluster)
    cluster.run(lu_nopiv(A)).wait(timeout=60)
    f = A.gather()
    if cluster.rank != 0:
        return None
    expected = lu_numpy(a)
    return float(np.linalg.norm(f - expected) / np.linalg.norm(expected))


SHAPES = [(64, 64, 16), (70, 45, 16), (45, 70, 16), (50, 50, 16)]


def test_the_numpy_reference_is_an_lu():
    for m, n in [(7, 4), (4, 7), (5, 5)]:
        a = dominant(m, n)
        f = lu_numpy(a)
        k = min(m, n)
        lower = np.tril(f[:, :k], -1) + np.eye(m, k)
        assert np.allclose(lower @ np.triu(f[:k]), a)


@pytest.mark.parametrize("m,n,tile", SHAPES)
def test_lu_nopiv_in_process(m, n, tile):
    assert factorise(m, n, tile) < TOL


def test_rectangular_diagonal_tiles_in_the_kernels():
    a = dominant(6, 3)
    f = a.copy(order="F")
    T.getrf_nopiv(f)
    assert np.allclose(f, lu_numpy(a))
    b = np.asfortranarray(np.random.default_rng(0).random((4, 3)))
    x = b.copy(order="F")
    T.trsm_upper_right(f, x)  # uses the leading 3 x 3 of the 6 x 3 tile
    assert np.allclose(x @ np.triu(f[:3]), b)
    wide = dominant(3, 6)
    g = wide.copy(order="F")
    T.getrf_nopiv(g)
    y = b.T.copy(order="F")
    T.trsm_lower_unit(g, y)  # uses the leading 3 x 3 of the 3 x 6 tile
    assert np.allclose((np.tril(g[:, :3], -1) + np.eye(3)) @ y, b.T)


def test_the_teaching_reference_is_lu_nopiv():
    A = tg.TiledMatrix.from_numpy(dominant(48, 48), 16)
    ref = tg.teach.reference_lu(A)
    mine = lu_nopiv(A)
    assert [t.name for t in ref.tasks] == [t.name for t in mine.tasks]


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_lu_nopiv_on_ranks(mpirun, ranks):
    for m, n, tile in SHAPES[1:3]:
        proc = mpirun(ranks, [__file__, str(m), str(n), str(tile)], timeout=90)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("LU OK") == 1, proc.stdout + proc.stderr


def main(argv: list[str]) -> int:
    m, n, tile = map(int, argv)
    error = factorise(m, n, tile)
    if error is None:
        return 0
    print("LU OK" if error < TOL else "LU WRONG", error, flush=True)
    return 0 if error < TOL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
