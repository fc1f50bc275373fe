"""Tiled algorithms written in the task-flow DSL, and checks of their results."""

from __future__ import annotations

import numpy as np

from .dsl.graph import Graph
from .dsl.tiled import TiledMatrix


def cholesky(A: TiledMatrix, name: str = "cholesky") -> Graph:
    """The task graph of the right-looking tiled Cholesky factorisation A = L Lᵀ.

    Overwrites the lower triangle of A with L when run.
    """
    from taskgraph.kernels import gemm, potrf, syrk, trsm

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
