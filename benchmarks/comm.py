"""Communication: a ping-pong chain of tasks between 2 ranks, against raw mpi4py.

    python -m benchmarks.comm [--quick]      # starts its own mpiexec job of 2 ranks

For each message size (8 B to 16 MiB; ``--quick``: 8 B, 4 KiB, 1 MiB, 16 MiB) a
``TiledMatrix`` of two tiles of that many bytes (float64), one on each rank (a 2 x 1
grid), and a chain of tasks, each reading the other rank's tile and writing its own:
every hop is one task and one tile message (``Isend``/``Irecv`` of the tile's buffer)
from one rank to the other. One-way latency is the time per hop in the steady state,
taken as the difference between a long chain and one a quarter as long
(:func:`short_of`, at least 16 hops), each the best of the repeats, divided by the
hops between them (:func:`best_step`): the run's fixed costs (its start barrier, its
closing agreement) cancel, and so does its warm-up. The first ten or so hops of a run
are slower (1 MiB: 100-190 us against 75 after them), as are the first round trips of
a raw ping-pong after its ranks slept (140, 162, 100, 84, then 70): a 2-hop short
chain, as this suite used before, left that warm-up in every hop's figure (5 us a hop
of a 64-hop chain of 4 MiB). Chains are at most 1,000 hops (``--quick``: 300): the
runtime posts all of a chain's receives ahead and tests them all on every poll, so
much longer chains measure that too.

Each size is measured in two passes over the sizes, 4 repeats a pass (``--quick``:
one pass of 3), and each figure is the best of its size's repeats
(:func:`measure_sizes`): a busy stretch of a shared machine then slows one pass of
every size, not every repeat of one.

Baseline, in the same job, alternating with ours: a raw mpi4py ping-pong,
``comm.Send``/``comm.Recv`` of NumPy buffers of the same size; one-way latency is half
a round trip. It runs three ways: receiving into the buffer it sends from (as NetPIPE
does by default; it has separate buffers only in its cache-defeating ``-I`` mode) and
into a second buffer (as the runtime does: it sends from the tile and receives into a
pooled buffer), both in memory as the runtime's tiles are (huge pages from 1 MiB,
:mod:`taskgraph.dsl.memory`), and into a second buffer of plain ``np.ones`` arrays
(``raw_numpy_us``, what a user's own mpi4py code would have: NumPy asks for huge pages
only from 4 MiB, and gets them for the 2 MiB-aligned stretches only, so that one
varies from job to job). Each is the same difference of a long and a quarter-length
loop as ours. The baseline is the faster of the two ping-pongs that move data as the
chain does, per size: every rank sends from one buffer and receives into another (a
rank of the chain sends its own tile and receives the other's into a pooled buffer).
The one-buffer ping-pong moves the same bytes through half the memory, and from
256 KiB up its time swings either way from run to run on this VM: at 16 MiB 500 us
(2x faster than the two-buffer ones) in one run and 3,636 us (3.3x slower) in the
next, which was 5-9x slower than them from 256 KiB on; the cause is not known. It is
reported beside, with its own ratio (``bandwidth_fraction_same_buffer``), and is not
the target's baseline. NetPIPE-style figures per size: one-way latency (µs) and
bandwidth (MiB/s) of both, ``latency_ratio`` = ours / raw and ``bandwidth_fraction`` =
ours / raw. ``comm_targets``: latency ratio ≤ 5 for
small messages (≤ 4 KiB) and bandwidth fraction ≥ 0.90 from 1 MiB up.
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

import taskgraph as tg
from benchmarks.common import emit, job_env, machine
from taskgraph.core import config
from taskgraph.dsl import memory

KiB, MiB = 1 << 10, 1 << 20
FULL = (8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB)
QUICK = (8, 4 * KiB, MiB, 16 * MiB)
SMALL, LARGE = 4 * KiB, MiB
TARGET_LATENCY_RATIO, TARGET_BANDWIDTH_FRACTION = 5.0, 0.90


@tg.kernel(modes="r,w", dims="mn,mn", name="hop")
def hop(src, dst):
    dst[0, 0] = src[0, 0] + 1.0  # counts the hops, so the end can be checked


def counts(nbytes: int, quick: bool) -> tuple[int, int]:
    """(hops of our chain, round trips of the raw ping-pong) for a size."""
    volume = (64 if quick else 256) * MiB
    # at least 128 hops (--quick: 64): the figure is a difference of two chains, and
    # 16 hops of 16 MiB left it to the noise of a shared machine (0.62-1.0 of raw)
    least = 64 if quick else 128
    hops = int(np.clip(volume // nbytes, least, 300 if quick else 1000))
    trips = int(np.clip(volume // nbytes, least // 2, 2000 if quick else 10000))
    return hops, trips


# -- inside the job ---------------------------------------------------------------------


def short_of(n: int) -> int:
    """The length of the short run whose time is taken from an ``n``-long one's: a
    quarter of it, at least 16, so that both hold the warm-up of a run."""
    return min(n - 1, max(16, n // 4))


def best_step(best: dict[int, float], n: int) -> float:
    """Seconds a step in the steady state, from the best time of an ``n``-step loop
    and of a ``short_of(n)``-step one. Best of each, then the difference: the best of
    differences would pick the repeat whose short loop was slowed by the machine
    (a 4 MiB hop came out at 0.6x raw mpi4py's time that way)."""
    short = short_of(n)
    return (best[n] - best[short]) / (n - short)


def steady(loop, n: int) -> float:
    """Seconds per step of ``loop(steps)`` (which returns its seconds) in the steady
    state: the difference of an ``n``-step and a ``short_of(n)``-step loop."""
    return best_step({m: loop(m) for m in (n, short_of(n))}, n)


def raw_one_way(comm, out: np.ndarray, into: np.ndarray, trips: int) -> float:
    """Seconds per one-way message of a Send/Recv ping-pong (steady state): send
    ``out``, receive into ``into`` (the same array, or another)."""
    return steady(lambda n: raw_loop(comm, out, into, n), trips) / 2


def raw_loop(comm, out: np.ndarray, into: np.ndarray, trips: int) -> float:
    peer = 1 - comm.Get_rank()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(trips):
        if peer == 1:
            comm.Send(out, peer, 7)
            comm.Recv(into, peer, 7)
        else:
            comm.Recv(into, peer, 7)
            comm.Send(out, peer, 7)
    return time.perf_counter() - t0  # all round trips


def polled_loop(comm, out: np.ndarray, into: np.ndarray, trips: int) -> float:
    """Seconds of ``trips`` round trips of a ping-pong of ``Isend``/``Irecv`` completed
    by ``Test`` in a Python loop: not the target's baseline (that is ``Send``/``Recv``),
    reported beside it because it is the faster of the two with the mpich wheel here
    (about 1 us against 1.5-2 for 8 B), and it is how the runtime itself waits."""
    peer = 1 - comm.Get_rank()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(trips):
        if peer == 1:
            send = comm.Isend(out, peer, 7)
            recv = comm.Irecv(into, peer, 7)
        else:
            recv = comm.Irecv(into, peer, 7)
            while not recv.Test():
                pass
            send = comm.Isend(out, peer, 7)
        while not recv.Test():
            pass
        send.Wait()
    return time.perf_counter() - t0  # all round trips


def chain(X: tg.TiledMatrix, hops: int) -> tg.Graph:
    with tg.Graph(f"ping-pong {hops}") as g:
        for k in range(hops):
            a = k % 2
            hop(X[a, 0].r, X[1 - a, 0].w)
    return g


def chain_seconds(cluster, X: tg.TiledMatrix, g: tg.Graph, plan) -> float:
    """One run of the chain from a zero tile; seconds on the slowest rank."""
    for arr in X.tiles.values():
        arr[0, 0] = 0.0
    cluster.barrier()
    run = cluster.run(g, plan=plan).wait()
    hops = g.ntasks
    end = X.tiles.get((hops % 2, 0))
    if end is not None and end[0, 0] != hops:
        raise RuntimeError(f"ping-pong of {hops} hops ended with {end[0, 0]} on its last tile")
    return max(cluster.world.allgather(run.seconds))


def ping_pong(
    nbytes: int, hops: int, short: int | None = None
) -> tuple[tg.TiledMatrix, list[tg.Graph], list]:
    """Two tiles of ``nbytes`` (float64), one on each of 2 ranks, and the chains of
    ``short`` (default ``short_of(hops)``) and of ``hops`` hops between them, planned."""
    n = max(1, nbytes // 8)
    X = tg.TiledMatrix.from_function((2 * n, 1), n, lambda i, j, s: 1.0, grid=(2, 1), name="X")
    graphs = [chain(X, short_of(hops) if short is None else short), chain(X, hops)]
    return X, graphs, [tg.make_plan(g, 2) for g in graphs]


def hop_seconds(cluster, X: tg.TiledMatrix, graphs: list[tg.Graph], plans: list) -> float:
    """Seconds a hop: the long chain minus the short one, over the hops between them
    (the run's fixed costs and its warm-up cancel)."""
    short, long = (chain_seconds(cluster, X, g, p) for g, p in zip(graphs, plans))
    return (long - short) / (graphs[1].ntasks - graphs[0].ntasks)


class SizeRun:
    """The measurements of one message size: its chain and raw buffers, set up and
    warmed once; :meth:`repeat` runs every kind once (they alternate, so each sees the
    machine as it is then), :meth:`result` takes each kind's best."""

    KINDS = ("same", "two", "polled", "numpy", "ours")

    def __init__(self, cluster, nbytes: int, quick: bool):
        self.cluster, self.nbytes = cluster, nbytes
        self.hops, self.trips = counts(nbytes, quick)
        self.X, self.graphs, self.plans = ping_pong(nbytes, self.hops)
        n = nbytes // 8
        self.buf, self.other = raw_buffers(n)
        self.plain, self.plain_other = np.ones(n), np.ones(n)  # NumPy's own, as a user's
        self.comm = cluster.world.comm
        for into in (self.buf, self.other):
            raw_one_way(self.comm, self.buf, into, max(2, self.trips // 10))  # warm
        raw_one_way(self.comm, self.plain, self.plain_other, max(2, self.trips // 10))
        for g, p in zip(self.graphs, self.plans):
            chain_seconds(cluster, self.X, g, p)  # warm: buffers from the pool
        self.best: dict[str, dict[int, float]] = {k: {} for k in self.KINDS}
        self.repeats = 0

    def _keep(self, kind: str, steps: int, seconds: float) -> None:
        self.best[kind][steps] = min(self.best[kind].get(steps, float("inf")), seconds)

    def repeat(self) -> None:
        comm, buf, other, trips = self.comm, self.buf, self.other, self.trips
        for steps in (trips, short_of(trips)):
            self._keep("same", steps, raw_loop(comm, buf, buf, steps))
            self._keep("two", steps, raw_loop(comm, buf, other, steps))
            self._keep("polled", steps, polled_loop(comm, buf, other, steps))
            self._keep("numpy", steps, raw_loop(comm, self.plain, self.plain_other, steps))
        for g, p in zip(self.graphs, self.plans):
            self._keep("ours", g.ntasks, chain_seconds(self.cluster, self.X, g, p))
        self.repeats += 1

    def result(self) -> dict:
        best, trips = self.best, self.trips
        same, two, polled, numpy = (
            best_step(best[k], trips) / 2 for k in ("same", "two", "polled", "numpy")
        )
        ours = best_step(best["ours"], self.hops)
        result = figures(
            self.nbytes, self.hops, trips, self.repeats, ours, baseline(same, two, numpy)
        )
        result["bandwidth_fraction_same_buffer"] = round(same / ours, 3)
        result["raw_same_buffer_us"] = round(same * 1e6, 2)
        result["raw_two_buffers_us"] = round(two * 1e6, 2)
        result["raw_polled_us"] = round(polled * 1e6, 2)
        result["raw_numpy_us"] = round(numpy * 1e6, 2)
        return result


def measure_sizes(cluster, sizes, quick: bool, rounds: int, repeats: int) -> list[dict]:
    """Every size's figures, from ``rounds`` passes over the sizes, each running
    ``repeats`` repeats of one size after another; each figure is the best of its
    size's repeats. A stretch of a busy machine (a second or more, on a shared VM)
    then slows one pass of every size rather than every repeat of one: measured in a
    single pass, an 8 B hop once came out at 14.4 us where 64 B, measured next, took
    9.9. (Going round the sizes one repeat at a time left every size's caches to the
    others: 16 MiB came out at 0.875 and 0.915 of raw in two runs, against 0.90-0.96.)"""
    runs = [SizeRun(cluster, nbytes, quick) for nbytes in sizes]
    for _ in range(rounds):
        for run in runs:
            for _ in range(repeats):
                run.repeat()
    return [run.result() for run in runs]


def baseline(same: float, two: float, numpy: float) -> float:
    """The raw one-way time the chain is held to: like for like, the faster of the two
    ping-pongs that send from one buffer and receive into another (huge pages,
    NumPy's arrays), as every rank of the chain does. ``same``, the one-buffer
    ping-pong, is reported beside and is not a candidate (see the module's doc)."""
    del same
    return min(two, numpy)


def raw_buffers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 buffers of ``n`` for the raw ping-pong, in memory as the runtime's
    tiles are (:func:`taskgraph.dsl.memory.empty_many`: huge pages from 1 MiB), touched as
    the tiles are: no page faults in the timed loops."""
    out = tuple(memory.empty_many([(n,)], np.float64)[0] for _ in range(2))
    for a in out:
        a[:] = 1.0
    return out[0], out[1]


def figures(nbytes: int, hops: int, trips: int, repeats: int, ours: float, raw: float) -> dict:
    return {
        "benchmark": "comm",
        "bytes": nbytes,
        "ranks": 2,
        "hops": hops,
        "raw_round_trips": trips,
        "repeats": repeats,
        "latency_us": round(ours * 1e6, 2),
        "raw_latency_us": round(raw * 1e6, 2),
        "bandwidth_mib_s": round(nbytes / ours / MiB, 2),
        "raw_bandwidth_mib_s": round(nbytes / raw / MiB, 2),
        "latency_ratio": round(ours / raw, 2),
        "bandwidth_fraction": round(raw / ours, 3),
    }


def child(sizes: list[int], quick: bool, out: str) -> None:
    cluster = tg.Cluster()
    if cluster.size != 2:
        raise SystemExit(f"the ping-pong needs 2 ranks, not {cluster.size}")
    rounds, repeats = (1, 3) if quick else (2, 4)
    for result in measure_sizes(cluster, sizes, quick, rounds, repeats):
        if cluster.rank == 0:
            result = emit(result)
            with open(out, "a") as f:
                f.write(json.dumps(result) + "\n")


# -- the parent ---------------------------------------------------------------------------


def targets(results: list[dict]) -> dict:
    small = [r["latency_ratio"] for r in results if r["bytes"] <= SMALL]
    large = [r["bandwidth_fraction"] for r in results if r["bytes"] >= LARGE]
    worst_latency, worst_bandwidth = max(small), min(large)
    return emit(
        {
            "benchmark": "comm_targets",
            "target_small_latency_ratio": TARGET_LATENCY_RATIO,
            "worst_small_latency_ratio": worst_latency,
            "target_large_bandwidth_fraction": TARGET_BANDWIDTH_FRACTION,
            "worst_large_bandwidth_fraction": worst_bandwidth,
            "met": worst_latency <= TARGET_LATENCY_RATIO
            and worst_bandwidth >= TARGET_BANDWIDTH_FRACTION,
            "machine": machine(),
        }
    )


def run(quick: bool = False) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    sizes = QUICK if quick else FULL
    env = job_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "comm.jsonl")
        argv = ["-m", "benchmarks.comm", "--child", out, *map(str, sizes)]
        argv += ["--quick"] if quick else []
        sys.stdout.flush()
        proc = run_ranks(2, argv, timeout=600 if quick else 1800, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-rank ping-pong job failed ({proc.returncode})")
        results = [json.loads(line) for line in Path(out).read_text().splitlines()]
    return results + [targets(results)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 sizes, fewer round trips")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if not config.use_mpi():
            raise SystemExit("--child runs inside the 2-rank job")
        child([int(s) for s in args.child[1:]], args.quick, args.child[0])
        return
    run(quick=args.quick)


if __name__ == "__main__":
    main()
