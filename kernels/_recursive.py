"""Recursive trsm and potrf tile kernels whose flops go mostly through gemm and syrk.

OpenBLAS's ``?trsm`` and ``?potrf`` reach well under half of the GEMM peak on some
CPUs (0.38 and 0.45 on a Sapphire Rapids class Xeon at tile 512), while its ``?gemm``
reaches 0.87. Split in halves, both operations become two half-size calls of
themselves plus one large update::

    trsm:  B = [B1 B2],  L = [L11 0; L21 L22]       (B <- B · L⁻ᵀ)
           B1 <- B1 · L11⁻ᵀ;   B2 <- B2 − B1 · L21ᵀ (gemm);   B2 <- B2 · L22⁻ᵀ

    potrf: A = [A11 .; A21 A22]                       (lower(A) <- L, L Lᵀ = A)
           L11 <- potrf(A11);  L21 <- A21 · L11⁻ᵀ (trsm, recursive);
           A22 <- A22 − L21 · L21ᵀ (syrk);  L22 <- potrf(A22)

down to a leaf of at most ``LEAF`` columns that the BLAS/LAPACK routine solves. At
tile 512 with leaves of 64 columns, seven eighths of a trsm's flops are gemm's. The
halves are cut at multiples of 16 elements (aligned for the BLAS's vector loads).

The functions are ``numba.njit(nogil=True)`` and call themselves (numba compiles the
recursion into one function); the leaves are the jitted BLAS calls of
:mod:`.cholesky`, given by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
from numba.extending import register_jitable

LEAF = 16  # trsm: columns at most, solved by the BLAS routine itself
POTRF_LEAF = 64  # potrf: the same for LAPACK (its leaf is a small part of its time)
ALIGN = 16  # halves are cut at multiples of this


@register_jitable
def _half(n):
    """Where to cut ``n`` columns in two: about the middle, at a multiple of ALIGN."""
    h = (n // 2 + ALIGN - 1) // ALIGN * ALIGN
    return h if h < n else n // 2


def make_trsm(trsm_leaf: Callable, gemm_nt: Callable, name: str, leaf: int = LEAF) -> Callable:
    """``b <- b · L⁻ᵀ`` (L: the lower triangle of square ``a``; ``b`` m×k) by halves:
    ``trsm_leaf(a, b)`` does the same on at most ``leaf`` columns, ``gemm_nt(x, y, c)``
    does ``c <- c − x·yᵀ``."""

    def trsm_tile(a, b):
        k = a.shape[0]
        if k <= leaf:
            trsm_leaf(a, b)
            return
        h = _half(k)
        rec(a[:h, :h], b[:, :h])
        gemm_nt(b[:, :h], a[h:, :h], b[:, h:])
        rec(a[h:, h:], b[:, h:])

    trsm_tile.__name__ = trsm_tile.__qualname__ = f"{name}_tile"
    rec = numba.njit(nogil=True)(trsm_tile)  # (the closure's cell: what it calls itself)
    return rec


def make_potrf(
    potrf_leaf: Callable, trsm: Callable, syrk: Callable, name: str, leaf: int = POTRF_LEAF
) -> Callable:
    """``lower(a) <- L`` with ``L Lᵀ = a`` by halves; returns LAPACK's info (the order
    of the first leading minor that is not positive definite, 0 if none).
    ``potrf_leaf(a)``: LAPACK on at most ``leaf`` columns; ``trsm``: as
    :func:`make_trsm` makes; ``syrk(x, c)``: ``lower(c) <- lower(c) − x·xᵀ``."""

    def potrf_tile(a):
        n = a.shape[0]
        if n <= leaf:
            return potrf_leaf(a)
        h = _half(n)
        info = rec(a[:h, :h])
        if info != 0:
            return info
        trsm(a[:h, :h], a[h:, :h])
        syrk(a[h:, :h], a[h:, h:])
        info = rec(a[h:, h:])
        if info != 0:
            return info + h
        return info

    potrf_tile.__name__ = potrf_tile.__qualname__ = f"{name}_rec"
    rec = numba.njit(nogil=True)(potrf_tile)
    return rec
