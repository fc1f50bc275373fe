"""Tile sizes chosen by measurement: the Cholesky kernels' speeds at a few tile sizes on
this machine, measured once (about a second) and cached per CPU, BLAS and dtype.

    >>> choice = tg.calibrate.cholesky_tile(8192, cores=2)
    >>> choice.tile, choice.why()

The model that turns the speeds into a tile is :mod:`taskgraph.plan.tilesize`. The
cache lives in ``$TASKGRAPH_CACHE`` (default ``$XDG_CACHE_HOME/taskgraph``, else
``~/.cache/taskgraph``), one JSON file per (CPU model, vector ISA, BLAS, dtype):
another machine, or a new BLAS, measures afresh. ``refresh=True`` measures again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from .core import affinity, config
from .core.machine import blas, cpu_model, gemm_peak, vector_isa
from .plan.tilesize import Choice, choose

CANDIDATES = (128, 192, 256, 384, 512, 768, 1024)
REPEATS = 3  # calls of each kernel at each size (the fastest counts)
VERSION = 3  # of the kernels and the way they are timed: an older cache is measured again
# at least this many bytes are written between the calls the calibration times (twice
# the largest cache, where it is known), to push their operands out of the caches: in a
# run a task's tiles come from a matrix far larger than them. Timed in cache, tile 512
# float32 gemm ran 10 % faster than in a 2-rank Cholesky on the AMD VM, and the
# calibration chose 512 where 1024 ran 0.86 of the peak against 0.78
EVICT_BYTES = 64 << 20


def cache_dir() -> Path:
    """Where the measurements are kept."""
    env = os.environ.get("TASKGRAPH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taskgraph"


def machine_key(dtype) -> str:
    """What a measurement holds for: this CPU, its vector ISA, the BLAS and ``dtype``."""
    what = f"{cpu_model()}|{vector_isa()}|{blas()}|{np.dtype(dtype).name}|v{VERSION}"
    return hashlib.sha1(what.encode()).hexdigest()[:16]


@functools.cache
def evict_bytes() -> int:
    """Bytes to write to push data out of every cache: twice the largest cache the
    kernel reports for CPU 0 (Linux sysfs), at least ``EVICT_BYTES``."""
    largest = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * unit)
    return max(EVICT_BYTES, 2 * largest)


def eviction_buffer() -> np.ndarray:
    """A scratch array of :func:`evict_bytes` bytes: writing it pushes data out of
    every cache (made once by a caller that times many calls)."""
    return np.empty(evict_bytes() // 8)


def best_seconds(
    fn, operands: list[np.ndarray], repeats: int = REPEATS, cold: np.ndarray | None = None
) -> float:
    """The fastest of ``repeats`` calls of ``fn`` on fresh F-ordered copies of ``operands``
    (in cache, as a tile just written is; with ``cold``, an :func:`eviction_buffer`
    written before each call: out of every cache, as the tiles of a large matrix are)."""
    best = float("inf")
    for _ in range(repeats):
        fresh = [np.array(a, order="F") for a in operands]
        if cold is not None:
            cold.fill(1.0)  # (written after the copies: they leave the caches)
        t0 = time.perf_counter()
        fn(*fresh)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(dtype=np.float64, tiles=CANDIDATES, repeats: int = REPEATS) -> dict:
    """Each Cholesky kernel's GFLOP/s on one thread at each tile size, its operands out
    of the caches, and the 1-thread GEMM peak, measured now:
    ``{"peak": g, "speeds": {tile: {kernel: g}}}``."""
    from threadpoolctl import threadpool_limits

    from taskgraph.kernels import gemm, potrf, syrk, trsm

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    speeds: dict[int, dict[str, float]] = {}
    cold = eviction_buffer()  # (written between the timed calls: one for all)
    with threadpool_limits(limits=1, user_api="blas"):
        peak = gemm_peak(1, dtype, n=1024, repeats=repeats)
        for b in tiles:
            a, c = (np.asfortranarray(rng.random((b, b)), dtype=dtype) for _ in range(2))
            spd = np.asfortranarray(a @ a.T + b * np.eye(b), dtype=dtype)
            low = np.asfortranarray(np.linalg.cholesky(spd), dtype=dtype)
            s = {
                "gemm": best_seconds(gemm, [a, a, c], repeats, cold),
                "syrk": best_seconds(syrk, [a, c], repeats, cold),
                "trsm": best_seconds(trsm, [low, c], repeats, cold),
                "potrf": best_seconds(potrf, [spd], repeats, cold),
            }
            flops = {"gemm": 2 * b**3, "syrk": b**3, "trsm": b**3, "potrf": b**3 / 3}
            speeds[b] = {k: round(flops[k] / s[k] / 1e9, 3) for k in s}
    return {"peak": round(peak, 3), "speeds": speeds}


def measurements(dtype=np.float64, refresh: bool = False) -> dict:
    """:func:`measure`, from the cache when this machine has measured before (the
    cache is written atomically: ranks that measure at once do not corrupt it)."""
    path = cache_dir() / f"tiles-{machine_key(dtype)}.json"
    if not refresh:
        try:
            got = json.loads(path.read_text())
            got["speeds"] = {int(b): s for b, s in got["speeds"].items()}
            return got
        except (OSError, ValueError, KeyError):
            pass
    got = measure(dtype)
    got |= {"cpu": cpu_model(), "isa": vector_isa(), "blas": blas(), "dtype": np.dtype(dtype).name}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(got, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # (a read-only home: measured again next time)
    return got


def on_this_node(n: int, threads: int, dtype=np.float64) -> Choice:
    """:func:`cholesky_tile` for ``threads`` kernel threads of a cluster, measured by
    one rank of this node on all of its CPUs (it is bound to its share), the threads
    capped at the node's cores."""
    with affinity.whole_node():
        return cholesky_tile(n, min(threads, config.cores()), dtype)


def cholesky_tile(n: int, cores: int, dtype=np.float64, refresh: bool = False) -> Choice:
    """The tile size for a tiled Cholesky of order ``n`` on ``cores`` kernel threads
    (ranks x workers), from this machine's measured kernel speeds; ``.why()`` says why."""
    m = measurements(dtype, refresh)
    peak = max([m["peak"], *(s["gemm"] for s in m["speeds"].values())])  # (a noisy peak)
    return choose(n, cores, m["speeds"], peak)
