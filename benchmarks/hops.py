"""Where a hop of the ping-pong goes: the comm suite's chain, taken apart by its trace.

    python -m benchmarks.hops [--sizes 8 1048576] [--hops 1000]   # its own 2-rank job

Runs the chain of ``benchmarks.comm`` (each task reads the other rank's tile and
writes its own, so every hop is one task and one message) and splits a hop with the
run's own trace (tracing is on by default; clocks are lined up at the start), medians
over the hops:

- ``task_us``: the task itself (the kernel call, its tile lookups, the trace stores);
- ``recv_to_start_us``: from a receive completing to the task it releases starting;
- ``end_to_send_us``: from a task ending to its send being posted;
- ``transfer_us``: from a send being posted on one rank to its receive completing on
  the other (MPI's transfer, and the time until a poll notices it), the mean of the
  two directions so that the ranks' clock offset cancels (``clock_offset_us``: that
  offset, as the start barrier left it).

``hop_us`` is the run's time per hop (long chain minus a quarter-length one, as the
comm suite measures it) and ``raw_us`` a raw mpi4py ``Send``/``Recv`` ping-pong's one-way
time in the same job; ``polls``, ``spins``, ``sleeps`` and ``direct`` (tasks run the
moment their tile landed) per hop come from the executor's counters. Nothing here is
a target: it is the profile behind the comm suite's latency and bandwidth figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import taskgraph as tg
from benchmarks.comm import (
    best_step,
    chain_seconds,
    ping_pong,
    raw_buffers,
    raw_loop,
    raw_one_way,
    short_of,
)
from benchmarks.common import emit, job_env
from taskgraph.core import config
from taskgraph.dsl.tasks import INITIAL


def us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 2) if values else float("nan")


def breakdown(run) -> dict:
    """Median parts of a hop, from a finished run's merged trace (rank 0 only)."""
    tr = run.trace
    task = {row[5]: row for row in tr.tasks}  # task -> [rank, worker, start, end, ...]
    by_key = {(m.src, m.dst, m.tag): m for m in run.plan.messages}
    transfer: dict[tuple[int, int], list[float]] = {(0, 1): [], (1, 0): []}
    to_start, to_send = [], []
    for src, dst, _nbytes, tag, posted, done in tr.messages:
        msg = by_key[src, dst, tag]
        transfer[src, dst].append(done - posted)
        to_start += [task[c][2] - done for c in msg.consumers]
        if msg.producer != INITIAL:
            to_send.append(posted - task[msg.producer][3])
    # posted and done are on two ranks' clocks: their offset adds to one direction and
    # takes from the other, so the mean of the two cancels it (and half the difference
    # measures it)
    there, back = us(transfer[0, 1]), us(transfer[1, 0])
    return {
        "task_us": us([row[3] - row[2] for row in tr.tasks]),
        "recv_to_start_us": us(to_start),
        "end_to_send_us": us(to_send),
        "transfer_us": round((there + back) / 2, 2),
        "clock_offset_us": round((there - back) / 2, 2),
    }


def measure(cluster, nbytes: int, hops: int) -> dict | None:
    X, graphs, plans = ping_pong(nbytes, hops)
    buf, other = raw_buffers(max(1, nbytes // 8))
    comm = cluster.world.comm
    raw_one_way(comm, buf, other, 50)  # warm
    for g, p in zip(graphs, plans):
        chain_seconds(cluster, X, g, p)  # warm: compiled, buffers in the pool
    trips = 2000 if nbytes < 65536 else 200
    loops = {
        n: min(raw_loop(comm, buf, other, n) for _ in range(3)) for n in (trips, short_of(trips))
    }
    raw = best_step(loops, trips) / 2
    shorts, longs = [], []
    for _ in range(3):
        shorts.append(chain_seconds(cluster, X, graphs[0], plans[0]))
        run = cluster.run(graphs[1], plan=plans[1]).wait()
        longs.append((max(cluster.world.allgather(run.seconds)), run))
    long, run = min(longs, key=lambda pair: pair[0])  # the best of each, as comm does
    hop = best_step({graphs[0].ntasks: min(shorts), hops: long}, hops)
    stats = cluster.world.allgather(run.stats.as_dict())
    if cluster.rank != 0:
        return None
    counts = {
        k: round(sum(s[k] for s in stats) / hops, 2) for k in ("polls", "spins", "sleeps", "direct")
    }
    return {
        "benchmark": "hops",
        "bytes": nbytes,
        "hops": hops,
        "hop_us": round(hop * 1e6, 2),
        "raw_us": round(raw * 1e6, 2),
        **breakdown(run),
        **{f"{k}_per_hop": v for k, v in counts.items()},
    }


def child(out: str, sizes: list[int], hops: int) -> None:
    cluster = tg.Cluster()
    if cluster.size != 2:
        raise SystemExit(f"the ping-pong needs 2 ranks, not {cluster.size}")
    for nbytes in sizes:
        result = measure(cluster, nbytes, hops if nbytes < (1 << 20) else max(64, hops // 8))
        if result is not None:
            with open(out, "a") as f:
                f.write(json.dumps(emit(result)) + "\n")


def run(quick: bool = False, sizes=(8, 4096, 1 << 20), hops: int = 1000) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    env = job_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hops.jsonl")
        argv = ["-m", "benchmarks.hops", "--child", out, "--hops", str(300 if quick else hops)]
        argv += ["--sizes", *map(str, sizes)]
        sys.stdout.flush()
        proc = run_ranks(2, argv, timeout=900, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-rank ping-pong job failed ({proc.returncode})")
        return [json.loads(line) for line in Path(out).read_text().splitlines()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[8, 4096, 1 << 20])
    p.add_argument("--hops", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="300 hops")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if not config.use_mpi():
            raise SystemExit("--child runs inside the 2-rank job")
        child(args.child, args.sizes, args.hops)
        return
    run(quick=args.quick, sizes=args.sizes, hops=args.hops)


if __name__ == "__main__":
    main()
