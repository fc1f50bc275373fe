"""Tile-QR kernels (PLASMA's flat-tree tile QR): geqrt, gemqrt, tpqrt and tpmqrt.

A tiled QR of A (``taskgraph.linalg.qr``) is, for each tile column k::

    geqrt(Akk.rw, Tkk.w)                 Akk  <- V (below the diagonal), R (on and above)
    gemqrt(Akk.r, Tkk.r, Akn.rw)         Akn  <- Qᵀ Akn                    (n > k)
    tpqrt(Akk.rw, Amk.rw, Tmk.w)         [Rkk; Amk] <- QR of the pair   (m > k)
    tpmqrt(Amk.r, Tmk.r, Akn.rw, Amn.rw) [Akn; Amn] <- Qᵀ [Akn; Amn]   (m, n > k)

T tiles hold LAPACK's block-reflector factors: ``ib`` rows (the inner block size)
by the reflectors' count of columns; a T tile may have more rows, and only its first
``ib`` are used. Qᵀ means the conjugate transpose for complex dtypes.

Three tiers, as in :mod:`.cholesky`: jitted inner functions (``nogil``, calling LAPACK's
``?geqrt``/``?gemqrt``/``?tpqrt``/``?tpmqrt`` through the addresses SciPy exports,
and taking ``ib`` as an argument), validating wrappers (:func:`geqrt` ...), and the
declared kernels in ``taskgraph.kernels``, whose last argument ``ib`` is a scalar
(``modes="rw,w,int"``). Each inner function is compiled for one signature per dtype
(layout ``'A'``, read-only inputs, an int64 ``ib``), once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types

from ._jit import Compiled
from ._lapack import QR_ROUTINES
from .cholesky import _ld, _named, _shape

__all__ = ["geqrt", "gemqrt", "tpqrt", "tpmqrt", "compile_op", "JITTED", "DTYPES"]

DTYPES = tuple(np.dtype(d) for d in ("float32", "float64", "complex64", "complex128"))
_PREFIX = dict(zip(DTYPES, "sdcz"))
_L, _T, _C = (ord(c) for c in "LTC")  # LAPACK option characters, as int8 codes


# -- tier 1: jitted inner functions ---------------------------------------------------


def _make_geqrt(routine: Callable, dtype: np.dtype, trans: int) -> Callable:
    def geqrt_tile(a, t, ib):
        """?geqrt on ``a`` (m x n) with inner block min(ib, m, n); T into ``t``; info."""
        m, n = a.shape
        k = min(m, n)
        if k == 0:
            return 0
        ints = np.empty(6, np.int32)  # m, n, nb, lda, ldt, info
        ints[0] = m
        ints[1] = n
        ints[2] = min(ib, k)
        ints[3] = _ld(a)
        ints[4] = _ld(t)
        ints[5] = 0
        work = np.empty(ints[2] * n, dtype)
        routine(
            ints.ctypes, ints[1:].ctypes, ints[2:].ctypes, a.ctypes, ints[3:].ctypes,
            t.ctypes, ints[4:].ctypes, work.ctypes, ints[5:].ctypes,
        )  # fmt: skip
        return ints[5]

    return geqrt_tile


def _make_gemqrt(routine: Callable, dtype: np.dtype, trans: int) -> Callable:
    def gemqrt_tile(v, t, c, ib):
        """c <- Qᵀ c, Q from the reflectors in ``v`` and ``t`` (?gemqrt side L); info."""
        m, n = c.shape
        k = min(v.shape[0], v.shape[1])
        if k == 0 or n == 0:
            return 0
        opts = np.empty(2, np.int8)
        opts[0] = _L
        opts[1] = trans
        ints = np.empty(8, np.int32)  # m, n, k, nb, ldv, ldt, ldc, info
        ints[0] = m
        ints[1] = n
        ints[2] = k
        ints[3] = min(ib, k)
        ints[4] = _ld(v)
        ints[5] = _ld(t)
        ints[6] = _ld(c)
        ints[7] = 0
        work = np.empty(ints[3] * n, dtype)
        routine(
            opts.ctypes, opts[1:].ctypes, ints.ctypes, ints[1:].ctypes, ints[2:].ctypes,
            ints[3:].ctypes, v.ctypes, ints[4:].ctypes, t.ctypes, ints[5:].ctypes,
            c.ctypes, ints[6:].ctypes, work.ctypes, ints[7:].ctypes,
        )  # fmt: skip
        return ints[7]

    return gemqrt_tile


def _make_tpqrt(routine: Callable, dtype: np.dtype, trans: int) -> Callable:
    def tpqrt_tile(a, b, t, ib):
        """QR of [triu(a[:n, :n]); b] (?tpqrt, l = 0): R into a, V into b, T into t; info."""
        m, n = b.shape
        if m == 0 or n == 0:
            return 0
        ints = np.empty(8, np.int32)  # m, n, l, nb, lda, ldb, ldt, info
        ints[0] = m
        ints[1] = n
        ints[2] = 0
        ints[3] = min(ib, n)
        ints[4] = _ld(a)
        ints[5] = _ld(b)
        ints[6] = _ld(t)
        ints[7] = 0
        work = np.empty(ints[3] * n, dtype)
        routine(
            ints.ctypes, ints[1:].ctypes, ints[2:].ctypes, ints[3:].ctypes, a.ctypes,
            ints[4:].ctypes, b.ctypes, ints[5:].ctypes, t.ctypes, ints[6:].ctypes,
            work.ctypes, ints[7:].ctypes,
        )  # fmt: skip
        return ints[7]

    return tpqrt_tile


def _make_tpmqrt(routine: Callable, dtype: np.dtype, trans: int) -> Callable:
    def tpmqrt_tile(v, t, a, b, ib):
        """[a[:k]; b] <- Qᵀ [a[:k]; b], Q from ``v`` (m x k) and ``t`` (?tpmqrt side L)."""
        m, k = v.shape
        n = b.shape[1]
        if m == 0 or k == 0 or n == 0:
            return 0
        opts = np.empty(2, np.int8)
        opts[0] = _L
        opts[1] = trans
        ints = np.empty(10, np.int32)  # m, n, k, l, nb, ldv, ldt, lda, ldb, info
        ints[0] = m
        ints[1] = n
        ints[2] = k
        ints[3] = 0
        ints[4] = min(ib, k)
        ints[5] = _ld(v)
        ints[6] = _ld(t)
        ints[7] = _ld(a)
        ints[8] = _ld(b)
        ints[9] = 0
        work = np.empty(ints[4] * n, dtype)
        routine(
            opts.ctypes, opts[1:].ctypes, ints.ctypes, ints[1:].ctypes, ints[2:].ctypes,
            ints[3:].ctypes, ints[4:].ctypes, v.ctypes, ints[5:].ctypes, t.ctypes,
            ints[6:].ctypes, a.ctypes, ints[7:].ctypes, b.ctypes, ints[8:].ctypes,
            work.ctypes, ints[9:].ctypes,
        )  # fmt: skip
        return ints[9]

    return tpmqrt_tile


# operation -> (factory, which array arguments are only read)
_OPS: dict[str, tuple[Callable, tuple[bool, ...]]] = {
    "geqrt": (_make_geqrt, (False, False)),
    "gemqrt": (_make_gemqrt, (True, True, False)),
    "tpqrt": (_make_tpqrt, (False, False, False)),
    "tpmqrt": (_make_tpmqrt, (True, True, False, False)),
}


def _jitted(op: str, dtype: np.dtype) -> Callable:
    factory, _ = _OPS[op]
    trans = _C if dtype.kind == "c" else _T
    routine = QR_ROUTINES[_PREFIX[dtype] + op]
    return _named(factory(routine, dtype, trans), _PREFIX[dtype] + op)


#: The jitted inner function of each (operation, dtype name), e.g. ``JITTED["tpqrt", "float64"]``.
JITTED: dict[tuple[str, str], Any] = {
    (op, dt.name): _jitted(op, dt) for op in _OPS for dt in DTYPES
}


def signature(op: str, dtype: np.dtype) -> numba.core.typing.Signature:
    """The one numba signature the inner function of ``op`` is compiled for."""
    _, readonly = _OPS[op]
    scalar = numba.from_dtype(np.dtype(dtype))
    arrays = (types.Array(scalar, 2, "A", readonly=ro) for ro in readonly)
    return types.int64(*arrays, types.int64)


_COMPILED = Compiled(JITTED, signature, DTYPES)


def compile_op(op: str, dtype: Any = np.float64) -> Any:
    """Compile the inner function of ``op`` for ``dtype`` (once) and return it."""
    return _COMPILED(op, dtype)


# -- tier 2: validating wrappers ------------------------------------------------------


def _run(op: str, tiles: tuple[np.ndarray, ...], names: str, ib: int) -> list[tuple[int, int]]:
    """Check the tiles and ``ib``, run the inner function, raise on LAPACK's complaint;
    the tiles' shapes (checked by the caller before, through ``check``)."""
    shapes = [_shape(op, n, t) for t, n in zip(tiles, names)]
    dtype = tiles[0].dtype
    if any(t.dtype != dtype for t in tiles):
        got = ", ".join(f"{n}: {t.dtype}" for t, n in zip(tiles, names))
        raise ValueError(f"{op} needs tiles of one dtype, got {got}")
    if int(ib) < 1:
        raise ValueError(f"{op}: the inner block size ib must be at least 1, not {ib}")
    return shapes


def _call(op: str, tiles: tuple[np.ndarray, ...], names: str, ib: int) -> None:
    for t, n in zip(tiles, names):
        if not t.flags.writeable and n in _WRITES[op]:
            raise ValueError(f"{op} writes {n}, which is read-only")
    fn = _COMPILED.ready[op].get(tiles[0].dtype) or compile_op(op, tiles[0].dtype)
    info = fn(*tiles, int(ib))
    if info < 0:
        raise ValueError(f"{op}: LAPACK rejected argument {-info} (info={info})")


_WRITES = {"geqrt": "at", "gemqrt": "c", "tpqrt": "abt", "tpmqrt": "ab"}


def _t_fits(op: str, t: tuple[int, int], ib: int, k: int) -> None:
    rows = min(ib, k)
    if t[0] < rows or t[1] < k:
        raise ValueError(f"{op}: t is {t} but must be at least {rows} x {k} (ib={ib})")


def geqrt(a: np.ndarray, t: np.ndarray, ib: int = 32) -> None:
    """QR-factorise tile ``a`` (m x n) in place: R on and above the diagonal, the
    Householder vectors V below it; the block-reflector factors go to ``t`` (at least
    min(ib, m, n) x min(m, n); LAPACK ?geqrt with inner block size ``ib``)."""
    (m, n), tshape = _run("geqrt", (a, t), "at", ib)
    _t_fits("geqrt", tshape, ib, min(m, n))
    _call("geqrt", (a, t), "at", ib)


def gemqrt(v: np.ndarray, t: np.ndarray, c: np.ndarray, ib: int = 32) -> None:
    """c <- Qᵀ c, Q = the reflectors that :func:`geqrt` left in ``v`` and ``t``.

    ``v`` is m x n (its min(m, n) reflectors are used), ``c`` is m x p (LAPACK ?gemqrt,
    side L, trans T, or C for complex).
    """
    (m, n), tshape, (m2, _) = _run("gemqrt", (v, t, c), "vtc", ib)
    if m != m2:
        raise ValueError(f"gemqrt: v {v.shape} and c {c.shape} need the same number of rows")
    _t_fits("gemqrt", tshape, ib, min(m, n))
    _call("gemqrt", (v, t, c), "vtc", ib)


def tpqrt(a: np.ndarray, b: np.ndarray, t: np.ndarray, ib: int = 32) -> None:
    """QR of the triangle-over-square pair [R; b]: R the upper triangle of the top n x n
    of ``a`` (k x n, k >= n), ``b`` m x n. The new R goes to ``a``, the Householder
    vectors to ``b``, the factors to ``t`` (LAPACK ?tpqrt with l = 0)."""
    (k, n), (_, n2), tshape = _run("tpqrt", (a, b, t), "abt", ib)
    if n != n2 or k < n:
        raise ValueError(f"tpqrt: a {a.shape} must be k x n with k >= n over b {b.shape} (m x n)")
    _t_fits("tpqrt", tshape, ib, n)
    _call("tpqrt", (a, b, t), "abt", ib)


def tpmqrt(v: np.ndarray, t: np.ndarray, a: np.ndarray, b: np.ndarray, ib: int = 32) -> None:
    """[a[:k]; b] <- Qᵀ [a[:k]; b], Q = the reflectors that :func:`tpqrt` left in ``v``
    (m x k) and ``t``; ``a`` has at least k rows, ``b`` is m x n (LAPACK ?tpmqrt, side L)."""
    (m, k), tshape, (ka, n), (m2, n2) = _run("tpmqrt", (v, t, a, b), "vtab", ib)
    if m != m2 or n != n2 or ka < k:
        raise ValueError(
            f"tpmqrt: tiles do not fit: v {v.shape} (m x k), a {a.shape} (>= k x n), "
            f"b {b.shape} (m x n)"
        )
    _t_fits("tpmqrt", tshape, ib, k)
    _call("tpmqrt", (v, t, a, b), "vtab", ib)
