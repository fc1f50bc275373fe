"""Why tiles live on huge pages: a raw mpi4py ping-pong on three kinds of memory.

    python -m benchmarks.pages [--quick]      # starts a 2-rank job of its own

Raw mpi4py, no taskgraph in the timed loops: a ``Send``/``Recv`` ping-pong (two
buffers, as the comm suite's baseline) of 256 KiB to 16 MiB, with the buffers

- ``numpy``: ``np.ones`` arrays, as a user's own code has them (NumPy advises huge
  pages from 4 MiB, and only an array's 2 MiB-aligned stretches can get them);
- ``small_pages``: the same with NumPy's advice turned off (4 KiB pages only);
- ``huge_pages``: carved from :func:`taskgraph.dsl.memory.huge_block` (2 MiB-aligned,
  advised), as the runtime's tiles and receive buffers are.

One-way µs per message (the steady-state difference of a long and a quarter-length
loop, best of 5, as in the comm suite), the huge pages each rank's process had
(``AnonHugePages``), and ``huge_vs_numpy``: how many times faster the huge-page
buffers moved than NumPy's. Between ranks on one node MPICH moves a large message in
one copy, reading the other process's pages, and that copy walks page tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.comm import best_step, raw_loop, short_of
from benchmarks.common import emit, job_env
from taskgraph.dsl import memory

KiB, MiB = 1 << 10, 1 << 20
SIZES = (256 * KiB, MiB, 4 * MiB, 16 * MiB)
KINDS = ("numpy", "small_pages", "huge_pages")


def anon_huge_mib() -> float:
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def buffers(kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "huge_pages":
        out = tuple(
            memory.carve(memory.huge_block(8 * n), 0, (n,), np.dtype(np.float64)) for _ in "ab"
        )
        for a in out:
            a[:] = 1.0
        return out[0], out[1]
    if kind == "small_pages":
        core = getattr(np, "_core", None) or np.core  # (NumPy 2 / 1)
        advise = core.multiarray._set_madvise_hugepage
        was = advise(False)
        try:
            return np.ones(n), np.ones(n)
        finally:
            advise(was)
    return np.ones(n), np.ones(n)


def child(out: str, sizes: list[int], repeats: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    for nbytes in sizes:
        trips = int(np.clip(64 * MiB // nbytes, 32, 512))
        for kind in KINDS:
            before = anon_huge_mib()
            buf, other = buffers(kind, nbytes // 8)
            raw_loop(comm, buf, other, 8)  # warm
            best: dict[int, float] = {}
            for _ in range(repeats):
                for n in (trips, short_of(trips)):
                    best[n] = min(best.get(n, float("inf")), raw_loop(comm, buf, other, n))
            huge = comm.gather(round(anon_huge_mib() - before, 1))
            if comm.rank == 0:
                row = {
                    "bytes": nbytes,
                    "kind": kind,
                    "one_way_us": best_step(best, trips) / 2 * 1e6,
                }
                with open(out, "a") as f:
                    f.write(json.dumps({**row, "anon_huge_mib": huge}) + "\n")
            del buf, other


def run(quick: bool = False) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    sizes = (MiB, 16 * MiB) if quick else SIZES
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pages.jsonl")
        argv = ["-m", "benchmarks.pages", "--child", out, "--repeats", str(3 if quick else 5)]
        sys.stdout.flush()
        proc = run_ranks(2, [*argv, *map(str, sizes)], timeout=600, env=job_env())
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-rank ping-pong job failed ({proc.returncode})")
        rows = [json.loads(line) for line in Path(out).read_text().splitlines()]
    results = []
    for nbytes in sizes:
        us = {r["kind"]: r for r in rows if r["bytes"] == nbytes}
        result = {"benchmark": "pages", "bytes": nbytes, "ranks": 2}
        for kind in KINDS:
            result[f"{kind}_us"] = round(us[kind]["one_way_us"], 2)
            result[f"{kind}_anon_huge_mib"] = us[kind]["anon_huge_mib"]
        result["huge_vs_numpy"] = round(result["numpy_us"] / result["huge_pages_us"], 2)
        results.append(emit(result))
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 16 MiB, best of 3")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("sizes", nargs="*", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.sizes, args.repeats)
        return
    run(quick=args.quick)


if __name__ == "__main__":
    main()
