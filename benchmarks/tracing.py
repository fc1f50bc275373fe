"""Tracing cost: tiled Cholesky with tracing on and off, alternating, in one job.

    taskgraph run -n 2 benchmarks/tracing.py [--n 8192] [--tile 512] [--repeats 3]
    python -m benchmarks.tracing            # starts the 2-rank job itself

Prints one JSON object: the best GFLOP/s of each mode and their ratio. The modes
alternate (on, off, on, off, ...) so that both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import sys

import taskgraph as tg
from taskgraph.core import config
from taskgraph.core.machine import describe
from taskgraph.linalg import cholesky, cholesky_flops


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--tile", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2, help="when starting the job itself")
    args = p.parse_args(argv)
    if not config.use_mpi() and args.ranks > 1:
        from taskgraph.cluster.launch import run_ranks

        sys.exit(run_ranks(args.ranks, [__file__, *sys.argv[1:]], timeout=1800).returncode)
    cluster = tg.Cluster()
    best = {True: float("inf"), False: float("inf")}
    A = tg.TiledMatrix.random_spd(args.n, args.tile)
    tg.compile_kernels(cholesky(A))
    for _ in range(args.repeats):
        for tracing in (True, False):
            A = tg.TiledMatrix.random_spd(args.n, args.tile)
            cluster.barrier()
            run = cluster.run(cholesky(A), trace=tracing).wait()
            seconds = max(cluster.world.allgather(run.seconds))
            best[tracing] = min(best[tracing], seconds)
    if cluster.rank == 0:
        on, off = (cholesky_flops(args.n) / best[m] / 1e9 for m in (True, False))
        print(
            json.dumps(
                {
                    "benchmark": "tracing_cost",
                    "n": args.n,
                    "tile": args.tile,
                    "ranks": cluster.size,
                    "workers_per_rank": cluster.workers,
                    "repeats": args.repeats,
                    "gflops_tracing_on": round(on, 2),
                    "gflops_tracing_off": round(off, 2),
                    "ratio_on_over_off": round(on / off, 4),
                    "machine": describe(),
                }
            )
        )


def run(quick: bool = False) -> list[dict]:
    """The suite entry: n = 8192 (4096 with ``quick``), tile 512, 2 ranks."""
    from benchmarks.common import emit, last_json, python

    n, repeats = (4096, 2) if quick else (8192, 3)
    result = last_json(
        python("-m", "benchmarks.tracing", "--n", str(n), "--repeats", str(repeats)),
        timeout=1800,
    )
    return [emit(result)]


if __name__ == "__main__":
    main()
