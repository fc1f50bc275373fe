"""Tiled algorithms written in the task-flow DSL, and checks of their results."""

from __future__ import annotations

import numpy as np

from .dsl.graph import Graph
from .dsl.tiled import TiledMatrix

QR_IB = 32  # the default inner block size of the QR kernels


def cholesky(A: TiledMatrix, name: str = "cholesky") -> Graph:
    """The task graph of the right-looking tiled Cholesky factorisation A = L Lᵀ.

    Overwrites the lower triangle of A with L when run. ValueError unless A is square
    (a 300 x 200 matrix had its leading 200 x 200 block factored, and no error).
    """
    from taskgraph.kernels import gemm, potrf, syrk, trsm

    if len(A.shape) != 2 or A.shape[0] != A.shape[1]:
        size = " x ".join(map(str, A.shape))
        raise ValueError(f"cholesky: {A.name} is {size}; a Cholesky factor needs a square matrix")

    with Graph(name) as g:
        for k in range(A.nt):
            potrf(A[k, k].rw)
            for m in range(k + 1, A.nt):
                trsm(A[k, k].r, A[m, k].rw)
            for m in range(k + 1, A.nt):
                syrk(A[m, k].r, A[m, m].rw)
                for n in range(k + 1, m):
                    gemm(A[m, k].r, A[n, k].r, A[m, n].rw)
    return g


def lu_nopiv(A: TiledMatrix, name: str = "lu-nopiv") -> Graph:
    """The task graph of the right-looking tiled LU factorisation without pivoting.

    Overwrites A (m x n, any shape) with L (unit lower, below the diagonal; its unit
    diagonal is not stored) and U (on and above it), as LAPACK's ``getrf`` stores them.
    Only safe for matrices that need no pivoting (diagonally dominant ones, say). Every
    diagonal tile but the last must be square.
    """
    from taskgraph.kernels.teaching import gemm_nn, getrf_nopiv, trsm_lower_unit, trsm_upper_right

    with Graph(name) as g:
        for k in range(min(A.mt, A.nt)):
            getrf_nopiv(A[k, k].rw)
            for j in range(k + 1, A.nt):
                trsm_lower_unit(A[k, k].r, A[k, j].rw)
            for i in range(k + 1, A.mt):
                trsm_upper_right(A[k, k].r, A[i, k].rw)
            for i in range(k + 1, A.mt):
                for j in range(k + 1, A.nt):
                    gemm_nn(A[i, k].r, A[k, j].r, A[i, j].rw)
    return g


def qr_workspace(A: TiledMatrix, ib: int = QR_IB, name: str | None = None) -> TiledMatrix:
    """The matrix of T factors that :func:`qr` of A fills: an ``ib`` x nb tile per tile
    of A (nb its columns), each on the rank that owns A's tile."""
    if not 1 <= ib <= A.tile_rows:
        raise ValueError(
            f"qr: the inner block size ib={ib} must be in 1..{A.tile_rows} (A's tile rows)"
        )
    named = isinstance(A.distribution, str)
    return TiledMatrix.zeros(  # (zeros: made on the engines too, from a notebook)
        (A.mt * ib, A.shape[1]),
        (ib, A.tile_cols),
        A.dtype,
        grid=A.grid,
        distribution=A.distribution if named else A.owner,
        distribution_seed=A.distribution_seed,
        name=name or f"T{A.name}",
        cluster=A.cluster,
    )


def qr(A: TiledMatrix, T: TiledMatrix, ib: int = QR_IB, name: str = "qr") -> Graph:
    """The task graph of the flat-tree tiled QR factorisation A = QR (PLASMA's).

    Overwrites A (m x n, in square tiles, ragged at the edges) with R on and above the
    diagonal and the Householder vectors below it; ``T`` (made by
    :func:`qr_workspace` with the same ``ib``) receives the block-reflector factors.
    ``ib`` is the kernels' inner block size. :func:`qr_apply_qt` applies Qᵀ.
    """
    from taskgraph.kernels import geqrt, tpqrt

    _check_qr(A, T, ib)
    with Graph(name) as g:
        for k in range(min(A.mt, A.nt)):
            geqrt(A[k, k].rw, T[k, k].w, ib)
            _apply_qt_row(A, T, A, k, ib, range(k + 1, A.nt))
            for m in range(k + 1, A.mt):
                tpqrt(A[k, k].rw, A[m, k].rw, T[m, k].w, ib)
                _apply_qt_pair(A, T, A, k, m, ib, range(k + 1, A.nt))
    return g


def qr_apply_qt(
    A: TiledMatrix, T: TiledMatrix, B: TiledMatrix, ib: int = QR_IB, name: str = "qr-apply-qt"
) -> Graph:
    """The task graph of B <- Qᵀ B (Qᴴ for complex), Q from a tiled QR of A by :func:`qr`
    with the same ``T`` and ``ib``. B has A's rows and row tiles, any number of columns."""
    _check_qr(A, T, ib)
    if B.shape[0] != A.shape[0] or B.tile_rows != A.tile_rows:
        raise ValueError(
            f"qr_apply_qt: {B.name} must have the rows and tile rows of {A.name}: "
            f"{B.shape[0]} in tiles of {B.tile_rows}, not {A.shape[0]} in {A.tile_rows}"
        )
    with Graph(name) as g:
        for k in range(min(A.mt, A.nt)):
            _apply_qt_row(A, T, B, k, ib, range(B.nt))
            for m in range(k + 1, A.mt):
                _apply_qt_pair(A, T, B, k, m, ib, range(B.nt))
    return g


def _check_qr(A: TiledMatrix, T: TiledMatrix, ib: int) -> None:
    if A.tile_rows != A.tile_cols:  # else R's diagonal leaves the diagonal tiles
        raise ValueError(
            f"qr: {A.name}'s tiles must be square (ragged at the edges), not "
            f"{A.tile_rows} x {A.tile_cols}"
        )
    if (T.mt, T.nt) != (A.mt, A.nt) or T.tile_rows < ib:
        raise ValueError(
            f"qr: {T.name} must have a tile of >= ib={ib} rows per tile of {A.name} "
            "(make it with qr_workspace(A, ib))"
        )


def _apply_qt_row(A, T, B, k: int, ib: int, columns: range) -> None:
    """Tile row k of B <- Qkkᵀ (the reflectors of geqrt on A[k, k])."""
    from taskgraph.kernels import gemqrt

    for n in columns:
        gemqrt(A[k, k].r, T[k, k].r, B[k, n].rw, ib)


def _apply_qt_pair(A, T, B, k: int, m: int, ib: int, columns: range) -> None:
    """Tile rows k and m of B <- Qmkᵀ (the reflectors of tpqrt on A[k, k], A[m, k])."""
    from taskgraph.kernels import tpmqrt

    for n in columns:
        tpmqrt(A[m, k].r, T[m, k].r, B[k, n].rw, B[m, n].rw, ib)


def qr_flops(m: int, n: int) -> float:
    """The conventional operation count of a QR factorisation of an m x n matrix (m >= n):
    2 n² (m − n/3), 4/3 n³ when square."""
    return 2.0 * n * n * (m - n / 3.0)


def cholesky_flops(n: int) -> float:
    """The conventional operation count of a Cholesky factorisation, n³/3."""
    return n**3 / 3.0


def cholesky_residual(a: np.ndarray, factor: np.ndarray) -> float:
    """‖A − L Lᵀ‖_F / ‖A‖_F for symmetric A, reading only lower triangles.

    ``factor`` may hold anything above its diagonal; it is ignored. Uses one BLAS
    ``syrk`` (n³ flops) and works in the precision of the inputs.
    """
    from scipy.linalg import blas

    L = np.tril(factor)
    syrk = blas.dsyrk if L.dtype == np.float64 else blas.ssyrk
    llt = syrk(1.0, L, lower=1)  # lower triangle of L Lᵀ
    diff = np.tril(a) - np.tril(llt)
    return _sym_fro(diff) / _sym_fro(np.tril(a))


def _sym_fro(lower: np.ndarray) -> float:
    """Frobenius norm of the symmetric matrix whose lower triangle is given."""
    total = np.linalg.norm(lower) ** 2
    diag = np.linalg.norm(np.diagonal(lower)) ** 2
    return float(np.sqrt(2 * total - diag))
