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


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict:
    """A short description of this machine, for benchmark output."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": config.cores(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }
