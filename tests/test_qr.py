"""Tiled QR (taskgraph.linalg.qr) and its four tile kernels, against NumPy.

The kernels are checked one by one against ``numpy.linalg.qr``; the tiled QR in this
process and on 2, 3 and 4 ranks (4 oversubscribed), square, tall and wide, with ragged
edge tiles. A factorisation is right when |R| matches NumPy's (rows differ by signs),
Qᵀ A, applied from the stored reflectors by ``qr_apply_qt``, is [R; 0], Q (applied to
the identity) is orthogonal and ‖A − QR‖ / ‖A‖ is at the rounding level.

Run as a script (``python tests/test_qr.py M N TILE IB DISTRIBUTION``) on every rank of a job, it
factorises one matrix and rank 0 prints ``QR OK`` and the errors.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from taskgraph.kernels import qr as K

import taskgraph as tg
from taskgraph.linalg import qr, qr_apply_qt, qr_workspace

TOL = {"float32": 5e-5, "float64": 1e-13, "complex64": 5e-5, "complex128": 1e-13}


def rand(rng, shape, dtype):
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return np.asfortranarray(a.astype(dtype))


def rel(x, y) -> float:
    return float(np.linalg.norm(x - y) / max(1.0, np.linalg.norm(y)))


# -- the kernels ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m,n,ib", [(12, 8, 3), (8, 8, 8), (5, 9, 2)])
def test_geqrt_and_gemqrt_give_r_and_qt_a(dtype, m, n, ib):
    rng = np.random.default_rng(0)
    a0 = rand(rng, (m, n), dtype)
    a, t = a0.copy(order="F"), np.zeros((ib, n), dtype, order="F")
    K.geqrt(a, t, ib)
    k = min(m, n)
    r = np.triu(a[:k])
    assert rel(np.abs(r), np.abs(np.linalg.qr(a0)[1])) < TOL[dtype]
    c = a0.copy(order="F")
    K.gemqrt(a, t, c, ib)  # Qᵀ A = [R; 0]
    assert rel(c[:k], r) < TOL[dtype] and np.abs(c[k:]).max(initial=0) < TOL[dtype] * 10


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m,ib", [(5, 3), (8, 8), (1, 1)])
def test_tpqrt_and_tpmqrt_on_a_triangle_over_a_square(dtype, m, ib):
    rng = np.random.default_rng(1)
    n = 8
    top = np.asfortranarray(np.triu(rand(rng, (n, n), dtype)))
    b0 = rand(rng, (m, n), dtype)
    a, b, t = top.copy(order="F"), b0.copy(order="F"), np.zeros((n, n), dtype, order="F")
    K.tpqrt(a, b, t, ib)
    assert rel(np.abs(np.triu(a)), np.abs(np.linalg.qr(np.vstack([top, b0]))[1])) < TOL[dtype]
    c1, c2 = top.copy(order="F"), b0.copy(order="F")
    K.tpmqrt(b, t, c1, c2, ib)  # Qᵀ [R; B] = [R'; 0]
    assert rel(c1, np.triu(a)) < TOL[dtype] and np.abs(c2).max() < TOL[dtype] * 10


def test_py_funcs_match_the_compiled_kernels():
    rng = np.random.default_rng(2)
    a0 = rand(rng, (6, 4), "float64")
    a1, a2 = a0.copy(order="F"), a0.copy(order="F")
    t1, t2 = np.zeros((2, 4), order="F"), np.zeros((2, 4), order="F")
    K.compile_op("geqrt")(a1, t1, 2)
    K.JITTED["geqrt", "float64"].py_func(a2, t2, 2)
    assert np.allclose(a1, a2) and np.allclose(t1, t2)


def test_kernels_say_what_is_wrong():
    a, t = np.zeros((4, 4), order="F"), np.zeros((2, 4), order="F")
    with pytest.raises(ValueError, match="at least 3 x 4"):
        K.geqrt(a, t, 3)
    with pytest.raises(ValueError, match="ib must be at least 1"):
        K.geqrt(a, t, 0)
    with pytest.raises(ValueError, match="one dtype"):
        K.geqrt(a, t.astype(np.float32), 2)
    with pytest.raises(ValueError, match="k >= n"):
        K.tpqrt(np.zeros((2, 4), order="F"), a, np.zeros((4, 4), order="F"), 2)
    with pytest.raises(ValueError, match="column-major"):
        K.geqrt(np.zeros((4, 4)), t, 2)  # C-ordered 4 x 4 tiles are not column-major


def test_kernels_take_ib_as_a_scalar():
    from taskgraph.kernels import QR_KERNELS, geqrt, tpmqrt

    assert [k.name for k in QR_KERNELS] == ["geqrt", "gemqrt", "tpqrt", "tpmqrt"]
    assert repr(tpmqrt) == "<kernel tpmqrt(r,r,rw,rw,int)>" and tpmqrt.nogil
    assert geqrt.cost([(8, 8), (4, 8), ()]) == pytest.approx(4 / 3 * 8**3)
    A = tg.TiledMatrix.zeros(32, 16)
    T = qr_workspace(A, 4)
    with pytest.raises(tg.GraphError, match="geqrt"):
        with tg.Graph():
            geqrt(A[0, 0].rw, T[0, 0].w, 2.5)  # ib must be an int


# -- the tiled QR -------------------------------------------------------------------------


def factorise(
    m: int, n: int, tile: int, ib: int, dtype="float64", distribution="2d"
) -> dict | None:
    """Tiled QR of a seeded random m x n matrix on this job's ranks; the errors on rank
    0 (None elsewhere). Every rank calls it."""
    cluster = tg.Cluster()
    a = rand(np.random.default_rng(m * 1000 + n), (m, n), dtype)
    kw = dict(distribution=distribution, cluster=cluster)
    A = tg.TiledMatrix.from_numpy(a, tile, name="A", **kw)
    T = qr_workspace(A, ib)
    cluster.run(qr(A, T, ib)).wait(timeout=60)
    B = tg.TiledMatrix.from_numpy(a, tile, name="B", **kw)  # Qᵀ A should be [R; 0]
    E = tg.TiledMatrix.from_numpy(np.eye(m, dtype=dtype), tile, name="E", **kw)  # Qᵀ
    cluster.run(qr_apply_qt(A, T, B, ib)).wait(timeout=60)
    cluster.run(qr_apply_qt(A, T, E, ib)).wait(timeout=60)
    f, qta, qt = A.gather(), B.gather(), E.gather()
    if cluster.rank != 0:
        return None
    k = min(m, n)
    r = np.triu(f[:k])
    q = qt.conj().T
    r_zero = np.vstack([r, np.zeros((m - k, n), dtype)])
    return {
        "r_vs_numpy": rel(np.abs(r), np.abs(np.linalg.qr(a)[1])),
        "qt_a": float(np.linalg.norm(qta - r_zero) / np.linalg.norm(a)),
        "a_minus_qr": float(np.linalg.norm(a - q[:, :k] @ r) / np.linalg.norm(a)),
        "orthogonality": float(np.abs(q.conj().T @ q - np.eye(m)).max()),
    }


def bad(errors: dict, dtype="float64") -> dict:
    return {k: v for k, v in errors.items() if not v < TOL[dtype]}


SHAPES = [(64, 64, 16, 4), (70, 45, 16, 5), (45, 70, 16, 16), (40, 24, 24, 7)]


@pytest.mark.parametrize("m,n,tile,ib", SHAPES)
def test_tiled_qr_in_process(m, n, tile, ib):
    errors = factorise(m, n, tile, ib)
    assert errors is not None and not bad(errors), errors


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_tiled_qr_other_dtypes(dtype):
    errors = factorise(50, 40, 16, 4, dtype)
    assert errors is not None and not bad(errors, dtype), errors


@pytest.mark.parametrize("distribution", ["2d", "1d", "random", lambda i, j: 0])
def test_the_workspace_has_an_ib_by_nb_tile_per_tile_of_a(distribution):
    A = tg.TiledMatrix.zeros((70, 45), 16, distribution=distribution)
    T = qr_workspace(A, 8)
    assert (T.mt, T.nt) == (A.mt, A.nt)
    assert all(T.tile_shape(i, j) == (8, A.tile_shape(i, j)[1]) for i, j in T.indices())
    assert all(T.owner(i, j) == A.owner(i, j) for i, j in T.indices())
    with pytest.raises(ValueError, match="ib=17"):
        qr_workspace(A, 17)


def test_qr_refuses_what_it_cannot_factorise():
    A = tg.TiledMatrix.zeros((64, 64), (32, 16))
    with pytest.raises(ValueError, match="must be square"):
        qr(A, tg.TiledMatrix.zeros((64, 64), (4, 16)), 4)
    B = tg.TiledMatrix.zeros((64, 64), 16)
    with pytest.raises(ValueError, match="qr_workspace"):
        qr(B, qr_workspace(B, 4), 8)
    with pytest.raises(ValueError, match="rows and tile rows"):
        qr_apply_qt(B, qr_workspace(B, 4), tg.TiledMatrix.zeros((64, 8), 8), 4)


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_tiled_qr_on_ranks(mpirun, ranks):
    """2-D block-cyclic (2 x 2 on 4 ranks: tpqrt and tpmqrt write tiles of two owners),
    and by tile column."""
    for (m, n, tile, ib), dist in zip(SHAPES[1:3], ["2d", "1d"]):
        argv = [__file__, str(m), str(n), str(tile), str(ib), dist]
        proc = mpirun(ranks, argv, timeout=90)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("QR OK") == 1, proc.stdout + proc.stderr


def main(argv: list[str]) -> int:
    m, n, tile, ib = map(int, argv[:4])
    errors = factorise(m, n, tile, ib, distribution=argv[4])
    if errors is None:
        return 0
    print("QR OK" if not bad(errors) else "QR WRONG", errors, flush=True)
    return 0 if not bad(errors) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_qr_from_a_notebook_on_two_engines():
    """qr_workspace's T exists on the engines too (it once existed only in the notebook:
    'no matrix -2 in this process')."""
    from conftest import engines_marker

    with engines_marker():
        a = np.random.default_rng(3).standard_normal((70, 45))
        with tg.Cluster(n=2) as c:
            A = tg.TiledMatrix.from_numpy(c, a, tile=16)
            T = qr_workspace(A, ib=8)
            c.run(qr(A, T, ib=8)).wait()
            r = np.triu(A.gather())[:45]
        want = np.linalg.qr(a, mode="r")
        assert np.allclose(np.abs(r), np.abs(want), atol=1e-10)
