"""The DAGuE micro-benchmark: Nb independent N x N DGEMM tasks on 1 rank, 2 workers.

    python -m benchmarks.micro [--quick]

For N in 16, 32, 64, 128, 256 (``--quick``: 16, 64, 256), Nb independent tasks
``C_i -= A_i B_iᵀ`` (the built-in ``taskgraph.kernels.gemm``), each on tiles of its
own: three (Nb·N) x N ``TiledMatrix`` with tile N. Nb is chosen so that the
sequential time is about 0.75 s (``--quick``: 0.2 s), within a cap on the operands'
memory (1.5 GiB; ``--quick``: 512 MiB) and on the task count (150,000; 50,000), so
the smallest sizes run for less; ``seq_seconds`` says how long they ran.

Baseline, in the same run on the same tiles, alternating with ours: the same kernel
function (``gemm.fn``, what a task calls) in a plain Python loop over the tiles, on
one core with BLAS on one thread. The ideal on 2 workers is that time ÷ 2 (the
cores); ``efficiency`` = ideal ÷ measured (``run.seconds``, best of the repeats),
``overhead_us_per_task`` = (2 · measured − sequential) ÷ Nb, the core time each
task cost beyond its kernel. A second baseline says what the machine gives right now
(it is shared): the same loop split over 2 plain Python threads (``threads_seconds``;
the kernel releases the GIL), and ``vs_threads`` = that ÷ measured.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from taskgraph.kernels import gemm
from threadpoolctl import threadpool_limits

import taskgraph as tg
from benchmarks.common import emit, oversubscribed, quick_main

FULL, QUICK = (16, 32, 64, 128, 256), (16, 64, 256)
WORKERS = 2


def limits(quick: bool) -> dict:
    if quick:
        return {"seconds": 0.2, "bytes": 512 << 20, "tasks": 50_000}
    return {"seconds": 0.75, "bytes": 1536 << 20, "tasks": 150_000}


def seconds_per_call(n: int) -> float:
    """One gemm call on N x N tiles (BLAS on one thread), for choosing Nb."""
    a, b, c = (np.asfortranarray(np.full((n, n), 0.5)) for _ in range(3))
    calls = max(5, int(2e7 // n**3))
    with threadpool_limits(limits=1, user_api="blas"):
        gemm.fn(a, b, c)
        t0 = time.perf_counter()
        for _ in range(calls):
            gemm.fn(a, b, c)
    return (time.perf_counter() - t0) / calls


def choose_nb(n: int, lim: dict) -> int:
    by_time = lim["seconds"] / seconds_per_call(n)
    by_memory = lim["bytes"] / (3 * n * n * 8)
    return max(WORKERS, int(min(by_time, by_memory, lim["tasks"])))


def operands(n: int, nb: int, cluster) -> list[tg.TiledMatrix]:
    def make(name: str, value: float) -> tg.TiledMatrix:
        def fill(i, j, shape):
            return value

        return tg.TiledMatrix.from_function((nb * n, n), n, fill, cluster=cluster, name=name)

    return [make("A", 0.5), make("B", 0.25), make("C", 0.0)]


def graph(A, B, C) -> tg.Graph:
    with tg.Graph(f"{A.mt} gemm {A.tile}") as g:
        for i in range(A.mt):
            gemm(A[i, 0].r, B[i, 0].r, C[i, 0].rw)
    return g


def loop(triples: list) -> None:
    fn = gemm.fn
    for a, b, c in triples:
        fn(a, b, c)


def plain(A, B, C, threads: int) -> float:
    """The same calls in plain loops (one per thread, tiles dealt round-robin): seconds."""
    triples = [(A.tiles[i, 0], B.tiles[i, 0], C.tiles[i, 0]) for i in range(A.mt)]
    parts = [triples[k::threads] for k in range(threads)]
    with threadpool_limits(limits=1, user_api="blas"):
        if threads == 1:
            t0 = time.perf_counter()
            loop(triples)
            return time.perf_counter() - t0
        pool = [threading.Thread(target=loop, args=(part,)) for part in parts]
        t0 = time.perf_counter()
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        return time.perf_counter() - t0


def measure(n: int, lim: dict, repeats: int) -> dict:
    cluster = tg.JobCluster(workers=WORKERS, blas_threads=1)
    nb = choose_nb(n, lim)
    A, B, C = operands(n, nb, cluster)
    g = graph(A, B, C)
    plan = tg.make_plan(g, 1)
    tg.compile_kernels(g)
    seq = threads = ours = float("inf")
    plain(A, B, C, 1)  # warm: caches, pages
    for _ in range(repeats):
        seq = min(seq, plain(A, B, C, 1))
        threads = min(threads, plain(A, B, C, WORKERS))
        ours = min(ours, cluster.run(g, plan=plan).wait().seconds)
    return result(n, nb, seq, threads, ours, repeats)


def result(n: int, nb: int, seq: float, threads: float, ours: float, repeats: int) -> dict:
    ideal = seq / WORKERS
    flops = 2.0 * n**3 * nb
    return {
        "benchmark": "micro",
        "n": n,
        "nb": nb,
        "ranks": 1,
        "workers": WORKERS,
        "oversubscribed": oversubscribed(1, WORKERS),
        "operand_mib": round(3 * nb * n * n * 8 / 2**20, 1),
        "repeats": repeats,
        "seq_seconds": round(seq, 4),
        "ideal_seconds": round(ideal, 4),
        "seconds": round(ours, 4),
        "efficiency": round(ideal / ours, 3),
        "threads_seconds": round(threads, 4),
        "vs_threads": round(threads / ours, 3),
        "task_us": round(seq / nb * 1e6, 2),
        "overhead_us_per_task": round((WORKERS * ours - seq) / nb * 1e6, 2),
        "gflops": round(flops / ours / 1e9, 2),
        "seq_gflops": round(flops / seq / 1e9, 2),
    }


def run(quick: bool = False) -> list[dict]:
    lim = limits(quick)
    return [emit(measure(n, lim, 3)) for n in (QUICK if quick else FULL)]


def main(argv=None) -> None:
    quick_main(run, __doc__, argv, help="N = 16, 64, 256 and ~0.2 s each")


if __name__ == "__main__":
    main()
