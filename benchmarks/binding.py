"""Ranks bound to cores of their own, against ranks left unbound: run-to-run spread.

    python -m benchmarks.binding [--quick]     # starts 2-rank jobs of its own

The comm suite's ping-pong chain of 8-byte hops (1,000 hops; ``--quick``: 300), run
again and again (30 times; ``--quick``: 12) in 2-rank jobs started by MPICH's
``mpiexec``, which binds no rank: jobs with ``TASKGRAPH_BIND=0`` (the ranks stay
unbound) and jobs where each rank binds itself to its share of the node's CPUs
(:mod:`taskgraph.core.affinity`), alternating, two jobs of each. Per setting: the
distribution of a run's seconds (the slower rank's) and how many runs took more than
twice the fastest run of both settings (``slow_runs``): a rank's threads sharing a
core with the other rank's for a whole run make its hops several times as long.
The summary row is the ratio of unbound to bound at the median and at the 90th
percentile; with fewer CPUs than ranks nothing binds, and the figures say so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import taskgraph as tg
from benchmarks.comm import chain_seconds, ping_pong
from benchmarks.common import emit, job_env, machine
from taskgraph.core import config

SETTINGS = ("0", "auto")  # TASKGRAPH_BIND


def child(out: str, hops: int, runs: int) -> None:
    cluster = tg.Cluster()
    X, graphs, plans = ping_pong(8, hops, short=2)
    g, p = graphs[1], plans[1]
    for _ in range(3):
        chain_seconds(cluster, X, g, p)  # warm
    seconds = [chain_seconds(cluster, X, g, p) for _ in range(runs)]
    bound = cluster.world.allgather(cluster.world.bound_cpus)
    if cluster.rank == 0:
        with open(out, "a") as f:
            f.write(json.dumps({"seconds": seconds, "bound_cpus": bound}) + "\n")


def job(setting: str, out: str, hops: int, runs: int) -> dict:
    from taskgraph.cluster.launch import run_ranks

    argv = ["-m", "benchmarks.binding", "--child", out, "--hops", str(hops), "--runs", str(runs)]
    sys.stdout.flush()
    proc = run_ranks(2, argv, timeout=600, env=job_env(TASKGRAPH_BIND=setting))
    if proc.returncode != 0:
        raise RuntimeError(f"the 2-rank job with TASKGRAPH_BIND={setting} failed")
    return json.loads(Path(out).read_text().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    hops, runs = (300, 12) if quick else (1000, 30)
    got: dict[str, list[float]] = {s: [] for s in SETTINGS}
    bound: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2):
            for setting in SETTINGS:
                row = job(setting, os.path.join(tmp, f"{setting}-{i}.json"), hops, runs // 2)
                got[setting] += row["seconds"]
                bound[setting] = row["bound_cpus"]
    fastest = min(min(v) for v in got.values())
    results = []
    for setting in SETTINGS:
        ms = np.array(got[setting]) * 1e3
        results.append(
            emit(
                {
                    "benchmark": "binding",
                    "bind": setting,
                    "ranks": 2,
                    "cores": config.cores(),
                    "bound_cpus": bound[setting],
                    "hops": hops,
                    "runs": len(ms),
                    "min_ms": round(float(ms.min()), 2),
                    "median_ms": round(float(np.median(ms)), 2),
                    "p90_ms": round(float(np.percentile(ms, 90)), 2),
                    "max_ms": round(float(ms.max()), 2),
                    "median_hop_us": round(float(np.median(ms)) * 1e3 / hops, 2),
                    "slow_runs": int((ms > 2e3 * fastest).sum()),
                }
            )
        )
    unbound, bound_ = results
    results.append(
        emit(
            {
                "benchmark": "binding_summary",
                "median_unbound_over_bound": round(unbound["median_ms"] / bound_["median_ms"], 2),
                "p90_unbound_over_bound": round(unbound["p90_ms"] / bound_["p90_ms"], 2),
                "slow_runs_unbound": unbound["slow_runs"],
                "slow_runs_bound": bound_["slow_runs"],
                "runs": unbound["runs"],
                "machine": machine(),
            }
        )
    )
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="300 hops, 12 runs a setting")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--hops", type=int, default=1000, help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=15, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.hops, args.runs)
        return
    run(quick=args.quick)


if __name__ == "__main__":
    main()
