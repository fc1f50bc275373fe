"""Notebook clusters against ipyparallel itself and against batch, in the same run.

    python -m benchmarks.cluster [--engines 2 4] [--n 4096] [--tile 512]

Prints one JSON object per figure:
- start: seconds for ``tg.Cluster(n)`` (controller, engines under mpiexec, the rank
  check) against ``ipp.Cluster(n, engines="mpi").start_and_connect_sync()``;
- round trip: an empty graph through ``cluster.run(g).wait()`` against an
  ``apply_sync`` of an empty function on the same engines;
- Cholesky GFLOP/s through the cluster against the same graph run in batch under
  ``mpiexec`` (``taskgraph demo --json``), with the same ranks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import taskgraph as tg
from taskgraph.core import config
from taskgraph.core.machine import describe
from taskgraph.linalg import cholesky, cholesky_flops


def emit(**fields) -> dict:
    fields.setdefault("machine", describe())
    print(json.dumps(fields), flush=True)
    return fields


def ipp_start(n: int) -> float:
    import ipyparallel as ipp

    t0 = time.perf_counter()
    c = ipp.Cluster(n=n, engines="mpi", controller_ip="127.0.0.1", log_level=40)
    c.config.MPILauncher.mpi_cmd = [config.mpiexec()]
    c.start_and_connect_sync()
    seconds = time.perf_counter() - t0
    c.stop_cluster_sync()
    return seconds


def empty():
    return None


def round_trips(cluster, repeats: int = 20) -> tuple[float, float]:
    g = tg.Graph("empty")
    cluster.run(g).wait()  # warm
    t0 = time.perf_counter()
    for _ in range(repeats):
        cluster.run(g).wait()
    graph_rt = (time.perf_counter() - t0) / repeats
    view = cluster.client[cluster.engine_ids]
    view.apply_sync(empty)
    t0 = time.perf_counter()
    for _ in range(repeats):
        view.apply_sync(empty)
    apply_rt = (time.perf_counter() - t0) / repeats
    return graph_rt, apply_rt


def batch_gflops(ranks: int, n: int, tile: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskgraph.batch.cli",
            "demo",
            "--ranks",
            str(ranks),
            "--n",
            str(n),
            "--tile",
            str(tile),
            "--no-check",
            "--json",
            "--repeat",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["gflops"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, nargs="+", default=[2, 4])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--tile", type=int, default=512)
    args = p.parse_args(argv)
    cores = config.cores()
    for n in args.engines:
        ipp_s = ipp_start(n)
        t0 = time.perf_counter()
        cluster = tg.Cluster(n=n)
        ours = time.perf_counter() - t0
        emit(
            benchmark="cluster_start",
            engines=n,
            oversubscribed=n > cores,
            taskgraph_s=round(ours, 2),
            ipyparallel_s=round(ipp_s, 2),
            ratio=round(ours / ipp_s, 2),
        )
        graph_rt, apply_rt = round_trips(cluster)
        emit(
            benchmark="empty_graph_round_trip",
            engines=n,
            oversubscribed=n > cores,
            run_ms=round(graph_rt * 1e3, 2),
            apply_sync_ms=round(apply_rt * 1e3, 2),
            ratio=round(graph_rt / apply_rt, 2),
        )
        A = tg.TiledMatrix.random_spd(args.n, args.tile, cluster=cluster)
        g = cholesky(A)
        cluster.run(g).wait()  # compile and warm up
        A = tg.TiledMatrix.random_spd(args.n, args.tile, cluster=cluster)
        run = cluster.run(cholesky(A)).wait()
        via_cluster = cholesky_flops(args.n) / run.seconds / 1e9
        cluster.close()
        via_batch = batch_gflops(n, args.n, args.tile)
        emit(
            benchmark="cholesky_cluster_vs_batch",
            engines=n,
            oversubscribed=n > cores,
            n=args.n,
            tile=args.tile,
            cluster_gflops=round(via_cluster, 1),
            batch_gflops=round(via_batch, 1),
            ratio=round(via_cluster / via_batch, 3),
            cluster_wall_s=round(run.wall_seconds, 3),
            cluster_run_s=round(run.seconds, 3),
        )


if __name__ == "__main__":
    main()
