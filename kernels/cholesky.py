"""Tiled-Cholesky tile kernels (A = L Lᵀ, lower): potrf, trsm, syrk and gemm.

Each operation comes in three tiers:

1. **Jitted inner functions**, one per (operation, dtype), built by the ``_make_*``
   factories and kept in :data:`JITTED`. They are ``numba.njit(nogil=True)`` functions
   that pass their scalars to BLAS/LAPACK through small arrays (``arr.ctypes``) and
   call the routines of :mod:`._lapack` through plain C function pointers, so the
   GIL is released for the whole call. They trust their input; their ``py_func``
   runs the same code in plain Python (slowly), which the tests use.
2. **Plain-Python wrappers** (:func:`potrf`, :func:`trsm`, :func:`syrk`,
   :func:`gemm`) that validate the tiles, raise clear errors and carry the docs.
3. The declared :class:`taskgraph.dsl.kernel.Kernel` objects, in ``taskgraph.kernels``.

Tiles are column-major 2-D arrays, whole (F-contiguous) or strided views of a larger
Fortran array whose leading dimension is ``strides[1] // itemsize``.

Compilation is explicit and happens once per (operation, dtype): :func:`compile_op`
compiles a single signature whose arrays have layout ``'A'`` (any strides), with the
arguments that are only read typed read-only. numba converts F- and C-contiguous,
strided, writable and read-only arrays to those types, so every tile dispatches to
the same machine code; compilation is then disabled on the dispatcher so that no
other specialisation is compiled behind our back mid-run. A wrapper compiles on
first use if nobody called :func:`compile_op` before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import register_jitable

from taskgraph.core.errors import NotPositiveDefiniteError

from . import _lapack, _recursive
from ._jit import Compiled

__all__ = ["potrf", "trsm", "syrk", "gemm", "compile_op", "signature", "JITTED", "DTYPES"]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}  # BLAS name prefixes

_L, _N, _R, _T = (ord(c) for c in "LNRT")  # BLAS option characters, as int8 codes


# -- tier 1: jitted inner functions ---------------------------------------------------


@register_jitable
def _ld(a):
    """The leading dimension to hand BLAS: the column stride, at least max(1, rows).

    A tile with one column (or none) may carry any column stride, and NumPy gives
    empty arrays zero strides, so those get ``rows``; BLAS needs ``ld >= 1`` always.
    """
    ld = a.strides[1] // a.itemsize if a.shape[1] > 1 else 0
    return max(ld, a.shape[0], 1)


def _named(fn: Callable, routine: str) -> Callable:
    fn.__name__ = fn.__qualname__ = f"{routine}_tile"
    return numba.njit(nogil=True)(fn)


def _make_potrf_leaf(routine: Callable, dtype: np.dtype, name: str) -> Callable:
    def potrf_leaf(a):
        """LAPACK ?potrf(uplo='L') in place on square ``a``; returns LAPACK's info."""
        uplo = np.empty(1, np.int8)
        uplo[0] = _L
        ints = np.empty(3, np.int32)  # n, lda, info
        ints[0] = a.shape[0]
        ints[1] = _ld(a)
        ints[2] = 0
        routine(uplo.ctypes, ints.ctypes, a.ctypes, ints[1:].ctypes, ints[2:].ctypes)
        return ints[2]

    return _named(potrf_leaf, name + "_leaf")


def _make_potrf(routine: Callable, dtype: np.dtype, name: str) -> Callable:
    p = name[0]
    rec = _recursive.make_potrf(
        _make_potrf_leaf(routine, dtype, name),
        _make_trsm(getattr(_lapack, p + "trsm"), dtype, p + "trsm"),
        _make_syrk(getattr(_lapack, p + "syrk"), dtype, p + "syrk"),
        name,
    )

    def potrf_tile(a):
        """lower(a) <- L, L Lᵀ = a, by halves (:mod:`._recursive`); returns LAPACK's info.

        OpenBLAS's potrf lets NaN through (it only tests ``ajj <= 0``); reference
        LAPACK stops there. A NaN anywhere in the lower triangle reaches the diagonal
        of L, so an O(n) scan restores the reference behaviour.
        """
        info = rec(a)
        if info == 0:
            for j in range(a.shape[0]):
                if np.isnan(a[j, j]):
                    return j + 1
        return info

    return _named(potrf_tile, name)


def trsm_maker(side: int, uplo: int, trans: int, diag: int) -> Callable:
    """A factory ``make(routine, dtype, name="trsm")`` of jitted ?trsm tile functions
    with these option codes and alpha 1: ``b <- op(a)⁻¹ b`` (side L) or ``b op(a)⁻¹``
    (side R), op(a) being a's ``uplo`` triangle, transposed if ``trans`` is T."""

    def make(routine: Callable, dtype: np.dtype, name: str = "trsm") -> Callable:
        def trsm_tile(a, b):
            """?trsm(side, uplo, trans, diag) with alpha 1 on tiles ``a`` and ``b`` (in place)."""
            opts = np.empty(4, np.int8)
            opts[0] = side
            opts[1] = uplo
            opts[2] = trans
            opts[3] = diag
            ints = np.empty(4, np.int32)  # m, n, lda, ldb
            ints[0] = b.shape[0]
            ints[1] = b.shape[1]
            ints[2] = _ld(a)
            ints[3] = _ld(b)
            alpha = np.ones(1, dtype)
            routine(
                opts.ctypes, opts[1:].ctypes, opts[2:].ctypes, opts[3:].ctypes,
                ints.ctypes, ints[1:].ctypes, alpha.ctypes,
                a.ctypes, ints[2:].ctypes, b.ctypes, ints[3:].ctypes,
            )  # fmt: skip

        return _named(trsm_tile, name)

    return make


# b <- b · L⁻ᵀ, L the lower triangle of the first tile (side R, uplo L, trans T): the
# BLAS call on a leaf, by halves through gemm above it (taskgraph.kernels._recursive)
_trsm_leaf = trsm_maker(_R, _L, _T, _N)


def _make_syrk(routine: Callable, dtype: np.dtype, name: str) -> Callable:
    def syrk_tile(a, c):
        """lower(c) <- lower(c) − a·aᵀ (?syrk uplo L, trans N, alpha −1, beta 1)."""
        opts = np.empty(2, np.int8)
        opts[0] = _L
        opts[1] = _N
        ints = np.empty(4, np.int32)  # n, k, lda, ldc
        ints[0] = a.shape[0]
        ints[1] = a.shape[1]
        ints[2] = _ld(a)
        ints[3] = _ld(c)
        scalars = np.empty(2, dtype)  # alpha, beta
        scalars[0] = -1.0
        scalars[1] = 1.0
        routine(
            opts.ctypes, opts[1:].ctypes, ints.ctypes, ints[1:].ctypes, scalars.ctypes,
            a.ctypes, ints[2:].ctypes, scalars[1:].ctypes, c.ctypes, ints[3:].ctypes,
        )  # fmt: skip

    return _named(syrk_tile, name)


def gemm_maker(transb: int) -> Callable:
    """A factory ``make(routine, dtype, name="gemm")`` of jitted ?gemm tile functions:
    ``c <- c − a·op(b)``, op(b) being b, or bᵀ if ``transb`` is T (alpha −1, beta 1)."""

    def make(routine: Callable, dtype: np.dtype, name: str = "gemm") -> Callable:
        def gemm_tile(a, b, c):
            """c <- c − a·op(b) (?gemm transa N, transb as made, alpha −1, beta 1)."""
            opts = np.empty(2, np.int8)
            opts[0] = _N
            opts[1] = transb
            ints = np.empty(6, np.int32)  # m, n, k, lda, ldb, ldc
            ints[0] = c.shape[0]
            ints[1] = c.shape[1]
            ints[2] = a.shape[1]
            ints[3] = _ld(a)
            ints[4] = _ld(b)
            ints[5] = _ld(c)
            scalars = np.empty(2, dtype)  # alpha, beta
            scalars[0] = -1.0
            scalars[1] = 1.0
            routine(
                opts.ctypes, opts[1:].ctypes, ints.ctypes, ints[1:].ctypes, ints[2:].ctypes,
                scalars.ctypes, a.ctypes, ints[3:].ctypes, b.ctypes, ints[4:].ctypes,
                scalars[1:].ctypes, c.ctypes, ints[5:].ctypes,
            )  # fmt: skip

        return _named(gemm_tile, name)

    return make


_make_gemm = gemm_maker(_T)  # c <- c − a·bᵀ


def _make_trsm(routine: Callable, dtype: np.dtype, name: str) -> Callable:
    p = name[0]
    gemm = _make_gemm(getattr(_lapack, p + "gemm"), dtype, p + "gemm")
    return _recursive.make_trsm(_trsm_leaf(routine, dtype, name + "_leaf"), gemm, name)


# operation -> (factory, arguments that are only read, return type)
_OPS = {
    "potrf": (_make_potrf, (False,), types.int64),
    "trsm": (_make_trsm, (True, False), types.void),
    "syrk": (_make_syrk, (True, False), types.void),
    "gemm": (_make_gemm, (True, True, False), types.void),
}

#: The jitted inner function of each (operation, dtype name), e.g. ``JITTED["gemm", "float64"]``.
JITTED: dict[tuple[str, str], Callable] = {
    (op, dt.name): factory(getattr(_lapack, _PREFIX[dt] + op), dt, _PREFIX[dt] + op)
    for op, (factory, _, _) in _OPS.items()
    for dt in DTYPES
}


def signature(op: str, dtype: np.dtype) -> numba.core.typing.Signature:
    """The one numba signature the inner function of ``op`` is compiled for."""
    _, readonly, restype = _OPS[op]
    scalar = numba.from_dtype(np.dtype(dtype))
    return restype(*(types.Array(scalar, 2, "A", readonly=ro) for ro in readonly))


_COMPILED = Compiled(JITTED, signature, DTYPES)


def compile_op(op: str, dtype: Any = np.float64) -> Any:
    """Compile the inner function of ``op`` for ``dtype`` (once) and return it."""
    return _COMPILED(op, dtype)


# -- tier 2: validating wrappers ------------------------------------------------------


def _shape(op: str, name: str, a: np.ndarray) -> tuple[int, int]:
    """The shape of tile ``a``, after checking that it is a column-major 2-D array."""
    try:
        rows, cols = a.shape
        s0, s1 = a.strides
        item = a.itemsize
    except (AttributeError, ValueError):
        what = f"shape {a.shape}" if hasattr(a, "shape") else type(a).__name__
        raise ValueError(f"{op}: {name} must be a 2-D NumPy array, got {what}") from None
    if (rows > 1 and cols > 0 and s0 != item) or (
        cols > 1 and rows > 0 and (s1 < rows * item or s1 % item)
    ):
        raise ValueError(
            f"{op}: {name} is not a column-major (Fortran-ordered) tile: shape {a.shape}, "
            f"strides {a.strides}; pass np.asfortranarray({name})"
        )
    return rows, cols


def _inner(op: str, tiles: tuple[np.ndarray, ...], names: str) -> Callable:
    """The compiled inner function for the tiles' common dtype."""
    dtype = tiles[-1].dtype
    for tile in tiles:
        if tile.dtype != dtype:
            got = ", ".join(f"{n}: {t.dtype}" for t, n in zip(tiles, names))
            raise ValueError(f"{op} needs tiles of one dtype, got {got}")
    fn = _COMPILED.ready[op].get(dtype)
    return fn if fn is not None else compile_op(op, dtype)


def _call(op: str, fn: Callable, tiles: tuple[np.ndarray, ...], names: str) -> object:
    """``fn(*tiles)``, turning numba's complaint about a read-only output into a ValueError."""
    try:
        return fn(*tiles)
    except TypeError:  # numba found no matching signature: say why in our terms
        if not tiles[-1].flags.writeable:
            raise ValueError(f"{op} writes {names[-1]}, which is read-only") from None
        raise


def _mismatch(op: str, shapes: dict[str, tuple[int, int]], dims: str) -> ValueError:
    given = ", ".join(f"{n} {s}" for n, s in shapes.items())
    return ValueError(f"{op}: tile shapes do not fit (dims {dims}): {given}")


def potrf(a: np.ndarray) -> None:
    """Cholesky-factorise square tile ``a`` in place: lower(a) <- L with L Lᵀ = a.

    Only the lower triangle of ``a`` is read and written (LAPACK ?potrf, uplo='L');
    the strict upper triangle is left untouched. Raises
    :class:`~taskgraph.core.errors.NotPositiveDefiniteError` (with the order of the
    failing leading minor) if ``a`` is not positive definite; ``a`` then holds a
    partial factorisation.
    """
    n, n2 = _shape("potrf", "a", a)
    if n != n2:
        raise _mismatch("potrf", {"a": (n, n2)}, "nn")
    info = _call("potrf", _inner("potrf", (a,), "a"), (a,), "a")
    if info > 0:
        raise NotPositiveDefiniteError(int(info))
    if info < 0:
        raise ValueError(f"potrf: LAPACK rejected argument {-info} (info={info})")


def trsm(l: np.ndarray, b: np.ndarray) -> None:  # noqa: E741 (l is the factor L)
    """Triangular solve from the right: b <- b · L⁻ᵀ, L = lower triangle of ``l``.

    ``l`` is k×k (its strict upper triangle is ignored), ``b`` is m×k and is
    overwritten (BLAS ?trsm with side='R', uplo='L', transa='T', diag='N').
    """
    k, k2 = _shape("trsm", "l", l)
    m, k3 = _shape("trsm", "b", b)
    if not k == k2 == k3:
        raise _mismatch("trsm", {"l": (k, k2), "b": (m, k3)}, "kk,mk")
    _call("trsm", _inner("trsm", (l, b), "lb"), (l, b), "lb")


def syrk(a: np.ndarray, c: np.ndarray) -> None:
    """Symmetric rank-k update of the lower triangle: lower(c) <- lower(c) − a·aᵀ.

    ``a`` is m×k, ``c`` is m×m; the strict upper triangle of ``c`` is left untouched
    (BLAS ?syrk with uplo='L', trans='N', alpha=−1, beta=1).
    """
    m, k = _shape("syrk", "a", a)
    m2, m3 = _shape("syrk", "c", c)
    if not m == m2 == m3:
        raise _mismatch("syrk", {"a": (m, k), "c": (m2, m3)}, "mk,mm")
    _call("syrk", _inner("syrk", (a, c), "ac"), (a, c), "ac")


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """General update: c <- c − a·bᵀ, with ``a`` m×k, ``b`` n×k and ``c`` m×n.

    (BLAS ?gemm with transa='N', transb='T', alpha=−1, beta=1.)
    """
    m, k = _shape("gemm", "a", a)
    n, k2 = _shape("gemm", "b", b)
    m2, n2 = _shape("gemm", "c", c)
    if m != m2 or n != n2 or k != k2:
        raise _mismatch("gemm", {"a": (m, k), "b": (n, k2), "c": (m2, n2)}, "mk,nk,mn")
    _call("gemm", _inner("gemm", (a, b, c), "abc"), (a, b, c), "abc")
