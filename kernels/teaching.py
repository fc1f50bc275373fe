"""Tile kernels for the teaching exercises: LU without pivoting, and a Jacobi stencil.

LU without pivoting of a tiled matrix, right-looking, uses four kernels (L unit lower,
U upper, both stored in place of A as LAPACK's ``getrf`` does)::

    getrf_nopiv(Akk.rw)              Akk  <- L_kk, U_kk        (in place, no pivoting)
    trsm_lower_unit(Akk.r, Akj.rw)   Akj  <- L_kk⁻¹ Akj        (a tile of U's row k)
    trsm_upper_right(Akk.r, Aik.rw)  Aik  <- Aik U_kk⁻¹        (a tile of L's column k)
    gemm_nn(Aik.r, Akj.r, Aij.rw)    Aij  <- Aij − Aik Akj     (the trailing update)

The 2-D Jacobi stencil works on a periodic grid (a torus: every tile has four
neighbours, wrapping around at the edges) cut into tiles; one sweep writes a second
matrix from the first, and the halo (the neighbours' edge rows and columns) is read
from the neighbour tiles, which is what becomes messages between ranks::

    jacobi_step(C.r, N.r, S.r, W.r, E.r, out.w)
        out[i, j] = (up + down + left + right) / 4, taking "up" of row 0 from the last
        row of N, "down" of the last row from the first row of S, "left" of column 0
        from the last column of W and "right" of the last column from the first of E.

Three tiers, as in :mod:`.cholesky`: jitted inner functions (``nogil``; the triangular
solves and the product call SciPy's BLAS by address, the LU and the stencil are
plain loops, since exercise tiles are small), validating wrappers, and the declared
:class:`~taskgraph.dsl.kernel.Kernel` objects. Each inner function is compiled for one
signature per dtype (layout ``'A'``, read-only inputs), once, by :func:`compile_op`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types

from taskgraph.dsl.kernel import Kernel

from . import _lapack
from ._jit import Compiled
from .cholesky import _shape, gemm_maker, trsm_maker

__all__ = [
    "getrf_nopiv",
    "trsm_lower_unit",
    "trsm_upper_right",
    "gemm_nn",
    "jacobi_step",
    "LU_KERNELS",
    "TEACHING_KERNELS",
    "compile_all",
    "compile_op",
    "JITTED",
]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}
_L, _N, _R, _U = (ord(c) for c in "LNRU")  # BLAS option characters

# -- tier 1: jitted inner functions ---------------------------------------------------


def getrf_nopiv_tile(a):
    """In-place LU of ``a`` (m x n) without pivoting (unit L below, U on and above).

    Returns 0, or k + 1 when the pivot of row k is zero (this matrix needs pivoting).
    """
    m, n = a.shape
    for k in range(min(m, n)):
        pivot = a[k, k]
        if pivot == 0:
            return k + 1
        for i in range(k + 1, m):
            a[i, k] /= pivot
        for j in range(k + 1, n):
            akj = a[k, j]
            for i in range(k + 1, m):
                a[i, j] -= a[i, k] * akj
    return 0


def jacobi_tile(c, north, south, west, east, out):
    """One Jacobi sweep of tile ``c`` into ``out``, the halo taken from the neighbours."""
    m, n = c.shape
    last_row = north.shape[0] - 1
    last_col = west.shape[1] - 1
    for j in range(n):
        for i in range(m):
            up = c[i - 1, j] if i > 0 else north[last_row, j]
            down = c[i + 1, j] if i < m - 1 else south[0, j]
            left = c[i, j - 1] if j > 0 else west[i, last_col]
            right = c[i, j + 1] if j < n - 1 else east[i, 0]
            out[i, j] = 0.25 * (up + down + left + right)


# operation -> (factory of (BLAS routine, dtype) or a ready jitted function,
#               BLAS routine name, arguments only read, return type)
_OPS: dict[str, tuple] = {
    "getrf_nopiv": (getrf_nopiv_tile, None, (False,), types.int64),
    "trsm_lower_unit": (trsm_maker(_L, _L, _N, _U), "trsm", (True, False), types.void),
    "trsm_upper_right": (trsm_maker(_R, _U, _N, _N), "trsm", (True, False), types.void),
    "gemm_nn": (gemm_maker(_N), "gemm", (True, True, False), types.void),
    "jacobi_step": (jacobi_tile, None, (True,) * 5 + (False,), types.void),
}


def _jitted(op: str, dtype: np.dtype) -> Callable:
    """A dispatcher of its own per (operation, dtype), so that each has one signature."""
    source, blas, _, _ = _OPS[op]
    if blas is None:  # plain loops, generic in the dtype
        return numba.njit(nogil=True)(source)
    return source(getattr(_lapack, _PREFIX[dtype] + blas), dtype)


#: The jitted inner function of each (operation, dtype name).
JITTED: dict[tuple[str, str], Any] = {
    (op, dt.name): _jitted(op, dt) for op in _OPS for dt in DTYPES
}


def signature(op: str, dtype: np.dtype) -> numba.core.typing.Signature:
    """The numba signature the inner function of ``op`` is compiled for."""
    _, _, readonly, restype = _OPS[op]
    scalar = numba.from_dtype(np.dtype(dtype))
    return restype(*(types.Array(scalar, 2, "A", readonly=ro) for ro in readonly))


_COMPILED = Compiled(JITTED, signature, DTYPES)


def compile_op(op: str, dtype: Any = np.float64) -> Any:
    """Compile the inner function of ``op`` for ``dtype`` (once) and return it."""
    return _COMPILED(op, dtype)


# -- tier 2: validating wrappers ------------------------------------------------------


def _run(op: str, tiles: tuple[np.ndarray, ...], names: tuple[str, ...]):
    shapes = [_shape(op, n, t) for t, n in zip(tiles, names)]
    dtype = tiles[-1].dtype
    if any(t.dtype != dtype for t in tiles):
        got = ", ".join(f"{n}: {t.dtype}" for t, n in zip(tiles, names))
        raise ValueError(f"{op} needs tiles of one dtype, got {got}")
    if not tiles[-1].flags.writeable:
        raise ValueError(f"{op} writes {names[-1]}, which is read-only")
    fn = _COMPILED.ready[op].get(dtype) or compile_op(op, dtype)
    return shapes, fn


def _mismatch(op: str, names, shapes, dims: str) -> ValueError:
    given = ", ".join(f"{n} {s}" for n, s in zip(names, shapes))
    return ValueError(f"{op}: tile shapes do not fit (dims {dims}): {given}")


def _getrf_nopiv(a: np.ndarray) -> None:
    """LU-factorise tile ``a`` (m x n) in place without pivoting: a <- L + U − I.

    L is unit lower trapezoidal (its unit diagonal is not stored), U upper trapezoidal.
    Raises ValueError on a zero pivot: such a matrix needs pivoting.
    """
    _, fn = _run("getrf_nopiv", (a,), ("a",))
    info = fn(a)
    if info > 0:
        raise ValueError(
            f"getrf_nopiv: zero pivot in row {info - 1} of the tile; "
            "this matrix cannot be factorised without pivoting"
        )


def _trsm_lower_unit(l: np.ndarray, b: np.ndarray) -> None:  # noqa: E741 (L, the factor)
    """b <- L⁻¹ b, L the unit lower triangle of the leading k×k of ``l`` (k×x, x >= k);
    ``b`` is k×n."""
    names = ("l", "b")
    shapes, fn = _run("trsm_lower_unit", (l, b), names)
    (k, x), (k3, _) = shapes
    if not k == k3 <= x:
        raise _mismatch("trsm_lower_unit", names, shapes, "kk,kn; l may have more columns")
    fn(l[:, :k], b)


def _trsm_upper_right(u: np.ndarray, b: np.ndarray) -> None:
    """b <- b U⁻¹, U the upper triangle of the leading k×k of ``u`` (x×k, x >= k);
    ``b`` is m×k."""
    names = ("u", "b")
    shapes, fn = _run("trsm_upper_right", (u, b), names)
    (x, k), (_, k3) = shapes
    if not k == k3 <= x:
        raise _mismatch("trsm_upper_right", names, shapes, "kk,mk; u may have more rows")
    fn(u[:k], b)


def _gemm_nn(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """c <- c − a·b, with ``a`` m×k, ``b`` k×n and ``c`` m×n."""
    names = ("a", "b", "c")
    shapes, fn = _run("gemm_nn", (a, b, c), names)
    (m, k), (k2, n), (m2, n2) = shapes
    if m != m2 or n != n2 or k != k2:
        raise _mismatch("gemm_nn", names, shapes, "mk,kn,mn")
    fn(a, b, c)


def _jacobi_step(
    c: np.ndarray,
    north: np.ndarray,
    south: np.ndarray,
    west: np.ndarray,
    east: np.ndarray,
    out: np.ndarray,
) -> None:
    """One Jacobi sweep of tile ``c`` into ``out`` (same shape), with its four neighbours.

    ``north`` and ``south`` have ``c``'s columns (their last and first rows are used),
    ``west`` and ``east`` its rows (their last and first columns are used).
    """
    names = ("c", "north", "south", "west", "east", "out")
    tiles = (c, north, south, west, east, out)
    shapes, fn = _run("jacobi_step", tiles, names)
    (m, n), (_, n1), (_, n2), (m1, _), (m2, _), out_shape = shapes
    if not (n == n1 == n2 and m == m1 == m2 and out_shape == (m, n)):
        raise _mismatch("jacobi_step", names, shapes, "mn,an,bn,mc,md,mn")
    fn(*tiles)


# -- tier 3: the declared kernels -------------------------------------------------------


def _getrf_flops(m: int, n: int) -> float:
    """LU of an m x n matrix: 2mnk − (m + n)k² + 2k³/3 with k = min(m, n) (2n³/3 square)."""
    k = min(m, n)
    return 2 * m * n * k - (m + n) * k * k + 2 * k**3 / 3


_DTYPE_NAMES = ("float32", "float64")


def _compiler(op: str) -> Callable[[np.dtype], None]:
    def compile(dtype: np.dtype) -> None:
        compile_op(op, dtype)

    return compile


getrf_nopiv = Kernel(
    _getrf_nopiv,
    name="getrf_nopiv",
    modes="rw",
    dims="mn",
    dtypes=_DTYPE_NAMES,
    flops=lambda m, n: _getrf_flops(m, n),
    compile=_compiler("getrf_nopiv"),
    nogil=True,
)
trsm_lower_unit = Kernel(
    _trsm_lower_unit,
    name="trsm_lower_unit",
    modes="r,rw",
    dims="kx,kn",
    dtypes=_DTYPE_NAMES,
    flops=lambda k, x, n: k * k * n,
    compile=_compiler("trsm_lower_unit"),
    nogil=True,
)
trsm_upper_right = Kernel(
    _trsm_upper_right,
    name="trsm_upper_right",
    modes="r,rw",
    dims="xk,mk",
    dtypes=_DTYPE_NAMES,
    flops=lambda x, k, m: m * k * k,
    compile=_compiler("trsm_upper_right"),
    nogil=True,
)
gemm_nn = Kernel(
    _gemm_nn,
    name="gemm_nn",
    modes="r,r,rw",
    dims="mk,kn,mn",
    dtypes=_DTYPE_NAMES,
    flops=lambda m, n, k: 2 * m * n * k,
    compile=_compiler("gemm_nn"),
    nogil=True,
)
jacobi_step = Kernel(
    _jacobi_step,
    name="jacobi_step",
    modes="r,r,r,r,r,w",
    dims="mn,an,bn,mc,md,mn",
    dtypes=_DTYPE_NAMES,
    flops=lambda m, n, **_: 4 * m * n,
    compile=_compiler("jacobi_step"),
    nogil=True,
)

LU_KERNELS = (getrf_nopiv, trsm_lower_unit, trsm_upper_right, gemm_nn)
TEACHING_KERNELS = (*LU_KERNELS, jacobi_step)


def compile_all(dtypes=("float64",)) -> float:
    """Compile every teaching kernel for ``dtypes``; the seconds it took."""
    return sum(k.compile(dtypes) for k in TEACHING_KERNELS)
