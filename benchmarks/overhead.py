"""Scheduler overhead: N empty ``@tg.task`` calls on one rank, against a Python call.

    python -m benchmarks.overhead [--tasks 20000] [--workers 1] [--shape independent|chain]

Prints one JSON object: microseconds per task to build, to plan and to run the
graph, and the run cost as a multiple of calling the same empty function in a plain
Python loop (the baseline, measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import time

import taskgraph as tg
from taskgraph.machine import describe


def empty():
    return None


def build(n: int, shape: str) -> tg.Graph:
    fn = tg.task(empty) if shape == "independent" else tg.task(lambda x=None: None)
    with tg.Graph(f"{n} empty tasks") as g:
        if shape == "independent":
            for _ in range(n):
                fn()
        else:
            x = fn()
            for _ in range(n - 1):
                x = fn(x)
    return g


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shape", choices=("independent", "chain"), default="independent")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    n = args.tasks

    t0 = time.perf_counter()
    for _ in range(n):
        empty()
    baseline = (time.perf_counter() - t0) / n

    cluster = tg.Cluster(workers=args.workers)
    best = {"build": 1e9, "plan": 1e9, "run": 1e9}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        g = build(n, args.shape)
        t1 = time.perf_counter()
        plan = tg.make_plan(g, 1)
        plan.for_rank(0)
        t2 = time.perf_counter()
        run = cluster.run(g).wait()
        best["build"] = min(best["build"], t1 - t0)
        best["plan"] = min(best["plan"], t2 - t1)
        best["run"] = min(best["run"], run.seconds)
    us = {k: v / n * 1e6 for k, v in best.items()}
    result = {
        "benchmark": "scheduler_overhead",
        "tasks": n,
        "shape": args.shape,
        "ranks": 1,
        "workers": args.workers,
        "build_us_per_task": round(us["build"], 2),
        "plan_us_per_task": round(us["plan"], 2),
        "run_us_per_task": round(us["run"], 2),
        "python_call_us": round(baseline * 1e6, 3),
        "run_vs_python_call": round(us["run"] / (baseline * 1e6), 1),
        "tasks_per_second": round(n / best["run"]),
        "machine": describe(),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
