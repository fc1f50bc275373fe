"""Tiled QR against scipy.linalg.qr and numpy.linalg.qr, in the same run.

    python -m benchmarks.qr [--quick] [--n N ...] [--configs TILE/IB,...]

Per n (a fresh process each, so that one size's memory does not weigh on the next):
``taskgraph.linalg.qr`` on one rank with 2 workers (1 BLAS thread each), for every
(tile, ib) asked, best of 2; ``scipy.linalg.qr(mode="raw")`` and ``numpy.linalg.qr
(mode="raw")`` (LAPACK's geqrf alone, as the tiled QR: no Q formed) on 2 BLAS threads
(threadpoolctl), best of 2, and scipy again on 1 thread (``vs_scipy_any_threads`` is
against the better of the two: threaded OpenBLAS collapses on a busy machine); and
the DGEMM peak on 2 threads measured in the same process before and after (the best
counts, as in ``taskgraph demo``). GFLOP/s are of the conventional 4/3 n³;
``vs_scipy`` and ``vs_numpy`` are for the best (tile, ib).
The residual ‖QᵀA − R‖ is not checked here: tests/test_qr.py does that.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from benchmarks import common

THREADS = 2  # the baselines' BLAS threads and taskgraph's workers
REPEAT = 2
TIMEOUT = 1800
SIZES = (2048, 4096, 8192)
QUICK_SIZES = (512, 1024)
CONFIGS = ((256, 32), (512, 32), (512, 64))  # (tile, ib)
QUICK_CONFIGS = ((128, 32), (256, 32))
TARGET_VS_SCIPY = 1.2  # at n = 8192


def taskgraph_seconds(cluster, a: np.ndarray, tile: int, ib: int) -> float:
    """Best of REPEAT tiled QRs of ``a`` (each on a fresh copy) on ``cluster``."""
    from taskgraph.cluster.jobrun import compile_kernels
    from taskgraph.dsl.tiled import TiledMatrix
    from taskgraph.linalg import qr, qr_workspace

    best = math.inf
    for _ in range(REPEAT):
        A = TiledMatrix.from_numpy(a, tile, cluster=cluster, name="A")
        T = qr_workspace(A, ib)
        graph = qr(A, T, ib)
        compile_kernels(graph)
        best = min(best, cluster.run(graph).wait().seconds)
        del A, T, graph
    return best


def baseline_seconds(kind: str, a: np.ndarray, threads: int = THREADS) -> float:
    """Best of REPEAT geqrf's through scipy or numpy on ``threads`` BLAS threads."""
    import scipy.linalg
    from threadpoolctl import threadpool_limits

    best = math.inf
    with threadpool_limits(limits=threads, user_api="blas"):
        for _ in range(REPEAT):
            work = a.copy(order="F")
            t0 = time.perf_counter()
            if kind == "scipy":
                scipy.linalg.qr(work, mode="raw", overwrite_a=True, check_finite=False)
            else:
                np.linalg.qr(work, mode="raw")
            best = min(best, time.perf_counter() - t0)
    return best


def blas() -> str:
    """The BLAS that SciPy and NumPy use here (threadpoolctl's view)."""
    from threadpoolctl import threadpool_info

    libs = [
        f"{i['internal_api']} {i['version']}" for i in threadpool_info() if i["user_api"] == "blas"
    ]
    return ", ".join(sorted(set(libs)))


def measure(n: int, configs: list[tuple[int, int]]) -> dict:
    """Every measurement at n in this process: the result line for n."""
    from taskgraph.batch.demo import fraction_of_peak, node_peak
    from taskgraph.cluster.job import JobCluster
    from taskgraph.linalg import qr_flops

    a = np.asfortranarray(np.random.default_rng(n).standard_normal((n, n)))
    peak = node_peak(THREADS, np.float64)
    cluster = JobCluster(workers=THREADS)
    runs = {f"{t}/{ib}": taskgraph_seconds(cluster, a, t, ib) for t, ib in configs if t < n}
    scipy_s = baseline_seconds("scipy", a)
    numpy_s = baseline_seconds("numpy", a)
    scipy_1 = baseline_seconds("scipy", a, threads=1)  # threaded OpenBLAS can collapse when busy
    peak = max(peak, node_peak(THREADS, np.float64))
    gflops = {k: qr_flops(n, n) / s / 1e9 for k, s in runs.items()}
    best = max(gflops, key=gflops.__getitem__)
    scipy_g, numpy_g = (qr_flops(n, n) / s / 1e9 for s in (scipy_s, numpy_s))
    fraction, noisy = fraction_of_peak(gflops[best], peak)
    tile, ib = map(int, best.split("/"))
    result = {
        "benchmark": "qr",
        "n": n,
        "dtype": "float64",
        "ranks": 1,
        "workers_per_rank": THREADS,
        "taskgraph_gflops": round(gflops[best], 2),
        "tile": tile,
        "ib": ib,
        "gflops_by_tile_ib": {k: round(g, 2) for k, g in gflops.items()},
        "scipy_gflops": round(scipy_g, 2),
        "numpy_gflops": round(numpy_g, 2),
        "baseline_blas_threads": THREADS,
        "scipy_1_thread_gflops": round(qr_flops(n, n) / scipy_1 / 1e9, 2),
        "gemm_peak_gflops": round(peak, 2),
        "fraction_of_peak": None if fraction is None else round(fraction, 3),
        "peak_error": noisy,
        "vs_scipy": round(gflops[best] / scipy_g, 3),
        "vs_numpy": round(gflops[best] / numpy_g, 3),
        "vs_scipy_any_threads": round(
            gflops[best] * min(scipy_s, scipy_1) * 1e9 / qr_flops(n, n), 3
        ),
        "blas": blas(),
    }
    if n == 8192:
        ok = result["vs_scipy"] >= TARGET_VS_SCIPY
        result["target_vs_scipy"] = {"target": TARGET_VS_SCIPY, "ok": ok}
    return result


def run(
    quick: bool = False,
    sizes: tuple[int, ...] | None = None,
    configs: tuple[tuple[int, int], ...] | None = None,
) -> list[dict]:
    """The suite: one fresh process per n, each result printed as a JSON line."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    configs = configs or (QUICK_CONFIGS if quick else CONFIGS)
    out = []
    for n in sizes:
        cmd = common.python("-m", "benchmarks.qr", "--one", str(n))
        cmd += ["--configs", ",".join(f"{t}/{ib}" for t, ib in configs)]
        out.append(common.emit(common.last_json(cmd, timeout=TIMEOUT, env=common.job_env())))
    return out


def _configs(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(t), int(ib)) for t, ib in (c.split("/") for c in text.split(",")))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 512 and 1024, in a minute")
    p.add_argument("--n", type=int, nargs="+", help="matrix orders (default 2048 4096 8192)")
    p.add_argument("--configs", type=_configs, help="tile/ib pairs, e.g. 256/32,512/64")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one n, in this process
    args = p.parse_args(argv)
    if args.one:
        configs = args.configs or (QUICK_CONFIGS if args.quick else CONFIGS)
        print(json.dumps(measure(args.one, list(configs))), flush=True)
        return
    t0 = time.perf_counter()
    run(args.quick, tuple(args.n) if args.n else None, args.configs)
    print(f"# qr suite took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
