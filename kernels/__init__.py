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


def _declare(module, name: str, modes: str, dims: str, dtypes, flops) -> Kernel:
    """The built-in kernel ``module.<name>``, compiled by ``module.compile_op``."""

    def compile(dtype: np.dtype) -> None:
        module.compile_op(name, dtype)

    fn = getattr(module, name)
    return Kernel(fn, name=name, modes=modes, dims=dims, dtypes=dtypes, flops=flops,
                  compile=compile, nogil=True)  # fmt: skip


potrf = _declare(cholesky, "potrf", "rw", "nn", _DTYPES, lambda n: n**3 / 3)
trsm = _declare(cholesky, "trsm", "r,rw", "kk,mk", _DTYPES, lambda m, k: m * k * k)
syrk = _declare(cholesky, "syrk", "r,rw", "mk,mm", _DTYPES, lambda m, k: m * m * k)
gemm = _declare(cholesky, "gemm", "r,r,rw", "mk,nk,mn", _DTYPES, lambda m, n, k: 2 * m * n * k)

CHOLESKY_KERNELS = (potrf, trsm, syrk, gemm)

_QR_DTYPES = tuple(d.name for d in qr.DTYPES)

# Tile QR (see kernels/qr.py for what each does); T tiles have >= ib rows ("x")
geqrt = _declare(
    qr, "geqrt", "rw,w,int", "mn,xn,", _QR_DTYPES, lambda m, n, x: 2 * n * n * (m - n / 3)
)
gemqrt = _declare(
    qr, "gemqrt", "r,r,rw,int", "mk,xk,mn,", _QR_DTYPES,
    lambda m, k, x, n: 4 * m * n * k - 2 * n * k * k,
)  # fmt: skip
tpqrt = _declare(
    qr, "tpqrt", "rw,rw,w,int", "an,mn,xn,", _QR_DTYPES, lambda a, n, m, x: 2 * m * n * n
)
tpmqrt = _declare(
    qr, "tpmqrt", "r,r,rw,rw,int", "mk,xk,an,mn,", _QR_DTYPES,
    lambda m, k, x, a, n: 4 * m * n * k,
)  # fmt: skip

QR_KERNELS = (geqrt, gemqrt, tpqrt, tpmqrt)


def compile_all(dtypes: Sequence = ("float64",)) -> dict[str, float]:
    """Compile every built-in kernel for ``dtypes``; return seconds per kernel and "total".

    Kernels already compiled for a dtype cost next to nothing the second time.
    """
    t0 = time.perf_counter()
    seconds = {k.name: k.compile(dtypes) for k in CHOLESKY_KERNELS}
    seconds["total"] = time.perf_counter() - t0
    return seconds
