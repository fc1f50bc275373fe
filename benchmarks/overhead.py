"""Scheduler overhead: empty ``@tg.task`` graphs against dask's schedulers, same run.

    python -m benchmarks.overhead [--quick]

Three graph shapes of 20,000, 50,000 and 100,000 tasks (``--quick``: 20,000) whose
functions do nothing: ``independent`` (no edges), ``chain`` (each task takes the
previous one's value) and ``tree`` (a binary reduction: leaves return a number, each
inner task adds two values). Every shape runs

- on 1 rank, in this process (``tg.JobCluster(workers=1)``; and at 50,000 tasks
  also with 2 workers, the default on 2 cores), and
- on 2 ranks, in an ``mpiexec`` job of 2 ranks (1 worker each) that this module
  starts itself; it prints its figures as JSON and this process collects them.

Figures per task: build (recording the graph), plan (``make_plan`` + ``for_rank``)
and run (``run.seconds``: executing, tracing on as by default; the slowest rank on
2 ranks), best of the repeats, and tasks/s of the run.

Baselines, measured in this run on this machine on the same shapes: dask's
synchronous scheduler (``dask.get``) and threaded scheduler (``dask.threaded.get``,
2 threads) on the same graph as a dask dict (timed: the ``get`` call alone; the dict
is built, and converted to dask's task objects where dask has them, beforehand), and
a plain Python loop doing the same calls. Ratios: ``vs_dask_threaded`` and
``vs_dask_sync`` are dask's µs/task over ours (higher is better), ``vs_python_call``
is ours over the plain call. ``overhead_targets``: ≤ 10 µs/task on 1 rank and ≥ 5x
less than dask's threaded scheduler.
"""

from __future__ import annotations

import argparse
import json
import time

import taskgraph as tg
from benchmarks.common import emit, job_env, machine, oversubscribed
from taskgraph.core import config

SHAPES = ("independent", "chain", "tree")
FULL, QUICK = (20_000, 50_000, 100_000), (20_000,)
TARGET_US, TARGET_VS_DASK = 10.0, 5.0


def empty():
    return None


def step(x):
    return None


def leaf(i):
    return i


def add(a, b):
    return a + b


def build(shape: str, n: int, call=None, step_=None, add_=None) -> list:
    """The shape as calls of the given functions; returns the sinks."""
    if shape == "independent":
        return [call() for _ in range(n)]
    if shape == "chain":
        x = call()
        for _ in range(n - 1):
            x = step_(x)
        return [x]
    level = [call(i) for i in range((n + 1) // 2)]
    while len(level) > 1:
        pairs = [add_(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = pairs + level[len(level) - len(level) % 2 :]
    return level


def ntasks(shape: str, n: int) -> int:
    return 2 * ((n + 1) // 2) - 1 if shape == "tree" else n


def tg_graph(shape: str, n: int) -> tg.Graph:
    first = tg.task(leaf if shape == "tree" else empty)
    with tg.Graph(f"{shape} {n}") as g:
        build(shape, n, first, tg.task(step), tg.task(add))
    return g


def python_call_us(shape: str, n: int) -> float:
    """The same calls in a plain Python loop: µs per call."""
    first = leaf if shape == "tree" else empty
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        build(shape, n, first, step, add)
        best = min(best, time.perf_counter() - t0)
    return best / ntasks(shape, n) * 1e6


def measure_tg(cluster, shape: str, n: int) -> dict:
    """One build, plan and run; seconds of each (the run: slowest rank)."""
    t0 = time.perf_counter()
    g = tg_graph(shape, n)
    t1 = time.perf_counter()
    plan = tg.make_plan(g, cluster.size)
    plan.for_rank(cluster.rank)
    t2 = time.perf_counter()
    cluster.barrier()
    run = cluster.run(g, plan=plan).wait()
    seconds = max(cluster.world.allgather(run.seconds))
    return {"build": t1 - t0, "plan": t2 - t1, "run": seconds}


def best_of(samples: list[dict]) -> dict:
    return {k: min(s[k] for s in samples) for k in samples[0]}


def per_task(best: dict, tasks: int) -> dict:
    us = {f"{k}_us_per_task": round(v / tasks * 1e6, 3) for k, v in best.items()}
    us["tasks_per_second"] = round(tasks / best["run"])
    return us


# -- dask -------------------------------------------------------------------------------


def dask_graph(shape: str, n: int) -> tuple[dict, list]:
    """The same shape as a dask graph (converted to dask's task objects when it can)."""
    names = iter(range(2 * n))
    dsk: dict = {}

    def node(fn):
        def call(*deps):
            key = (shape, next(names))
            dsk[key] = (fn, *deps)
            return key

        return call

    first = node(leaf if shape == "tree" else empty)
    sinks = build(shape, n, first, node(step), node(add))
    try:  # time the scheduler, not dask's conversion of old-style tuples
        from dask._task_spec import convert_legacy_graph

        return convert_legacy_graph(dsk), sinks
    except ImportError:
        return dsk, sinks


def measure_dask(shape: str, n: int) -> dict:
    import dask
    import dask.threaded

    dsk, keys = dask_graph(shape, n)
    t0 = time.perf_counter()
    dask.get(dsk, keys)
    t1 = time.perf_counter()
    dsk, keys = dask_graph(shape, n)
    t2 = time.perf_counter()
    dask.threaded.get(dsk, keys, num_workers=2)
    t3 = time.perf_counter()
    return {"sync": t1 - t0, "threaded": t3 - t2}


# -- runs -------------------------------------------------------------------------------


def repeats_for(n: int) -> int:
    return 3 if n <= 50_000 else 2


def one_rank(shape: str, n: int, workers: int = 1) -> tuple[dict, dict]:
    """Ours on 1 rank and dask, alternating: best per-task figures of each."""
    cluster = tg.JobCluster(workers=workers)
    ours, theirs = [], []
    measure_tg(cluster, shape, 1000)  # warm
    for _ in range(repeats_for(n)):
        ours.append(measure_tg(cluster, shape, n))
        theirs.append(measure_dask(shape, n))
    tasks = ntasks(shape, n)
    dask_us = {k: v / tasks * 1e6 for k, v in best_of(theirs).items()}
    return per_task(best_of(ours), tasks) | {"workers": workers}, dask_us


def ranks_child(sizes: list[int]) -> None:
    """Inside the 2-rank job: every shape and size; rank 0 prints one JSON line each."""
    cluster = tg.Cluster()
    for shape in SHAPES:
        measure_tg(cluster, shape, 1000)  # warm
        for n in sizes:
            best = best_of([measure_tg(cluster, shape, n) for _ in range(repeats_for(n))])
            if cluster.rank == 0:
                out = {"shape": shape, "n": n, "workers": cluster.workers}
                print(json.dumps(out | per_task(best, ntasks(shape, n))), flush=True)


def two_ranks(sizes: list[int]) -> dict[tuple[str, int], dict]:
    """Start the 2-rank job and collect its figures by (shape, n)."""
    from taskgraph.cluster.launch import run_ranks

    env = job_env()
    argv = ["-m", "benchmarks.overhead", "--child", *map(str, sizes)]
    proc = run_ranks(2, argv, timeout=1200, capture=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"2-rank job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r.pop("shape"), r.pop("n")): r for r in rows}


def result(shape: str, n: int, ranks: int, ours: dict, dask_us: dict, call_us: float) -> dict:
    run_us = ours["run_us_per_task"]
    workers = ours.pop("workers", 1)
    return emit(
        {
            "benchmark": "overhead",
            "shape": shape,
            "tasks": ntasks(shape, n),
            "ranks": ranks,
            "workers_per_rank": workers,
            "oversubscribed": oversubscribed(ranks, workers),
            **ours,
            "dask_sync_us_per_task": round(dask_us["sync"], 3),
            "dask_threaded_us_per_task": round(dask_us["threaded"], 3),
            "python_call_us": round(call_us, 4),
            "vs_dask_threaded": round(dask_us["threaded"] / run_us, 2),
            "vs_dask_sync": round(dask_us["sync"] / run_us, 2),
            "vs_python_call": round(run_us / call_us, 1),
        }
    )


def targets(results: list[dict]) -> dict:
    one = [r for r in results if r["ranks"] == 1 and r["workers_per_rank"] == 1]
    two_workers = [r for r in results if r["ranks"] == 1 and r["workers_per_rank"] == 2]
    worst_us = max(r["run_us_per_task"] for r in one)
    least_vs = min(r["vs_dask_threaded"] for r in one)
    return emit(
        {
            "benchmark": "overhead_targets",
            "target_run_us_per_task_1rank": TARGET_US,
            "worst_run_us_per_task_1rank": worst_us,
            "target_vs_dask_threaded": TARGET_VS_DASK,
            "least_vs_dask_threaded_1rank": least_vs,
            "worst_run_us_per_task_1rank_2workers": max(
                (r["run_us_per_task"] for r in two_workers), default=None
            ),
            "least_vs_dask_threaded_2ranks": min(
                (r["vs_dask_threaded"] for r in results if r["ranks"] == 2), default=None
            ),
            "met": worst_us <= TARGET_US and least_vs >= TARGET_VS_DASK,
            "machine": machine(),
        }
    )


def run(quick: bool = False) -> list[dict]:
    sizes = list(QUICK if quick else FULL)
    results, dask_figures = [], {}
    for shape in SHAPES:
        for n in sizes:
            ours, dask_us = one_rank(shape, n)
            dask_figures[shape, n] = dask_us
            results.append(result(shape, n, 1, ours, dask_us, python_call_us(shape, n)))
        n = sizes[min(1, len(sizes) - 1)]  # 50,000 (--quick: 20,000) on 2 workers
        ours, dask_us = one_rank(shape, n, workers=2)
        results.append(result(shape, n, 1, ours, dask_us, python_call_us(shape, n)))
    for (shape, n), ours in two_ranks(sizes).items():
        call_us = python_call_us(shape, n)
        results.append(result(shape, n, 2, ours, dask_figures[shape, n], call_us))
    return results + [targets(results)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 tasks per shape only")
    p.add_argument("--child", type=int, nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if not config.use_mpi():
            raise SystemExit("--child runs inside the 2-rank job")
        ranks_child(args.child)
        return
    run(quick=args.quick)


if __name__ == "__main__":
    main()
