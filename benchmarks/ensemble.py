"""Many-task ensembles (issue 23): throughput and utilisation of sleep tasks, a mixed
ensemble with executables and retries, and the launch overhead of executable tasks.

    python -m benchmarks ensemble [--quick]

All on 8 slots: taskgraph in ``mpiexec`` jobs of 2 ranks x 4 workers, started from
this process, as a static graph of ``@tg.task`` calls and as ``run.submit`` calls
(each rank submits its half); against ``ProcessPoolExecutor(8)``, dask (a
``LocalCluster`` of 2 processes x 4 threads, or dask's multiprocessing scheduler with
8 processes where distributed is missing) and Parsl's ``HighThroughputExecutor`` (8
workers). Sleep tasks do not use a core, so 8 slots on a 2-core machine are not
oversubscribed for them (``oversubscribed`` says whether 8 exceeds the cores; it
matters for the 0-ms rows, which measure the runtimes' own CPU).

Rows: ``ensemble_throughput`` (per system and task length: tasks/s and utilisation,
the sum of task times over slots x wall), ``ensemble_mixed`` (2,000 tasks of 1-50 ms:
30 % ``/bin/sleep``, 20 % shell pipelines, 5 % failing once with retries=1; time over
the ideal, the sum of task times over slots), ``ensemble_launch`` (an executable
task's cost against a bare ``subprocess.run`` loop) and ``ensemble_targets``. A
feature missing from this tree reads ``"unavailable (...)"``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks import common

RANKS, WORKERS = 2, 4
SLOTS = RANKS * WORKERS
LENGTHS = (0.0, 0.01, 0.1)  # seconds per sleep task


def sleep_task(seconds: float) -> float:
    """The benchmark's task: sleep ``seconds``."""
    if seconds:
        time.sleep(seconds)
    return seconds


def parsl_sleep(seconds: float) -> float:
    """:func:`sleep_task` for Parsl, which ships a function's code without its module."""
    import time

    if seconds:
        time.sleep(seconds)
    return seconds


def counts(quick: bool) -> dict[float, int]:
    """Tasks per task length."""
    if quick:
        return {0.0: 2000, 0.01: 800, 0.1: 80}
    return {0.0: 10_000, 0.01: 10_000, 0.1: 10_000}


def rate_row(system: str, seconds_each: float, n: int, wall: float, **extra) -> dict:
    return {
        "benchmark": "ensemble_throughput",
        "system": system,
        "task_ms": seconds_each * 1e3,
        "tasks": n,
        "slots": SLOTS,
        "oversubscribed": common.oversubscribed(SLOTS),
        "seconds": round(wall, 4),
        "tasks_per_s": round(n / wall, 1),
        "utilisation": round(n * seconds_each / (SLOTS * wall), 4),
        **extra,
    }


def unavailable(system: str, seconds_each: float, why: str) -> dict:
    return {
        "benchmark": "ensemble_throughput",
        "system": system,
        "task_ms": seconds_each * 1e3,
        "result": f"unavailable ({why})",
    }


# --- the baselines, in this process ---------------------------------------------------


def pool_rate(d: float, n: int) -> dict:
    with ProcessPoolExecutor(SLOTS) as pool:
        list(pool.map(sleep_task, [0.0] * SLOTS))  # started
        t0 = time.perf_counter()
        list(pool.map(sleep_task, [d] * n, chunksize=1))
        return rate_row("ProcessPoolExecutor", d, n, time.perf_counter() - t0)


def dask_rate(d: float, n: int) -> dict:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return _dask_multiprocessing(d, n)
    with (
        LocalCluster(n_workers=RANKS, threads_per_worker=WORKERS, processes=True) as lc,
        Client(lc) as client,
    ):
        client.gather(client.map(sleep_task, [0.0] * SLOTS, pure=False))
        t0 = time.perf_counter()
        client.gather(client.map(sleep_task, [d] * n, pure=False))
        return rate_row("dask distributed (processes)", d, n, time.perf_counter() - t0)


def _dask_multiprocessing(d: float, n: int) -> dict:
    import dask

    tasks = [dask.delayed(sleep_task)(d, dask_key_name=f"s-{i}") for i in range(n)]
    t0 = time.perf_counter()
    dask.compute(*tasks, scheduler="processes", num_workers=SLOTS)
    return rate_row("dask multiprocessing", d, n, time.perf_counter() - t0)


def parsl_rates(plan: dict[float, int]) -> list[dict]:
    """Parsl's HighThroughputExecutor with 8 workers, every task length."""
    try:
        import parsl
        from parsl.config import Config
        from parsl.executors import HighThroughputExecutor
        from parsl.providers import LocalProvider
    except ImportError:
        return [unavailable("parsl HTEX", d, "pip install parsl") for d in plan]
    run_dir = tempfile.mkdtemp(prefix="parsl-")
    # its workers unpickle this module's function: they need the repository on their path
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    htex = HighThroughputExecutor(
        label="htex",
        max_workers_per_node=SLOTS,
        # HTEX starts min(max_workers_per_node, cores / cores_per_worker) workers: without
        # this, 2 on a 2-core machine rather than the 8 slots every other system gets
        cores_per_worker=(os.cpu_count() or 1) / SLOTS,
        provider=LocalProvider(init_blocks=1, max_blocks=1),
    )
    dfk = parsl.load(Config(executors=[htex], run_dir=run_dir))
    try:
        app = parsl.python_app(parsl_sleep)
        [f.result() for f in [app(0.0) for _ in range(SLOTS * 4)]]  # workers started
        rows = []
        for d, n in plan.items():
            t0 = time.perf_counter()
            [f.result() for f in [app(d) for _ in range(n)]]
            rows.append(rate_row("parsl HTEX", d, n, time.perf_counter() - t0))
        return rows
    finally:
        dfk.cleanup()
        parsl.clear()


# --- taskgraph, in jobs of 2 ranks -----------------------------------------------------


def job(argv: list[str], timeout: float) -> dict:
    """Rank 0's JSON line of ``python -m benchmarks.ensemble argv`` on 2 ranks x 4
    workers, or {"error": ...}."""
    from taskgraph.cluster.launch import run_ranks

    env = common.job_env(TASKGRAPH_WORKERS=str(WORKERS))
    try:
        proc = run_ranks(
            RANKS, ["-m", "benchmarks.ensemble", *argv], timeout=timeout, capture=True, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"job ({' '.join(argv)}) ran past {timeout:.0f} s"}
    lines = [line for line in (proc.stdout or "").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"job failed ({proc.returncode}): {(proc.stderr or '')[-1500:]}"}
    return json.loads(lines[-1])


def _core_utilisation(run) -> float | None:
    trace = run.trace
    return round(trace.core_utilisation()["utilisation"], 4) if trace.attempt_rows else None


def child_rate(mode: str, d: float, n: int) -> None:
    """Inside the job: ``n`` sleep tasks of ``d`` s, as a static graph or submitted."""
    import taskgraph as tg
    from benchmarks import ensemble as me  # submitted calls pickle as benchmarks.ensemble.*

    cluster = tg.JobCluster(workers=WORKERS)
    task = tg.task(me.sleep_task)
    out: dict = {}
    for warm in (True, False):
        m = SLOTS if warm else n
        cluster.barrier()
        t0 = time.perf_counter()
        if mode == "static":
            with tg.Graph("sleeps") as g:
                for _ in range(m):
                    task(d)
            run = cluster.run(g).wait()
        else:
            with tg.Graph("submitted") as g:
                pass
            run = cluster.run(g, open=True)
            mine = range(cluster.rank, m, cluster.size)
            futures = [run.submit(task, d) for _ in mine]
            [f.result() for f in futures]
            run.close()
            run.wait()
        wall = max(cluster.world.allgather(time.perf_counter() - t0))
        if not warm and cluster.rank == 0:
            out = {"seconds": wall, "core_utilisation": _core_utilisation(run)}
    if cluster.rank == 0:
        print(json.dumps(out), flush=True)


def tg_rates(plan: dict[float, int], timeout: float) -> list[dict]:
    rows = []
    for mode in ("static", "submit"):
        for d, n in plan.items():
            got = job(["--rate", mode, str(d), str(n)], timeout)
            name = f"taskgraph ({'static graph' if mode == 'static' else 'run.submit'})"
            if "error" in got:
                rows.append(unavailable(name, d, got["error"][-300:]))
                continue
            extra = {"trace_core_utilisation": got["core_utilisation"]}
            rows.append(rate_row(name, d, n, got["seconds"], **extra))
    return rows


# --- the mixed ensemble ------------------------------------------------------------------


def mixed_plan(n: int, seed: int = 23) -> list[tuple[str, float]]:
    """``n`` tasks: (kind, seconds): 30 % /bin/sleep, 20 % shell pipelines, 5 % Python
    failing once, the rest Python sleeps; 1-50 ms each."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = round(rng.uniform(0.001, 0.05), 4)
        u = rng.random()
        kind = "exe" if u < 0.3 else "shell" if u < 0.5 else "flaky" if u < 0.55 else "py"
        out.append((kind, d))
    return out


def flaky(seconds: float, marker: str) -> float:
    """Sleeps ``seconds``; fails the first time (``marker`` records that it did)."""
    time.sleep(seconds)
    if not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError(f"first attempt fails ({marker})")
    return seconds


def child_mixed(n: int, scratch: str) -> None:
    """Inside the job: the mixed ensemble as one static graph, retries=1 for the run."""
    import taskgraph as tg
    from benchmarks import ensemble as me
    from taskgraph.dsl.exe import exe, shell

    cluster = tg.JobCluster(workers=WORKERS)
    py, bad = tg.task(me.sleep_task), tg.task(me.flaky)
    plan = mixed_plan(n)
    with tg.Graph("mixed") as g:
        for i, (kind, d) in enumerate(plan):
            if kind == "exe":
                exe(["/bin/sleep", str(d)])
            elif kind == "shell":
                shell("sleep {d} | cat | wc -c", d=d)
            elif kind == "flaky":
                bad(d, os.path.join(scratch, f"m{i}"))
            else:
                py(d)
    cluster.barrier()
    t0 = time.perf_counter()
    run = cluster.run(g, retries=1).wait()
    wall = max(cluster.world.allgather(time.perf_counter() - t0))
    if cluster.rank == 0:
        counts = run.trace.state_counts() if run.trace.attempt_rows else None
        out = {"seconds": wall, "tasks_done": len(run.trace.tasks), "counts": counts}
        out["core_utilisation"] = _core_utilisation(run)
        print(json.dumps(out), flush=True)


def mixed(n: int, timeout: float) -> dict:
    plan = mixed_plan(n)
    ideal = sum(d for _, d in plan) / SLOTS
    row = {"benchmark": "ensemble_mixed", "tasks": n, "slots": SLOTS, "ideal_seconds": ideal}
    row["mix"] = {k: sum(1 for kind, _ in plan if kind == k) for k in ("exe", "shell", "flaky")}
    with tempfile.TemporaryDirectory() as scratch:
        got = job(["--mixed", str(n), scratch], timeout)
    if "error" in got:
        return row | {"result": f"unavailable ({got['error'][-400:]})"}
    return row | got | {"over_ideal": round(got["seconds"] / ideal, 3)}


# --- launch overhead of executable tasks ------------------------------------------------------


def launch(n: int) -> dict:
    """Per call: ``subprocess.run(["/bin/true"])`` in a loop, against ``tg.exe`` tasks
    of the same program on 1 rank x 1 worker in this process."""
    row = {"benchmark": "ensemble_launch", "calls": n, "program": "/bin/true"}
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["/bin/true"], check=True)
    bare = (time.perf_counter() - t0) / n
    row["subprocess_run_ms"] = round(bare * 1e3, 3)
    try:
        import taskgraph as tg
        from taskgraph.dsl.exe import exe
    except ImportError as exc:
        return row | {"taskgraph": f"unavailable ({exc})"}

    def graph(m: int):
        with tg.Graph("launch") as g:
            for _ in range(m):
                exe(["/bin/true"])
        return g

    tg.current_cluster().run(graph(4), workers=1).wait()  # warm
    g = graph(n)
    t0 = time.perf_counter()
    tg.current_cluster().run(g, workers=1).wait()
    ours = (time.perf_counter() - t0) / n
    return row | {"taskgraph_exe_ms": round(ours * 1e3, 3), "ratio": round(ours / bare, 3)}


# --- the suite ------------------------------------------------------------------------------


def best_rate(rows: list[dict], system: str, ms: float) -> float | None:
    for r in rows:
        if r.get("system", "").startswith(system) and r.get("task_ms") == ms:
            return r.get("tasks_per_s")
    return None


def targets(rows: list[dict], mix: dict) -> dict:
    ours = best_rate(rows, "taskgraph (static", 0.0)
    parsl, dask = best_rate(rows, "parsl", 0.0), best_rate(rows, "dask", 0.0)
    util = next(
        (r.get("utilisation") for r in rows if r.get("system", "").startswith("taskgraph (static")
         and r.get("task_ms") == 100.0),
        None,
    )  # fmt: skip

    def t(value, target, ok):
        return {"value": value, "target": target, "ok": bool(ok) if value is not None else None}

    over = mix.get("over_ideal")
    return {
        "benchmark": "ensemble_targets",
        "throughput_0ms_vs_parsl": t(ours / parsl if ours and parsl else None, 2.0,
                                     ours and parsl and ours >= 2 * parsl),
        "throughput_0ms_vs_dask": t(ours / dask if ours and dask else None, 1.0,
                                    ours and dask and ours >= dask),
        "utilisation_100ms": t(util, 0.9, util is not None and util >= 0.9),
        "mixed_over_ideal": t(over, 1.15, over is not None and over <= 1.15),
    }  # fmt: skip


def guarded(name: str, fn, *args) -> list[dict]:
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run reads unavailable
        return [{"benchmark": "ensemble_throughput", "system": name,
                 "result": f"unavailable ({type(exc).__name__}: {str(exc)[:300]})"}]  # fmt: skip
    return out if isinstance(out, list) else [out]


def run(quick: bool = False) -> list[dict]:
    """The suite; every result printed as a JSON line as it comes."""
    timeout = 300 if quick else 900
    plan = counts(quick)
    rows: list[dict] = []
    for d, n in plan.items():
        rows += [common.emit(r) for r in guarded("ProcessPoolExecutor", pool_rate, d, n)]
        rows += [common.emit(r) for r in guarded("dask", dask_rate, d, n)]
    rows += [common.emit(r) for r in guarded("parsl HTEX", parsl_rates, plan)]
    rows += [common.emit(r) for r in tg_rates(plan, timeout)]
    mix = common.emit(mixed(400 if quick else 2000, timeout))
    lau = common.emit(launch(100 if quick else 500))
    return [*rows, mix, lau, common.emit(targets(rows, mix))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tasks, a few minutes")
    ap.add_argument("--rate", nargs=3, help=argparse.SUPPRESS)  # mode, seconds, n: in a job
    ap.add_argument("--mixed", nargs=2, help=argparse.SUPPRESS)  # n, scratch dir: in a job
    args = ap.parse_args(argv)
    if args.rate:
        child_rate(args.rate[0], float(args.rate[1]), int(args.rate[2]))
    elif args.mixed:
        child_mixed(int(args.mixed[0]), args.mixed[1])
    else:
        t0 = time.perf_counter()
        run(quick=args.quick)
        print(f"# ensemble suite took {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
