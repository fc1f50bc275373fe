"""The Tascell paper's programs (fib, N-Queens, UTS) on spawned tasks, against serial
numba and a statically chunked process pool, in the same run.

    python -m benchmarks dynamic [--quick]
    python -m benchmarks.dynamic [--quick]

Per program, in this process: the serial program (the numba leaf of
:mod:`benchmarks.leaves` called on the root, best of REPEAT) and
``ProcessPoolExecutor(2)`` with static chunking of the same leaves (the top levels
unfolded serially into leaf calls, dealt round-robin into one chunk per process, the
unfolding timed with the rest; the pool started and its leaves compiled beforehand),
each best of REPEAT before the taskgraph jobs and REPEAT after: best of 2 x REPEAT. Then
the taskgraph version, recursive functions that ``tg.spawn`` their subproblems and wait
for them (``fut.result()``, ``tg.wait``), in real ``mpiexec`` jobs of 1, 2, 3 and 4
ranks x 1 worker (3 and 4 oversubscribed on 2 cores), one warm-up run and best of 2 x
REPEAT timed runs in each job (as many as each baseline: on a noisy machine the best of
more runs is lower). Each ``dynamic`` row: ``speedup_vs_serial`` (serial seconds over
ours) and ``vs_pool`` (the pool's seconds over ours: above 1 is better), the value and
whether it equals the serial program's, and each rank's CPU over the run as a fraction
of a core (``cpu_fraction_by_rank``); ``steals`` and their median latency (request to
arrival), and ``pushes``, calls a victim sent an idle rank unasked
(taskgraph.run.steal), with theirs (from the push: not in the steal latency).

Also: ``dynamic_loaded``, UTS on 2 ranks while a busy loop pinned to CPU 0 shares the
first rank's core, against the unloaded time (and the pool under the same load), with
the least that ratio can be where the kernel shares that core fairly
(``fair_share_bound``: 4/3 with 2 ranks on 2 cores);
``dynamic_idle_cpu``, the CPU of a rank with nothing to do while another runs one
long leaf (a static graph of one task, so it is measured with or without spawn); and
``dynamic_targets``, the issue's targets with the measured values (``applies``: false
with ``--quick``, whose sizes they were not set for). Until the tree has
``tg.spawn`` the taskgraph figures read ``"taskgraph": "unavailable (...)"``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks import common, leaves
from taskgraph.core import config

REPEAT = 3  # best of, for every measurement (the baselines: twice, before and after the jobs)
TG_REPEAT = 2 * REPEAT  # timed runs a job: as many as each baseline gets
POOL = 2  # the process pool's processes: the reference machine's cores
POOL_START = 60.0  # seconds for every process of the pool to start and compile its leaves
RANKS = (1, 2, 3, 4)
UNAVAILABLE = "unavailable (tg.spawn not yet in this tree)"
TARGETS = {"fib": 1.8, "queens": 1.8, "uts": 1.7}  # speedup over serial on 2 ranks
LOADED_TARGET = 1.3  # loaded UTS time over unloaded, at most
IDLE_CPU_TARGET = 0.05  # of a core
QUICK_NOTE = (
    "--quick: under 0.2 s of serial work a program, so each run's fixed start and end "
    "weigh several times more; the targets apply to the full sizes (serial 1-2 s)"
)
CPU_TICK = 1 / os.sysconf("SC_CLK_TCK")  # the resolution of a process's CPU seconds


@dataclass(frozen=True)
class Program:
    """One problem: ``name`` (fib, queens, uts), its ``args`` and ``split`` (fib: the
    cutoff; queens and UTS: the depth where subproblems become leaf calls)."""

    name: str
    args: tuple
    split: int


def programs(quick: bool) -> list[Program]:
    """The problems: sized so that the serial program takes ~1-2 s (quick: < 0.2 s)."""
    if quick:
        return [Program("fib", (35,), 25), Program("queens", (13,), 2), Program("uts", UTS_Q, 5)]
    return [Program("fib", (42,), 30), Program("queens", (15,), 3), Program("uts", UTS, 6)]


UTS = (42, 4.0, 14)  # (root id, mean branching b0, depth cap): 2.0e8 nodes
UTS_Q = (42, 4.0, 12)  # 1.3e7 nodes


# --- the serial program and its static chunks -------------------------------------------


def leaf(name: str, item: tuple) -> int:
    """One leaf call of program ``name`` on a subproblem ``item``."""
    if name == "fib":
        return int(leaves.fib(*item))
    if name == "queens":
        return int(leaves.queens(*item))
    node, depth, b0, max_depth = item
    return int(leaves.uts(np.uint64(node), depth, b0, max_depth))


def root(p: Program) -> tuple:
    """The whole problem as one leaf's subproblem."""
    if p.name == "fib":
        return p.args
    if p.name == "queens":
        return (p.args[0], 0, 0, 0)
    node, b0, max_depth = p.args
    return (node, 0, b0, max_depth)


def serial(p: Program) -> int:
    """The serial program: one leaf call on the root."""
    return leaf(p.name, root(p))


def chunks(p: Program) -> tuple[int, list[tuple]]:
    """The top levels unfolded serially: (what they count themselves, the leaf calls)."""
    if p.name == "fib":
        return 0, [(n,) for n in leaves.fib_split(p.args[0], p.split)]
    if p.name == "queens":
        return 0, leaves.queens_split(p.args[0], p.split)
    node, b0, max_depth = p.args
    return leaves.uts_split(node, b0, max_depth, p.split)


def run_chunk(name: str, items: list[tuple]) -> int:
    """A process pool's task: the sum of the leaf calls on ``items``."""
    return sum(leaf(name, item) for item in items)


def _ready(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def best_seconds(fn, repeat: int = REPEAT) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls of ``fn()``, and its (last) value."""
    best, value = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def pool_seconds(p: Program, pool: ProcessPoolExecutor, repeat: int = REPEAT) -> tuple[float, int]:
    """Best time of the statically chunked program on ``pool``, and its value: the
    unfolding of the top levels counts, as the task version's and the serial one do."""

    def once() -> int:
        base, items = chunks(p)
        parts = [pool.submit(run_chunk, p.name, items[i::POOL]) for i in range(POOL)]
        return base + sum(f.result() for f in parts)

    seconds, value = best_seconds(once, repeat)
    return seconds, int(value)


def make_pool() -> ProcessPoolExecutor:
    """POOL processes, started, their leaves compiled (or loaded from numba's cache)."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    pool = ProcessPoolExecutor(POOL, mp_context=ctx, initializer=leaves.warm)
    # until each process has run a call (one still compiling lets another take both)
    pids: set[int] = set()
    deadline = time.monotonic() + POOL_START
    while len(pids) < POOL and time.monotonic() < deadline:
        pids |= {f.result() for f in [pool.submit(_ready, 0.3) for _ in range(POOL)]}
    if len(pids) != POOL:
        pool.shutdown()
        raise RuntimeError(f"process pool: {len(pids)} of {POOL} processes started")
    return pool


# --- the taskgraph version: recursive spawned tasks ---------------------------------------


def fib_rec(n: int, cutoff: int) -> int:
    """fib(n): spawn fib(n - 1), compute fib(n - 2) here, then add (leaves at cutoff)."""
    import taskgraph as tg

    if n <= cutoff or n < 2:
        return int(leaves.fib(n))
    a = tg.spawn(fib_rec, n - 1, cutoff)
    b = fib_rec(n - 2, cutoff)
    return a.result() + b


def queens_rec(state: tuple, depth: int) -> int:
    """Solutions below the partial board ``state``: one spawned task per safe column
    for ``depth`` more rows, then leaves."""
    import taskgraph as tg

    if depth == 0:
        return int(leaves.queens(*state))
    futs = [tg.spawn(queens_rec, child, depth - 1) for child in leaves.queens_children(*state)]
    return sum(tg.wait(futs))


def uts_rec(state: tuple, split: int) -> int:
    """Nodes in the subtree of ``state`` = (node, depth, b0, max_depth): one spawned
    task per child down to depth ``split``, then leaves."""
    import taskgraph as tg

    if state[1] >= split:
        return leaf("uts", state)
    futs = [tg.spawn(uts_rec, child, split) for child in leaves.uts_children(*state)]
    return 1 + sum(tg.wait(futs))


def task_root(p: Program):
    """The top-level call of program ``p``'s task version: (function, args)."""
    if p.name == "fib":
        return fib_rec, (p.args[0], p.split)
    if p.name == "queens":
        return queens_rec, (root(p), p.split)
    return uts_rec, (root(p), p.split)


def have_spawn() -> bool:
    import taskgraph as tg

    return callable(getattr(tg, "spawn", None))


# --- inside a job: every rank runs this ----------------------------------------------------


def cpu_seconds() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def gather(cluster, value) -> list:
    """Every rank's ``value``, on every rank of the job's cluster."""
    assert cluster.world is not None  # (every rank of the job is a member)
    return cluster.world.allgather(value)


def timed_run(cluster, fn, args: tuple) -> tuple[float, object, float, dict]:
    """One run of the graph ``fn(*args)``: (slowest rank's seconds, value, my CPU
    seconds over it, and on rank 0 the trace's spawn and steal counts with the steals'
    median latency)."""
    import taskgraph as tg

    with tg.Graph(fn.__name__) as g:
        f = tg.task(fn)(*args)
    cluster.barrier()
    cpu0 = cpu_seconds()
    run = cluster.run(g).wait()
    cpu = cpu_seconds() - cpu0
    seconds = max(gather(cluster, run.seconds))
    dyn = run.trace.dynamic() if cluster.rank == 0 else {}
    return seconds, f.result(), cpu, dyn


def child(p: Program, repeat: int) -> None:
    """One job's measurement; rank 0 prints it as a JSON line."""
    import taskgraph as tg
    from benchmarks import dynamic as me  # spawned functions pickle as benchmarks.dynamic.*

    leaves.warm()
    cluster = tg.JobCluster(workers=1)
    fn, args = me.task_root(p)
    runs = [timed_run(cluster, fn, args) for _ in range(repeat + 1)][1:]  # first: warm-up
    best = min(runs, key=lambda r: r[0])
    fractions = gather(cluster, round(best[2] / best[0], 3))
    if cluster.rank == 0:
        out = {"seconds": best[0], "seconds_all": [r[0] for r in runs], "value": best[1]}
        out["steals"] = best[3].get("steals", 0)
        out["steal_latency_median_us"] = round(1e6 * best[3].get("steal_latency_median", 0.0), 1)
        out["pushes"] = best[3].get("pushes", 0)
        out["push_latency_median_us"] = round(1e6 * best[3].get("push_latency_median", 0.0), 1)
        print(json.dumps(out | {"cpu_fraction_by_rank": fractions}), flush=True)


def idle_child(n: int) -> None:
    """One long leaf, fib(n), that keeps one rank busy: every rank's CPU over its own
    part of the run. With spawn the leaf is a spawned task and the other rank looks for
    work until the run ends; without, a static graph of one task."""
    import taskgraph as tg
    from benchmarks import dynamic as me

    leaves.warm()
    cluster = tg.JobCluster(workers=1)
    fn = me.spawn_long_leaf if have_spawn() else me.long_leaf
    timed_run(cluster, fn, (20,))  # warm-up
    cluster.barrier()
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    seconds, _, _, _ = timed_run(cluster, fn, (n,))
    mine = (time.perf_counter() - t0, cpu_seconds() - cpu0)
    walls, cpus = zip(*gather(cluster, mine))
    if cluster.rank == 0:
        out: dict[str, object] = {"seconds": seconds, "spawned": fn is me.spawn_long_leaf}
        out["rank_seconds"] = [round(w, 4) for w in walls]
        out["cpu_fraction_by_rank"] = [round(c / w, 4) for c, w in zip(cpus, walls)]
        print(json.dumps(out), flush=True)


def long_leaf(n: int) -> int:
    """fib(n) in one leaf call (one task that keeps one rank busy)."""
    return int(leaves.fib(n))


def spawn_long_leaf(n: int) -> int:
    """:func:`long_leaf` as the one spawned child of this task, waited for."""
    import taskgraph as tg

    return tg.spawn(long_leaf, n).result()


# --- jobs, started from this process --------------------------------------------------------


def job(ranks: int, argv: list[str], timeout: float) -> dict:
    """Start ``python -m benchmarks.dynamic argv`` on ``ranks`` ranks x 1 worker and
    return rank 0's JSON line, or {"error": ...} naming the failure."""
    from taskgraph.cluster.launch import run_ranks

    env = common.job_env(TASKGRAPH_WORKERS="1")
    try:
        proc = run_ranks(
            ranks, ["-m", "benchmarks.dynamic", *argv], timeout=timeout, capture=True, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"job of {ranks} ranks ({' '.join(argv)}) ran past {timeout:.0f} s"}
    lines = [line for line in (proc.stdout or "").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or "")[-2000:]
        return {"error": f"job of {ranks} ranks failed ({proc.returncode}): {tail}"}
    return json.loads(lines[-1])


class BusyLoop:
    """A ``while True`` process pinned to one CPU while the block runs; killed after."""

    def __init__(self, cpu: int = 0):
        self.cpu = cpu
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> BusyLoop:
        code = f"import os\nos.sched_setaffinity(0, {{{self.cpu}}})\nwhile True:\n    pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.2)  # pinned and spinning before anything is timed
        return self

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)


# --- the suite ------------------------------------------------------------------------------


def base_row(p: Program, serial_s: float, pool_s: float, value: int) -> dict:
    return {
        "benchmark": "dynamic",
        "program": p.name,
        "problem": asdict(p),
        "serial_seconds": round(serial_s, 4),
        "pool_seconds": round(pool_s, 4),
        "pool_processes": POOL,
        "pool_chunks": len(chunks(p)[1]),
        "pool_speedup_vs_serial": round(serial_s / pool_s, 3),
        "value": value,
    }


def tg_job(p: Program, ranks: int, timeout: float) -> dict:
    """The taskgraph version of ``p`` in a job of ``ranks`` ranks: rank 0's figures."""
    return job(ranks, ["--child", json.dumps(asdict(p)), "--repeat", str(TG_REPEAT)], timeout)


def rate(base: dict, ranks: int, got: dict) -> dict:
    """The row of one job's figures ``got`` on ``ranks`` ranks, against ``base``."""
    row = base | {"ranks": ranks, "workers_per_rank": 1}
    row["oversubscribed"] = common.oversubscribed(ranks)
    if "error" in got:
        return row | {"taskgraph": got["error"]}
    seconds = got["seconds"]
    row |= {"seconds": round(seconds, 4), "seconds_all": [round(s, 4) for s in got["seconds_all"]]}
    row["speedup_vs_serial"] = round(base["serial_seconds"] / seconds, 3)
    row["vs_pool"] = round(base["pool_seconds"] / seconds, 3)
    row["taskgraph_value"] = got["value"]
    row["value_ok"] = got["value"] == base["value"]
    row["cpu_fraction_by_rank"] = got["cpu_fraction_by_rank"]
    row["cpu_tick_seconds"] = CPU_TICK
    row["steals"] = got.get("steals")
    row["steal_latency_median_us"] = got.get("steal_latency_median_us")
    row["pushes"] = got.get("pushes")  # calls sent unasked to an idle rank (not steals)
    row["push_latency_median_us"] = got.get("push_latency_median_us")
    return row


def baselines(p: Program, pool: ProcessPoolExecutor) -> tuple[float, float, int]:
    """Serial and pool seconds of ``p`` (best of REPEAT each) and the value (taken
    twice, see :func:`measure_program`)."""
    serial_s, value = best_seconds(lambda: serial(p))
    pool_s, pool_value = pool_seconds(p, pool)
    if pool_value != value:
        raise RuntimeError(f"{p}: the process pool counted {pool_value}, serial {value}")
    return serial_s, pool_s, int(value)


def measure_program(p: Program, pool: ProcessPoolExecutor, spawn: bool, timeout: float):
    """Serial, pool and (with spawn) taskgraph at every rank count: the rows. The
    baselines are measured before and after the jobs, best of both (a shared machine's
    load comes and goes)."""
    before = baselines(p, pool)
    if not spawn:
        return [common.emit(base_row(p, *before) | {"taskgraph": UNAVAILABLE})]
    got = {r: tg_job(p, r, timeout) for r in RANKS}
    after = baselines(p, pool)
    base = base_row(p, min(before[0], after[0]), min(before[1], after[1]), before[2])
    return [common.emit(rate(base, r, got[r])) for r in RANKS]


def loaded(p: Program, rows: list[dict], pool: ProcessPoolExecutor, spawn: bool, timeout: float):
    """UTS on 2 ranks (and the pool) with a busy loop on CPU 0, against unloaded."""
    unloaded = next(r for r in rows if r["program"] == p.name and r.get("ranks", 2) == 2)
    row = {"benchmark": "dynamic_loaded", "program": p.name, "ranks": 2, "busy_loop_cpu": 0}
    with BusyLoop(0):
        pool_s, _ = pool_seconds(p, pool, TG_REPEAT)  # (as many as unloaded)
        got = rate(unloaded, 2, tg_job(p, 2, timeout)) if spawn else {"taskgraph": UNAVAILABLE}
    row["pool_seconds"] = round(pool_s, 4)
    row["pool_vs_unloaded"] = round(pool_s / unloaded["pool_seconds"], 3)
    if "seconds" in got and "seconds" in unloaded:
        row["seconds"] = got["seconds"]
        row["unloaded_seconds"] = unloaded["seconds"]
        row["vs_unloaded"] = round(got["seconds"] / unloaded["seconds"], 3)
        row["fair_share_bound"] = fair_share_bound(2, config.cores())
        row["value_ok"] = got["value_ok"]
    else:
        row["taskgraph"] = got.get("taskgraph", unloaded.get("taskgraph"))
    return common.emit(row)


def fair_share_bound(ranks: int, cores: int) -> float:
    """The least loaded-over-unloaded time ``ranks`` ranks, each bound to a core of its
    own, can reach with a busy loop on one of ``cores`` CPUs, if the kernel shares that
    CPU fairly: where every core has a rank, they have ``cores - 0.5`` cores' time for
    the work ``cores`` did (meant for ranks <= cores: the suite's 2 ranks)."""
    busy = min(ranks, cores)
    return round(busy / (cores - 0.5), 3) if ranks >= cores else 1.0


def idle_cpu(quick: bool, timeout: float) -> dict:
    """A rank's CPU while the other runs one long leaf (2 ranks): ``idle_rank_cpu_fraction``
    is of a core over that rank's own part of the run, whose length against the busy
    rank's is ``idle_rank_wall_fraction`` (near 1 when it waited in the run throughout)."""
    n = 40 if quick else 43
    got = job(2, ["--idle", str(n)], timeout)
    row = {"benchmark": "dynamic_idle_cpu", "ranks": 2, "workers_per_rank": 1, "leaf": f"fib({n})"}
    if "error" in got:
        return common.emit(row | {"taskgraph": got["error"]})
    fractions, walls = got["cpu_fraction_by_rank"], got["rank_seconds"]
    idle = min(range(len(fractions)), key=fractions.__getitem__)
    row |= {k: got[k] for k in ("spawned", "rank_seconds", "cpu_fraction_by_rank")}
    row["seconds"] = round(got["seconds"], 4)
    row["idle_rank_cpu_fraction"] = fractions[idle]
    row["idle_rank_wall_fraction"] = round(walls[idle] / max(walls), 3)
    row["cpu_tick_seconds"] = CPU_TICK
    return common.emit(row)


def targets(rows: list[dict], idle: dict, load: dict, quick: bool = False) -> dict:
    """The issue's targets on 2 ranks x 1 worker, each with its value and a boolean;
    ``applies`` is False at the quick sizes, where they are shown but do not hold."""
    two = {r["program"]: r for r in rows if r.get("ranks") == 2 and "seconds" in r}
    out: dict = {"benchmark": "dynamic_targets", "applies": not quick}
    if quick:
        out["note"] = QUICK_NOTE
    for name, target in TARGETS.items():
        value = two[name]["speedup_vs_serial"] if name in two else None
        out[f"speedup_{name}"] = _target(value, target, value is not None and value >= target)
    vs = two["uts"]["vs_pool"] if "uts" in two else None
    out["uts_vs_pool"] = _target(vs, "> 1", vs is not None and vs > 1)
    idle_v = idle.get("idle_rank_cpu_fraction")
    out["idle_cpu"] = _target(idle_v, IDLE_CPU_TARGET, idle_v is not None and idle_v <= 0.05)
    lv = load.get("vs_unloaded")
    out["uts_loaded"] = _target(lv, LOADED_TARGET, lv is not None and lv <= LOADED_TARGET)
    if "fair_share_bound" in load:  # (a target below it cannot be met on this machine)
        out["uts_loaded"]["fair_share_bound"] = load["fair_share_bound"]
    lat = [r["steal_latency_median_us"] for r in two.values() if r.get("steals")]
    worst = max(lat) if lat else None  # (the largest of the programs' medians)
    out["steal_latency_us"] = _target(worst, 100, worst is not None and worst <= 100)
    return common.emit(out)


def _target(value, target, ok: bool) -> dict:
    return {"value": value, "target": target, "ok": ok}


def run(quick: bool = False) -> list[dict]:
    """The suite; every result printed as a JSON line as it comes."""
    timeout = 300 if quick else 900
    spawn = have_spawn()
    leaves.warm()
    rows: list[dict] = []
    with make_pool() as pool:
        ps = programs(quick)
        for p in ps:
            rows += measure_program(p, pool, spawn, timeout)
        load = loaded(ps[-1], rows, pool, spawn, timeout)
    idle = idle_cpu(quick, timeout)
    return [*rows, load, idle, targets(rows, idle, load, quick)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small problems, about a minute")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a program's JSON: run it on this job
    ap.add_argument("--idle", type=int, help=argparse.SUPPRESS)  # the idle-CPU job: fib(n)
    ap.add_argument("--repeat", type=int, default=REPEAT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        child(Program(spec["name"], tuple(spec["args"]), spec["split"]), args.repeat)
    elif args.idle:
        idle_child(args.idle)
    else:
        t0 = time.perf_counter()
        run(quick=args.quick)
        print(f"# dynamic suite took {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
