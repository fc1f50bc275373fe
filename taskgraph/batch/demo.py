"""``taskgraph demo``: tiled Cholesky of a random SPD matrix, checked and measured.

Every rank runs :func:`main`; rank 0 prints. Steps: compile the kernels (timed
apart), measure the GEMM peak on as many threads as the run uses (ranks x workers),
factorise, measure the peak again after every factorisation (before, between and
after: the best of every measurement counts, since a busy moment only ever makes
one low), gather the factor on rank 0 and compute ‖A − L Lᵀ‖ / ‖A‖. A run faster
than the peak measured is a measurement error: no fraction is reported (None in the
JSON), and the demo says so.

Every option is checked before any rank starts (:func:`parser`): a bad value ends in
one line naming the option and what it allows, exit code 2. A tile larger than n is
clamped to n, and a run that cannot use its ranks, or is too short to time, says so
in a ``note`` line (``notes`` in the JSON).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys

import numpy as np

from .. import calibrate
from ..cluster.job import JobCluster, compile_kernels
from ..core import affinity, config
from ..core.machine import describe, gemm_peak
from ..dsl.tiled import TiledMatrix, spd_dense
from ..linalg import cholesky, cholesky_flops, cholesky_residual

TOLERANCE = {"float64": 1e-12, "float32": 1e-4}
PEAK_REPEATS = 5  # GEMMs timed in each peak measurement (the fastest counts)
# a run shorter than this is mostly the runtime's fixed cost (start, first messages,
# the end's barrier: ms): its GFLOP/s say little about the kernels
SHORT_RUN_S = 0.1


def fraction_of_peak(gflops: float, peak: float) -> tuple[float | None, bool]:
    """The run's speed as a fraction of the measured GEMM peak, and whether that is a
    measurement error (then None): a run cannot beat the peak, so a higher figure
    means every peak measurement was low (a busy machine), not that the run was
    faster."""
    if peak <= 0 or gflops > peak:
        return None, True
    return gflops / peak, False


class _Parser(argparse.ArgumentParser):
    """argparse, refusing a bad option in one line (argparse's own adds 4 of usage)."""

    def error(self, message: str):
        """Print ``message`` and exit with code 2, as argparse does."""
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")


def long_enough_n(n: int, seconds: float) -> int:
    """The multiple of 1024 at which a run that took ``seconds`` at order ``n`` would
    take about twice SHORT_RUN_S (its time grows as n cubed): the order to suggest."""
    want = n * (2 * SHORT_RUN_S / max(seconds, 1e-6)) ** (1 / 3)
    return max(1024, -(-int(want) // 1024) * 1024)


def at_least(low: int):
    """An argparse type: an integer of at least ``low`` (a bad value is named, with the
    range: argparse adds the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer, at least {low} (got {text})")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (got {text})")
    return value


def parser() -> argparse.ArgumentParser:
    """The demo's options, each checked for its range as it is parsed."""
    p = _Parser(
        prog="taskgraph demo",
        description="Tiled Cholesky of a random SPD matrix on local MPI ranks, verified.",
    )
    p.add_argument("--ranks", type=at_least(1), default=2, help="MPI ranks (default 2)")
    p.add_argument(
        "--workers",
        type=at_least(1),
        default=None,
        help="worker threads per rank (default: cores / ranks)",
    )
    p.add_argument("--n", type=at_least(1), default=4096, help="matrix order (default 4096)")
    p.add_argument(
        "--tile",
        type=at_least(1),
        default=None,
        help="tile size, at most n (default: chosen from this machine's measured kernel speeds)",
    )
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument(
        "--repeat",
        type=at_least(1),
        default=1,
        help="factorise this many fresh "
        "matrices in the same processes and report the fastest (default 1)",
    )
    p.add_argument("--no-check", action="store_true", help="skip the residual check")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=1800,
        help="seconds before the job is killed (default 1800)",
    )
    return p


def fit_tile(n: int, tile: int, threads: int) -> tuple[int, list[str]]:
    """The tile a matrix of order ``n`` is cut in (``tile``, at most n), and notes for
    a user of ``threads`` threads: a tile larger than n is clamped, and a matrix of
    one tile is one task, which leaves every thread but one idle."""
    notes = []
    if tile > n:
        notes.append(f"tile {tile} is larger than n={n}: clamped to {n}")
        tile = n
    if tile == n and threads > 1:
        notes.append(
            f"the matrix is one tile, so one task: it runs on 1 of the {threads} threads, "
            f"and the fraction is of the {threads}-thread peak (a tile of n/4 or less "
            "gives every rank work)"
        )
    return tile, notes


def node_peak(threads: int, dtype) -> float:
    """The GEMM peak on ``threads`` of this node's cores (at most all of them), from one
    rank: on all of the node's CPUs meanwhile, though the rank is bound to a share."""
    with affinity.whole_node():
        return gemm_peak(min(threads, config.cores()), dtype, repeats=PEAK_REPEATS)


def main(argv: list[str] | None = None) -> int:
    """The demo on this rank (called on every rank of the job)."""
    args = parser().parse_args(argv)
    cluster = JobCluster(workers=args.workers)
    world = cluster.world
    assert world is not None  # (every rank of the demo's job is in its cluster)
    dtype = np.dtype(args.dtype)
    threads = cluster.size * cluster.workers
    why = "given"
    if args.tile is None:  # rank 0 measures (the others wait asleep), every rank uses it
        if cluster.rank == 0 and not calibrate.cached(dtype):  # (seconds: say why it waits)
            print(
                "calibrating tile sizes for this machine, once: timing the Cholesky kernels "
                f"at {len(calibrate.CANDIDATES)} tile sizes (a few seconds; kept in "
                f"{calibrate.cache_dir()})",
                flush=True,
            )
        choice = cluster.cholesky_tile(args.n, dtype)
        args.tile, why = choice.tile, choice.why()
    args.tile, notes = fit_tile(args.n, args.tile, threads)
    A = TiledMatrix.random_spd(args.n, args.tile, dtype, seed=args.seed, cluster=cluster)
    graph = cholesky(A)
    compile_s = compile_kernels(graph)
    cluster.barrier()
    peak = node_peak(threads, dtype) if cluster.rank == 0 else 0.0
    seconds = float("inf")
    run = None
    for attempt in range(args.repeat):
        if attempt:  # a fresh matrix: the factor is overwritten in place
            del A, graph, run  # the last one first: a rank holds one matrix at a time
            gc.collect()
            A = TiledMatrix.random_spd(args.n, args.tile, dtype, seed=args.seed, cluster=cluster)
            graph = cholesky(A)
        cluster.barrier()
        run = cluster.run(graph).wait()
        seconds = min(seconds, max(world.allgather(run.seconds)))
        if cluster.rank == 0:  # again after each run (the others sleep in the barrier):
            # a shared machine's noisy neighbour can depress one measurement; keep the best
            peak = max(peak, node_peak(threads, dtype))
        cluster.barrier()
    # peak resident memory of every rank, against its share of the matrix
    rss = world.allgather(peak_rss_mib())
    share = world.allgather(sum(t.nbytes for t in A.tiles.values()) / 2**20)
    residual = None
    factor = A.gather(root=0) if not args.no_check else None
    if cluster.rank != 0:
        return 0
    if factor is not None:
        residual = cholesky_residual(spd_dense(args.n, args.tile, dtype, args.seed), factor)
    gflops = cholesky_flops(args.n) / seconds / 1e9
    fraction, noisy = fraction_of_peak(gflops, peak)
    if seconds < SHORT_RUN_S:
        notes.append(
            f"{seconds * 1e3:.1f} ms is too short to time the kernels: the runtime's fixed "
            f"cost of a few ms dominates (try --n {long_enough_n(args.n, seconds)} or more)"
        )
    result = {
        "n": args.n,
        "tile": args.tile,
        "tile_why": why,
        "dtype": args.dtype,
        "ranks": cluster.size,
        "workers_per_rank": cluster.workers,
        "threads": threads,
        "oversubscribed": threads > config.cores(),
        "tasks": graph.ntasks,
        "seconds": figure(seconds, 4),
        "gflops": figure(gflops, 2),
        "gemm_peak_gflops": round(peak, 2),
        "fraction_of_peak": None if fraction is None else figure(fraction, 3),
        "peak_error": noisy,
        "peak_measurements": 1 + args.repeat,
        "residual": residual,
        "compile_seconds": round(compile_s, 2),
        "repeats": args.repeat,
        "notes": notes,
        "peak_rss_mib": [round(x, 1) for x in rss],
        "matrix_share_mib": [round(x, 1) for x in share],
        "machine": describe(),
    }
    ok = residual is None or residual < TOLERANCE[args.dtype]
    report(result, ok, args.json)
    return 0 if ok else 1


def figure(x: float, places: int) -> float:
    """``x`` rounded to ``places`` decimals, or to 3 significant digits where that
    would leave fewer (a tiny run's 0.0256 GFLOP/s is not 0.03, nor 0.0)."""
    return round(x, places) if x == 0 or abs(x) >= 10 ** -(places - 2) else float(f"{x:.3g}")


def shown(x: float, unit: str = "") -> str:
    """``x`` printed with one decimal, or 3 significant digits when it is under 1."""
    return f"{x:.1f}{unit}" if abs(x) >= 1 or x == 0 else f"{x:.3g}{unit}"


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report(r: dict, ok: bool, as_json: bool) -> None:
    over = "  (oversubscribed: more threads than cores)" if r["oversubscribed"] else ""
    gemm = "DGEMM" if r["dtype"] == "float64" else "SGEMM"
    used = min(r["threads"], r["machine"]["cores"])
    lines = [
        f"tiled Cholesky  n={r['n']}  tile={r['tile']}  {r['dtype']}  ({r['tasks']} "
        f"task{'s' if r['tasks'] != 1 else ''})",
        f"ranks={r['ranks']}  workers/rank={r['workers_per_rank']}{over}",
        *(
            [f"tile            chosen by calibration: {r['tile_why']} (--tile to override)"]
            if r.get("tile_why", "given") != "given"
            else []
        ),
        f"time            {r['seconds']:.3f} s   (kernels compiled before: "
        f"{r['compile_seconds']:.2f} s)",
        f"speed           {shown(r['gflops'])} GFLOP/s",
        f"{gemm} peak      {r['gemm_peak_gflops']:.1f} GFLOP/s on {used} threads, the best of "
        f"{r.get('peak_measurements', 2)} measurements in this run (before and after each "
        "factorisation)",
        (
            "fraction        not reported: the run beat every peak measurement, so the "
            "machine was busy while they ran (a measurement error, not a result)"
            if r.get("fraction_of_peak") is None
            else f"fraction        {shown(100 * r['fraction_of_peak'], '%')} of peak"
        ),
        *(f"note            {note}" for note in r.get("notes", ())),
        "memory          peak "
        + ", ".join(f"{m:.0f}" for m in r["peak_rss_mib"])
        + " MiB per rank; matrix share "
        + ", ".join(f"{m:.0f}" for m in r["matrix_share_mib"])
        + " MiB",
    ]
    if r["residual"] is not None:
        verdict = "ok" if ok else "TOO LARGE"
        lines.append(f"residual        ‖A − LLᵀ‖/‖A‖ = {r['residual']:.2e}  ({verdict})")
    print("\n".join(lines))
    if as_json:
        print(json.dumps(r))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
