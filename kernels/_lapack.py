"""The BLAS and LAPACK routines the tile kernels call, as ctypes function pointers.

SciPy exports its BLAS/LAPACK through Cython: ``scipy.linalg.cython_blas`` and
``scipy.linalg.cython_lapack`` each publish a ``__pyx_capi__`` dict of PyCapsules,
one per routine, whose pointer is a C function taking every argument by pointer
(``char*``, ``int*``, ``float*``/``double*``). These are Cython wrappers, so there
are no hidden Fortran string-length arguments. Using them means the kernels run on
the very BLAS that SciPy ships, with nothing to find or link at install time.

Each routine is bound here as a ``ctypes.CFUNCTYPE`` whose arguments are all
``c_void_p``. numba compiles calls to such objects into direct calls through the
function pointer (no GIL, no Python), and plain Python can call them too, which is
what lets the ``py_func`` of a jitted kernel run unchanged. The argument count of
each prototype is checked against the signature that Cython stores as the capsule's
name, so a SciPy that changed a routine fails loudly at import rather than at run time.
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

from scipy.linalg import cython_blas, cython_lapack

__all__ = [
    "address", "dgemm", "sgemm", "dsyrk", "ssyrk", "dtrsm", "strsm", "dpotrf", "spotrf",
    "QR_ROUTINES",
]  # fmt: skip

# Private prototypes, so that the shared ctypes.pythonapi attributes stay untouched.
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _capsule(module: ModuleType, name: str) -> tuple[object, bytes]:
    try:
        cap = module.__pyx_capi__[name]
    except KeyError:
        raise ImportError(f"{module.__name__} does not export {name}") from None
    return cap, _capsule_name(cap)


def address(module: ModuleType, name: str) -> int:
    """The address of routine ``name`` exported by a Cython module's ``__pyx_capi__``."""
    cap, signature = _capsule(module, name)
    return _capsule_pointer(cap, signature)


def _bind(module: ModuleType, name: str, nargs: int) -> ctypes._CFuncPtr:
    """``name`` as a C function of ``nargs`` pointer arguments returning nothing."""
    _, signature = _capsule(module, name)
    params = signature[signature.index(b"(") + 1 : signature.rindex(b")")]
    if params.count(b",") + 1 != nargs or params.count(b"*") != nargs:
        raise ImportError(
            f"{module.__name__}.{name} has signature {signature.decode()!r}, "
            f"expected {nargs} pointer arguments"
        )
    prototype = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs))
    return prototype(address(module, name))


# ?gemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
dgemm = _bind(cython_blas, "dgemm", 13)
sgemm = _bind(cython_blas, "sgemm", 13)
# ?syrk(uplo, trans, n, k, alpha, a, lda, beta, c, ldc)
dsyrk = _bind(cython_blas, "dsyrk", 10)
ssyrk = _bind(cython_blas, "ssyrk", 10)
# ?trsm(side, uplo, transa, diag, m, n, alpha, a, lda, b, ldb)
dtrsm = _bind(cython_blas, "dtrsm", 11)
strsm = _bind(cython_blas, "strsm", 11)
# ?potrf(uplo, n, a, lda, info)
dpotrf = _bind(cython_lapack, "dpotrf", 5)
spotrf = _bind(cython_lapack, "spotrf", 5)

# The tile-QR routines, for every prefix (s, d, c, z), by name ("dgeqrt", ...):
# ?geqrt(m, n, nb, a, lda, t, ldt, work, info)
# ?gemqrt(side, trans, m, n, k, nb, v, ldv, t, ldt, c, ldc, work, info)
# ?tpqrt(m, n, l, nb, a, lda, b, ldb, t, ldt, work, info)
# ?tpmqrt(side, trans, m, n, k, l, nb, v, ldv, t, ldt, a, lda, b, ldb, work, info)
_QR_NARGS = {"geqrt": 9, "gemqrt": 14, "tpqrt": 12, "tpmqrt": 17}
QR_ROUTINES: dict[str, Any] = {
    p + op: _bind(cython_lapack, p + op, nargs) for op, nargs in _QR_NARGS.items() for p in "sdcz"
}
