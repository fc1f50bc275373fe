"""The machine's own limits, measured in the same run: GEMM peak, a description."""

from __future__ import annotations

import os
import platform
import socket
import time

import numpy as np

from . import config


def gemm_peak(threads: int, dtype=np.float64, n: int = 2048, repeats: int = 3) -> float:
    """Best GFLOP/s of an n x n x n GEMM from scipy's BLAS on ``threads`` threads."""
    from scipy.linalg import blas
    from threadpoolctl import threadpool_limits

    dtype = np.dtype(dtype)
    gemm = blas.dgemm if dtype == np.float64 else blas.sgemm
    rng = np.random.default_rng(0)
    a = np.asfortranarray(rng.random((n, n)), dtype=dtype)
    b = np.asfortranarray(rng.random((n, n)), dtype=dtype)
    c = np.zeros((n, n), dtype, order="F")
    best = float("inf")
    with threadpool_limits(limits=threads, user_api="blas"):
        gemm(1.0, a, b, beta=0.0, c=c, overwrite_c=True)  # warm up threads and caches
        for _ in range(repeats):
            t0 = time.perf_counter()
            gemm(1.0, a, b, beta=0.0, c=c, overwrite_c=True)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def vector_isa() -> str:
    """The CPU's widest vector extensions that matter to a BLAS ("avx512 amx", "avx2",
    ...): "Intel Xeon Processor" alone does not tell two VMs apart."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return ""
    have = set(flags)
    isa = "avx512" if "avx512f" in have else "avx2" if "avx2" in have else "sse"
    return isa + (" amx" if "amx_tile" in have else "") if flags else ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas() -> str:
    """The BLAS the tile kernels run on (SciPy's), as threadpoolctl names it: its
    ``internal_api``, version and the CPU kernels it picked, e.g. "openblas 0.3.30
    (SkylakeX)"."""
    import scipy.linalg.cython_blas  # noqa: F401 - loads the library the kernels call
    from threadpoolctl import threadpool_info

    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    mine = [i for i in found if "/scipy" in str(i.get("filepath", ""))] or found
    if not mine:
        return "unknown"
    i = mine[0]
    arch = f" ({i['architecture']})" if i.get("architecture") else ""
    return f"{i.get('internal_api', '?')} {i.get('version', '?')}{arch}"


def describe() -> dict:
    """A short description of this machine, for benchmark output."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "isa": vector_isa(),
        "blas": blas(),
        "cores": config.cores(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }
