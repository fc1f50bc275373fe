"""Built-in tile kernels: those of a lower tiled Cholesky factorisation and of a tile QR.

Each public name is a :class:`taskgraph.dsl.kernel.Kernel`: called on NumPy tiles it runs
at once; called on tile accesses inside ``with tg.Graph():`` it records a task. The
numerics live in :mod:`.cholesky` and :mod:`.qr` (jitted inner functions calling SciPy's BLAS and
LAPACK without the GIL, behind validating wrappers); this module only declares them,
each ``nogil=True`` (a wrapper's own Python is short beside the call it makes).

Tiles are column-major (Fortran-ordered) float32 or float64 arrays (the QR kernels
take complex64 and complex128 too), or strided column-major views of one. The QR
kernels take the inner block size ``ib`` as a last, scalar argument. The kernels
know nothing of ranks or MPI.

Compilation is eager and explicit: :func:`compile_all` (or ``kernel.compile``)
compiles each kernel for the given dtypes, so that the first task does not pay for
it. A kernel that was not compiled compiles itself on its first call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from taskgraph.dsl.kernel import Kernel

from . import cholesky, qr

__all__ = [
    "potrf", "trsm", "syrk", "gemm", "CHOLESKY_KERNELS",
    "geqrt", "gemqrt", "tpqrt", "tpmqrt", "QR_KERNELS",
    "compile_all",
]  # fmt: skip

_DTYPES = ("float32", "float64")


def _compiler(op: str):
    def compile(dtype: np.dtype) -> None:
        cholesky.compile_op(op, dtype)

    return compile


potrf = Kernel(
    cholesky.potrf,
    name="potrf",
    modes="rw",
    dims="nn",
    dtypes=_DTYPES,
    flops=lambda n: n**3 / 3,
    compile=_compiler("potrf"),
    nogil=True,
)

trsm = Kernel(
    cholesky.trsm,
    name="trsm",
    modes="r,rw",
    dims="kk,mk",
    dtypes=_DTYPES,
    flops=lambda m, k: m * k * k,
    compile=_compiler("trsm"),
    nogil=True,
)

syrk = Kernel(
    cholesky.syrk,
    name="syrk",
    modes="r,rw",
    dims="mk,mm",
    dtypes=_DTYPES,
    flops=lambda m, k: m * m * k,
    compile=_compiler("syrk"),
    nogil=True,
)

gemm = Kernel(
    cholesky.gemm,
    name="gemm",
    modes="r,r,rw",
    dims="mk,nk,mn",
    dtypes=_DTYPES,
    flops=lambda m, n, k: 2 * m * n * k,
    compile=_compiler("gemm"),
    nogil=True,
)

CHOLESKY_KERNELS = (potrf, trsm, syrk, gemm)


def _qr_compiler(op: str):
    def compile(dtype: np.dtype) -> None:
        qr.compile_op(op, dtype)

    return compile


_QR_DTYPES = tuple(d.name for d in qr.DTYPES)

# Tile QR (see kernels/qr.py for what each does); T tiles have >= ib rows ("x")
geqrt = Kernel(
    qr.geqrt,
    name="geqrt",
    modes="rw,w,int",
    dims="mn,xn,",
    dtypes=_QR_DTYPES,
    flops=lambda m, n, x: 2 * n * n * (m - n / 3),
    compile=_qr_compiler("geqrt"),
    nogil=True,
)

gemqrt = Kernel(
    qr.gemqrt,
    name="gemqrt",
    modes="r,r,rw,int",
    dims="mk,xk,mn,",
    dtypes=_QR_DTYPES,
    flops=lambda m, k, x, n: 4 * m * n * k - 2 * n * k * k,
    compile=_qr_compiler("gemqrt"),
    nogil=True,
)

tpqrt = Kernel(
    qr.tpqrt,
    name="tpqrt",
    modes="rw,rw,w,int",
    dims="an,mn,xn,",
    dtypes=_QR_DTYPES,
    flops=lambda a, n, m, x: 2 * m * n * n,
    compile=_qr_compiler("tpqrt"),
    nogil=True,
)

tpmqrt = Kernel(
    qr.tpmqrt,
    name="tpmqrt",
    modes="r,r,rw,rw,int",
    dims="mk,xk,an,mn,",
    dtypes=_QR_DTYPES,
    flops=lambda m, k, x, a, n: 4 * m * n * k,
    compile=_qr_compiler("tpmqrt"),
    nogil=True,
)

QR_KERNELS = (geqrt, gemqrt, tpqrt, tpmqrt)


def compile_all(dtypes: Sequence = ("float64",)) -> dict[str, float]:
    """Compile every built-in kernel for ``dtypes``; return seconds per kernel and "total".

    Kernels already compiled for a dtype cost next to nothing the second time.
    """
    t0 = time.perf_counter()
    seconds = {k.name: k.compile(dtypes) for k in CHOLESKY_KERNELS}
    seconds["total"] = time.perf_counter() - t0
    return seconds
