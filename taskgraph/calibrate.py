"""Tile sizes chosen by measurement: the Cholesky kernels' speeds at a few tile sizes on
this machine, measured once and cached per CPU, BLAS and dtype. The measurement takes
about a second; a process's first also compiles the kernels for the dtype, and the two
took 2.7-5.5 s on a 2-core VM (a process that finds the cache takes milliseconds).

    >>> choice = tg.calibrate.cholesky_tile(8192, cores=2)
    >>> choice.tile, choice.why()

The model that turns the speeds into a tile is :mod:`taskgraph.plan.tilesize`. The
cache lives in ``$TASKGRAPH_CACHE`` (default ``$XDG_CACHE_HOME/taskgraph``, else
``~/.cache/taskgraph``), one JSON file per (CPU model, vector ISA, BLAS, dtype):
another machine, or a new BLAS, measures afresh. ``refresh=True`` measures again.

One process measures at a time on a machine: processes that measured on the same
cores at once (two notebooks, two jobs) saved skewed speeds (about half the real ones
in a trial on a 2-core VM) and chose different tiles. So a measurement holds an
exclusive lock (``flock``) on ``tiles-<machine>.lock`` beside the cache files, for
every dtype; a process that finds no usable cache takes the lock, then reads the
cache again, and measures only if it is still not there::

    read tiles-<key>.json ── whole ──────────────────────────► speeds
        │ missing, unreadable, wrong shape (:func:`checked`)
        ▼
    lock tiles-<machine>.lock ─► read again ── whole ────────► speeds
        (waits while another         │ still not
         process measures)           ▼
                                  measure, write, unlock ────► speeds

Where no lock can be had (a read-only cache directory, a file system without
``flock``, or another process holding it past ``LOCK_WAIT``), the process measures
without it. The ranks of one cluster never measure side by side: rank 0 (or engine
0) measures and every rank uses its choice.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .core import affinity, config
from .core.machine import blas, cpu_model, gemm_peak, vector_isa
from .plan.tilesize import FLOPS, Choice, choose

CANDIDATES = (128, 192, 256, 384, 512, 768, 1024)
REPEATS = 3  # calls of each kernel at each size (the fastest counts)
# of the kernels and the way they are timed: an older cache is measured again (4: in
# rounds; and caches that processes measuring at once wrote, skewed, are dropped)
VERSION = 4
# at least this many bytes are written between the calls the calibration times (twice
# the largest cache, where it is known), to push their operands out of the caches: in a
# run a task's tiles come from a matrix far larger than them. Timed in cache, tile 512
# float32 gemm ran 10 % faster than in a 2-rank Cholesky on the AMD VM, and the
# calibration chose 512 where 1024 ran 0.86 of the peak against 0.78
EVICT_BYTES = 64 << 20
# seconds a process waits for another one's measurement (a few seconds) before it
# measures beside it: one stopped while it held the lock must not stop every other
LOCK_WAIT = 120.0


def cache_dir() -> Path:
    """Where the measurements are kept."""
    env = os.environ.get("TASKGRAPH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taskgraph"


def machine_key(dtype=None) -> str:
    """What a measurement holds for: this CPU, its vector ISA, the BLAS and ``dtype``
    (None: every dtype, the key of the lock that measurements take)."""
    name = "any" if dtype is None else np.dtype(dtype).name
    what = f"{cpu_model()}|{vector_isa()}|{blas()}|{name}|v{VERSION}"
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
    """Each Cholesky kernel's GFLOP/s on one thread at each of ``tiles``, its operands out
    of the caches, the fastest of ``repeats`` rounds over every tile and kernel, and the
    1-thread GEMM peak of ``dtype``, measured now: ``{"peak": g, "speeds": {tile:
    {kernel: g}}}``."""
    from threadpoolctl import threadpool_limits

    from taskgraph.kernels import gemm, potrf, syrk, trsm

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    calls = {}  # tile -> kernel -> (function, operands)
    for b in tiles:
        a, c = (np.asfortranarray(rng.random((b, b)), dtype=dtype) for _ in range(2))
        spd = np.asfortranarray(a @ a.T + b * np.eye(b), dtype=dtype)
        low = np.asfortranarray(np.linalg.cholesky(spd), dtype=dtype)
        calls[b] = {
            "gemm": (gemm, [a, a, c]),
            "syrk": (syrk, [a, c]),
            "trsm": (trsm, [low, c]),
            "potrf": (potrf, [spd]),
        }
    seconds = {b: dict.fromkeys(calls[b], float("inf")) for b in tiles}
    cold = eviction_buffer()  # (written between the timed calls: one for all)
    with threadpool_limits(limits=1, user_api="blas"):
        peak = gemm_peak(1, dtype, n=1024, repeats=repeats)
        # rounds, not each tile's calls in a row: a busy moment of a shared machine slows
        # one call of several tiles, not every call of one (which made it look 1.5x slow)
        for _ in range(repeats):
            for b, kernels in calls.items():
                for k, (fn, operands) in kernels.items():
                    seconds[b][k] = min(seconds[b][k], best_seconds(fn, operands, 1, cold))
    speeds = {
        b: {k: round(FLOPS[k] * b**3 / s / 1e9, 3) for k, s in seconds[b].items()} for b in tiles
    }
    return {"peak": round(peak, 3), "speeds": speeds}


def _positive(x) -> bool:
    """Whether ``x`` is a positive finite number (a bool is not one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf


def checked(got, tiles=CANDIDATES) -> dict | None:
    """``got`` (a cache file's JSON) as :func:`measure` returns it, its tiles as ints,
    if it is whole: a positive finite ``"peak"``, and ``"speeds"`` with every one of
    ``tiles`` (and any other tile a positive integer) giving each kernel's positive
    finite speed; None otherwise (then it is measured again). Pure."""
    if not isinstance(got, dict) or not _positive(got.get("peak")):
        return None
    speeds = got.get("speeds")
    if not isinstance(speeds, dict):
        return None
    parsed: dict[int, dict[str, float]] = {}
    for key, kernels in speeds.items():
        # a tile as measure writes it: "128", never "-5", "0128" or "1e3"
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            return None
        if key != str(int(key)) or int(key) <= 0 or not isinstance(kernels, dict):
            return None
        if not all(_positive(kernels.get(k)) for k in FLOPS):
            return None
        parsed[int(key)] = kernels
    if not set(tiles) <= set(parsed):
        return None
    return got | {"speeds": parsed}


def _read(path: Path) -> dict | None:
    """The measurements in the cache file ``path`` if it is there and whole, else None."""
    try:
        return checked(json.loads(path.read_text()))
    except (OSError, ValueError):  # (UnicodeDecodeError and JSONDecodeError are both)
        return None


def _stamp(path: Path) -> tuple[int, int] | None:
    """Which version of ``path`` is there (inode, mtime): a file replaced changes it."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


@contextlib.contextmanager
def exclusive(path: Path, wait: float = LOCK_WAIT) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the file ``path`` (made if missing) meanwhile,
    waiting at most ``wait`` seconds for another process's to end; yields whether it
    holds it: False where the lock cannot be had (a read-only directory, a file system
    without ``flock``, the wait run out), and the caller goes on unlocked."""
    fd = None
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):  # (flock needs no write access)
        try:
            fd = os.open(path, flags, 0o666)
            break
        except OSError:
            continue
    if fd is None:
        yield False
        return
    held, deadline, pause = False, time.monotonic() + wait, 0.01
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:  # (another process measures: poll, sleeping)
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.25)
            except OSError:  # (no flock here, as on some network file systems)
                break
        yield held
    finally:
        os.close(fd)  # (closing the last descriptor releases the lock)


def cache_file(dtype=np.float64) -> Path:
    """Where this machine's kernel speeds for ``dtype`` are kept."""
    return cache_dir() / f"tiles-{machine_key(dtype)}.json"


def cached(dtype=np.float64) -> bool:
    """Whether :func:`measurements` of ``dtype`` would read the cache, not measure."""
    return _read(cache_file(dtype)) is not None


def measurements(dtype=np.float64, refresh: bool = False) -> dict:
    """:func:`measure`, from the cache when this machine has measured before and the
    file is whole (:func:`checked`; anything else is measured again and overwritten).
    One process measures at a time (see the module doc): one that waited for another's
    measurement reads it. ``refresh=True`` measures again, unless another process
    wrote the file meanwhile. The file is written atomically."""
    folder = cache_dir()
    path = cache_file(dtype)
    before = _stamp(path)
    got = None if refresh else _read(path)
    if got is not None:
        return got
    with exclusive(folder / f"tiles-{machine_key()}.lock", LOCK_WAIT):
        if not refresh or _stamp(path) != before:  # (refresh: a file written meanwhile)
            got = _read(path)
            if got is not None:
                return got
        got = measure(dtype)
        got |= {
            "cpu": cpu_model(),
            "isa": vector_isa(),
            "blas": blas(),
            "dtype": np.dtype(dtype).name,
        }
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
