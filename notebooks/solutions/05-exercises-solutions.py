"""Solutions to notebooks/05-exercises.ipynb (for teachers; the tests check them).

Run this file to check both answers in this process::

    python notebooks/solutions/05-exercises-solutions.py
"""

from __future__ import annotations

from taskgraph.kernels.teaching import (
    gemm_nn,
    getrf_nopiv,
    jacobi_step,
    trsm_lower_unit,
    trsm_upper_right,
)

import taskgraph as tg


def lu(A: tg.TiledMatrix) -> tg.Graph:
    """Right-looking tiled LU without pivoting, in place (unit L below, U on and above)."""
    with tg.Graph("lu") as g:
        for k in range(A.nt):
            getrf_nopiv(A[k, k].rw)
            for j in range(k + 1, A.nt):
                trsm_lower_unit(A[k, k].r, A[k, j].rw)  # row k of U
            for i in range(k + 1, A.mt):
                trsm_upper_right(A[k, k].r, A[i, k].rw)  # column k of L
            for i in range(k + 1, A.mt):
                for j in range(k + 1, A.nt):
                    gemm_nn(A[i, k].r, A[k, j].r, A[i, j].rw)  # the trailing update
    return g


def jacobi(U: tg.TiledMatrix, V: tg.TiledMatrix, steps: int) -> tg.Graph:
    """``steps`` Jacobi sweeps on a periodic grid, from U into V and back."""
    mt, nt = U.mt, U.nt
    with tg.Graph("jacobi") as g:
        src, dst = U, V
        for _ in range(steps):
            for i in range(mt):
                for j in range(nt):
                    jacobi_step(
                        src[i, j].r,
                        src[(i - 1) % mt, j].r,  # north: its last row is our halo
                        src[(i + 1) % mt, j].r,  # south: its first row
                        src[i, (j - 1) % nt].r,  # west: its last column
                        src[i, (j + 1) % nt].r,  # east: its first column
                        dst[i, j].w,
                    )
            src, dst = dst, src
    return g


if __name__ == "__main__":
    print(tg.teach.check_lu(lu))
    print(tg.teach.check_jacobi(jacobi))
