"""Shared memory only against MPICH's defaults: does keeping ranks off the network cost?

    python -m benchmarks.loopback [--quick]     # starts 2-rank jobs of its own

A local job that taskgraph starts runs UCX on shared memory only (``UCX_TLS=self,sm``,
:func:`taskgraph.cluster.launch.local_env`), so no rank listens on the machine's address. This
suite runs a raw mpi4py ping-pong (8 B and 1 MiB, steady state, best of 5 repeats)
in 2-rank jobs alternating between that setting and UCX's default (``UCX_TLS=all``),
several jobs of each, and reports each setting's median one-way time per size and
the ratio default / shared-memory-only (above 1: the setting is faster).
"""

from __future__ import annotations

import json
import statistics
import sys

from benchmarks.comm import raw_buffers, raw_one_way
from benchmarks.common import emit, job_env, oversubscribed, quick_main

SIZES = (8, 1 << 20)
SETTINGS = {"shared memory only": None, "UCX default": "all"}  # UCX_TLS


def child(trips_small: int, trips_large: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for nbytes, trips in zip(SIZES, (trips_small, trips_large)):
        a, b = raw_buffers(max(1, nbytes // 8))
        out[nbytes] = min(raw_one_way(comm, a, b, trips) for _ in range(5))
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def run(quick: bool = False) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    jobs = 2 if quick else 5
    trips = ("2000", "200") if quick else ("10000", "1000")
    seconds: dict[str, dict[int, list[float]]] = {s: {n: [] for n in SIZES} for s in SETTINGS}
    argv = ["-c", "import sys, benchmarks.loopback as b; b.child(*map(int, sys.argv[1:]))"]
    for _ in range(jobs):
        for name, tls in SETTINGS.items():
            env = job_env()
            env.pop("UCX_TLS", None)  # unset: run_ranks adds taskgraph's local setting
            if tls is not None:
                env["UCX_TLS"] = tls
            proc = run_ranks(2, [*argv, *trips], timeout=600, capture=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"loopback job ({name}) failed:\n{proc.stderr[-2000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            for n in SIZES:
                seconds[name][n].append(got[str(n)])
    rows = []
    for n in SIZES:
        med = {s: statistics.median(seconds[s][n]) for s in SETTINGS}
        rows.append(
            emit(
                {
                    "suite": "loopback",
                    "bytes": n,
                    "jobs_per_setting": jobs,
                    "shm_only_us": med["shared memory only"] * 1e6,
                    "ucx_default_us": med["UCX default"] * 1e6,
                    "default_over_shm_only": med["UCX default"] / med["shared memory only"],
                    "ranks": 2,
                    "oversubscribed": oversubscribed(2),
                }
            )
        )
    return rows


if __name__ == "__main__":
    quick_main(run, __doc__ or "", sys.argv[1:])
