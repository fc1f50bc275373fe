"""Size of graphs: build and plan 10^5 and 10^6 tasks; seconds and bytes per task.

    python -m benchmarks.graphsize [--quick]

Two shapes: ``@tg.task`` futures (a chain fanned over 64 independent starts), and the
tiled Cholesky task flow (tile 1 x 1 so no real data is allocated; dependencies as in
any Cholesky). Time is build (recording the calls) + plan (placement, priorities,
messages for 2 ranks, and one rank's plan), the best of 2 passes. Memory is what the
graph and plan keep alive, measured with tracemalloc in a separate pass (tracemalloc
slows Python down).
The baseline is a plain Python call per task, measured in the same run. Targets:
10^6 tasks in at most 10 s, using at most 1 KiB per task.
"""

from __future__ import annotations

import gc
import math
import time
import tracemalloc
import types

import taskgraph.kernels  # imported before timing: numba's import is not graph building

import taskgraph as tg
from taskgraph.linalg import cholesky

from .common import emit, quick_main

KIB = 1024


def futures_graph(n: int) -> tg.Graph:
    @tg.task
    def step(*xs):
        return None

    with tg.Graph("futures") as g:
        prev = [step() for _ in range(64)]
        for i in range(n - 64):
            prev.append(step(prev[i]))
    return g


def cholesky_graph(n: int) -> tg.Graph:
    nt = 1
    while (nt + 1) ** 3 / 6 + (nt + 1) ** 2 < n:
        nt += 1
    fake = types.SimpleNamespace(rank=-1, size=2)  # plan for 2 ranks; allocate no tiles
    A = tg.TiledMatrix((nt, nt), 1, lower=True, cluster=fake)
    return cholesky(A)


SHAPES = {"futures": futures_graph, "cholesky": cholesky_graph}


def build_and_plan(shape: str, n: int):
    t0 = time.perf_counter()
    g = SHAPES[shape](n)
    t1 = time.perf_counter()
    plan = tg.make_plan(g, 2)
    rank0 = plan.for_rank(0)
    t2 = time.perf_counter()
    return g, plan, rank0, t1 - t0, t2 - t1


def measure(shape: str, n: int, repeats: int = 2) -> dict:
    best = (float("inf"), 0.0, 0.0)
    for _ in range(repeats):  # the best of the repeats, as every suite here reports
        gc.collect()
        g, plan, rank0, build, planning = build_and_plan(shape, n)
        ntasks = g.ntasks
        best = min(best, (build + planning, build, planning))
        del g, plan, rank0
    _, build, planning = best
    gc.collect()
    tracemalloc.start()
    kept = build_and_plan(shape, n)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept
    t0 = time.perf_counter()
    for _ in range(ntasks):
        math.fabs(1.0)
    call = (time.perf_counter() - t0) / ntasks
    total = build + planning
    return emit(
        {
            "benchmark": "graphsize",
            "shape": shape,
            "size": n,  # asked for; a Cholesky graph has the nearest count below it
            "tasks": ntasks,
            "repeats": repeats,
            "build_s": round(build, 2),
            "plan_s": round(planning, 2),
            "total_s": round(total, 2),
            "us_per_task": round(1e6 * total / ntasks, 2),
            "bytes_per_task": round(held / ntasks),
            "peak_bytes_per_task": round(peak / ntasks),
            "python_call_us": round(1e6 * call, 3),
            "vs_python_call": round(total / ntasks / call, 1),
            "target_ok": n < 10**6 or (total <= 10 and held / ntasks <= KIB),
        }
    )


def run(quick: bool = False) -> list[dict]:
    sizes = [10**5] if quick else [10**5, 10**6]
    return [measure(shape, n) for n in sizes for shape in SHAPES]


def main(argv=None) -> None:
    quick_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
