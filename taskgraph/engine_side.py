"""What runs on an ipyparallel engine: one engine is one MPI rank.

The notebook (:mod:`taskgraph.engines`) calls these functions on every engine with
``apply``. Each engine keeps, per process, the matrices made for the notebook (by
uid) and the graphs of recent runs (for fetching their values later).

A run executes on the engine's own ranks exactly as in a batch job (the same
:class:`~taskgraph.cluster.Run` and executor); the engine's main thread meanwhile
publishes progress and event batches every ``interval`` seconds with ipyparallel's
data publication, each under a key of its own (``b000001``, ...), so the notebook's
``AsyncResult.data`` collects every batch while the run is going. A SIGINT sent to the
engines (``Client.send_signal``) arrives there as KeyboardInterrupt and cancels the run
on every rank.
"""

from __future__ import annotations

import os
import socket
import time
from collections import OrderedDict

import cloudpickle

from .cluster import current_cluster
from .errors import TaskgraphError
from .graph import Graph
from .tiled import TiledMatrix

MATRICES: dict[int, TiledMatrix] = {}
RUNS: OrderedDict[str, Graph] = OrderedDict()  # run id -> graph, the latest few
KEEP_RUNS = 8


def whoami(token: str | None = None) -> dict:
    """This engine's rank, world size, host and pid; ``token`` as rank 0 sent it."""
    c = current_cluster()
    seen = c.world.bcast(token, root=0) if c.size > 1 else token
    return {
        "rank": c.rank,
        "size": c.size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "workers": c.workers,
        "single_copy": c.world.single_copy,
        "token": seen,
    }


def build_matrix(spec: dict, fill: bytes | None) -> int:
    """Make this rank's tiles of a matrix described by ``spec``; fill them."""
    a = TiledMatrix(**spec, cluster=current_cluster())
    if fill is not None:
        fn = cloudpickle.loads(fill)
        for (i, j), t in a.tiles.items():
            t[...] = fn(i, j, t.shape)
    MATRICES[a.uid] = a
    return len(a.tiles)


def put_tiles(uid: int, tiles: dict) -> int:
    a = matrix(uid)
    for ij, t in tiles.items():
        a.tiles[ij][...] = t
    return len(tiles)


def get_tiles(uid: int) -> dict:
    return dict(matrix(uid).tiles)


def forget_matrix(uid: int) -> None:
    MATRICES.pop(uid, None)


def matrix(uid: int) -> TiledMatrix:
    try:
        return MATRICES[uid]
    except KeyError:
        raise TaskgraphError(
            f"matrix {uid} does not exist on rank {current_cluster().rank}: "
            "was the cluster restarted since it was made?"
        ) from None


def compile_kernels(dtypes=("float64", "float32")) -> float:
    from taskgraph.kernels import compile_all

    return compile_all(dtypes)["total"]


def run_graph(payload: bytes, run_id: str, forget=(), interval: float = 0.25) -> dict:
    """Run this rank's share of a planned graph; publish progress while it runs.
    First drop the matrices in ``forget`` (freed in the notebook since the last run)."""
    for uid in forget:
        forget_matrix(uid)
    plan, workers, blas_threads, trace = cloudpickle.loads(payload)
    cluster = current_cluster()
    run = cluster.run(
        plan.graph, workers=workers, blas_threads=blas_threads, plan=plan, trace=trace
    )
    publish = _publisher()
    seq, cursor = 0, (0, 0)
    t0 = time.perf_counter()
    try:
        while not run.done():
            run.join(interval)
            seq, cursor = _publish_batch(publish, run, seq, cursor, t0)
    except KeyboardInterrupt:
        run.cancel("interrupted from the notebook")
        run.join()
    seq, cursor = _publish_batch(publish, run, seq, cursor, t0, final=True)
    RUNS[run_id] = plan.graph
    while len(RUNS) > KEEP_RUNS:
        RUNS.popitem(last=False)
    error = None
    try:
        run.wait()
    except TaskgraphError as exc:
        error = exc
    return {
        "rank": cluster.rank,
        "seconds": run.seconds,
        "compile_seconds": run.compile_seconds,
        "stats": run.stats.as_dict(),
        "values": sorted(plan.graph.results),
        "error": error,
        "batches": seq,
    }


def _publisher():
    try:
        from ipyparallel.datapub import publish_data

        publish_data({})  # fails outside an engine's execution
        return publish_data
    except Exception:  # noqa: BLE001 - not on an engine: nothing to publish to
        return None


def _publish_batch(publish, run, seq: int, cursor, t0: float, final: bool = False):
    ex = run.executor
    if publish is None or ex is None:
        return seq, cursor
    batch, cursor = ex.trace.batch(cursor)
    done, total = ex.progress()
    seq += 1
    batch.update(done=done, total=total, elapsed=time.perf_counter() - t0, final=final)
    publish({f"b{seq:06d}": batch})
    return seq, cursor


def result(run_id: str, task: int):
    """The value of a task of a recent run, from this rank."""
    graph = RUNS.get(run_id)
    if graph is None:
        raise TaskgraphError(f"run {run_id} is no longer kept on this engine")
    return graph.results[task]
