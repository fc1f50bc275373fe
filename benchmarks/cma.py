"""Single-copy transfers: why the runtime turns on MPICH's cross-memory attach (CMA).

    python -m benchmarks.cma [--quick]      # starts two 2-rank jobs of its own

Raw mpi4py, no taskgraph in the timed loops. For 1, 4 and 16 MiB messages, a
ping-pong of NumPy buffers in three ways: blocking ``Send``/``Recv``, and
``Isend``/``Irecv`` tested in a loop with 0, 5 and 20 µs of Python work between two
tests, as a runtime that does its bookkeeping between polls does. Each way runs in
one job with single-copy transfers off (``MPIR_CVAR_CH4_CMA_ENABLE=0``) and one with
them on; the figure is the one-way time per message (best of 3), and the ratio is
each polled way against the blocking baseline of the same job. Without CMA, MPICH
moves a large message through shared-memory cells a chunk at a time, only while both
ranks are inside MPI, so the time grows with the work between tests; with it the
receiver reads the sender's buffer in one copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit, job_env

MiB = 1 << 20
SIZES = (MiB, 4 * MiB, 16 * MiB)
GAPS_US = (0, 5, 20)


def busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def one_way(comm, out: np.ndarray, into: np.ndarray, trips: int, gap_us: float | None) -> float:
    """Seconds per message; ``gap_us`` None: blocking calls, else Test loops."""
    rank = comm.Get_rank()
    peer = 1 - rank
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(trips):
        for sending in (rank == 0, rank != 0):
            if gap_us is None:
                if sending:
                    comm.Send(out, peer, 7)
                else:
                    comm.Recv(into, peer, 7)
                continue
            req = comm.Isend(out, peer, 7) if sending else comm.Irecv(into, peer, 7)
            while not req.Test():
                busy(gap_us)
    return (time.perf_counter() - t0) / (2 * trips)


def child(out_path: str, quick: bool) -> None:
    from taskgraph.run.comm import world

    comm = world().comm
    cma = os.environ.get("MPIR_CVAR_CH4_CMA_ENABLE", "0") == "1"
    for nbytes in SIZES[:2] if quick else SIZES:
        out, into = np.ones(nbytes // 8), np.ones(nbytes // 8)  # touched: no page faults
        trips = max(8, (64 if quick else 256) * MiB // nbytes // 4)
        one_way(comm, out, into, 2, None)
        times = {}
        for gap in (None, *GAPS_US):
            times[gap] = min(one_way(comm, out, into, trips, gap) for _ in range(3))
        if comm.Get_rank() == 0:
            result = {
                "benchmark": "cma",
                "single_copy": cma,
                "bytes": nbytes,
                "round_trips": trips,
                "blocking_us": round(times[None] * 1e6, 1),
            }
            for gap in GAPS_US:
                result[f"polled_{gap}us_us"] = round(times[gap] * 1e6, 1)
                result[f"polled_{gap}us_vs_blocking"] = round(times[gap] / times[None], 2)
            with open(out_path, "a") as f:
                f.write(json.dumps(result) + "\n")


def run(quick: bool = False) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for cma in ("0", "1"):
            out = os.path.join(tmp, f"cma{cma}.jsonl")
            env = job_env(MPIR_CVAR_CH4_CMA_ENABLE=cma)
            argv = ["-m", "benchmarks.cma", "--child", out] + (["--quick"] if quick else [])
            sys.stdout.flush()
            proc = run_ranks(2, argv, timeout=600, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"the 2-rank job (CMA {cma}) failed ({proc.returncode})")
            results += [emit(json.loads(x)) for x in Path(out).read_text().splitlines()]
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 4 MiB, fewer round trips")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.quick)
        return
    run(quick=args.quick)


if __name__ == "__main__":
    main()
