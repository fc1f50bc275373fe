"""Tile kernels alone: each Cholesky kernel's GFLOP/s against the 1-thread GEMM peak.

    python -m benchmarks.tiles [--quick]

One thread (BLAS held to 1, as a worker runs them), tiles of 256, 512 and 1024
(``--quick``: 512), float64, operands copied fresh before each call (so they sit in
cache, as the best case of a tile that was just written), best of 20 calls. The
baseline is :func:`taskgraph.core.machine.gemm_peak` on 1 thread in the same run; the
ratio says how far each kernel is from it, and so what a tiled Cholesky can reach
when its flops are mostly ``gemm`` and its critical path is ``potrf`` -> ``trsm`` ->
``syrk``.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.common import emit, quick_main
from taskgraph.calibrate import best_seconds
from taskgraph.core.machine import gemm_peak


def measure(tile: int, peak: float) -> dict:
    from taskgraph.kernels import gemm, potrf, syrk, trsm

    rng = np.random.default_rng(0)
    a, b, c = (np.asfortranarray(rng.random((tile, tile))) for _ in range(3))
    spd = np.asfortranarray(a @ a.T + tile * np.eye(tile))
    lower = np.asfortranarray(np.linalg.cholesky(spd))
    flops = {"gemm": 2 * tile**3, "syrk": tile**3, "trsm": tile**3, "potrf": tile**3 / 3}
    seconds = {
        "gemm": best_seconds(gemm, [a, b, c], 20),
        "syrk": best_seconds(syrk, [a, c], 20),
        "trsm": best_seconds(trsm, [lower, c], 20),
        "potrf": best_seconds(potrf, [spd], 20),
    }
    result: dict = {"benchmark": "tiles", "tile": tile, "dtype": "float64", "threads": 1}
    result["gemm_peak_gflops"] = round(peak, 2)
    for name, s in seconds.items():
        result[f"{name}_gflops"] = round(flops[name] / s / 1e9, 2)
        result[f"{name}_fraction_of_peak"] = round(flops[name] / s / 1e9 / peak, 3)
    return emit(result)


def run(quick: bool = False) -> list[dict]:
    import scipy.linalg.blas  # noqa: F401 - loaded before the limit: it covers only
    import taskgraph.kernels  # noqa: F401 - the BLAS libraries loaded at that moment

    with threadpool_limits(limits=1, user_api="blas"):
        peak = gemm_peak(1)
        return [measure(t, peak) for t in ((512,) if quick else (256, 512, 1024))]


def main(argv=None) -> None:
    quick_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
