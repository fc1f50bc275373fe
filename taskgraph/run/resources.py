"""What a rank has (cores, memory, GPUs), what a call asks for, and who starts next.

A rank's :class:`Capacity`: ``cores`` is its worker count (one worker per core slot)
unless the cluster was made with ``cores=``; ``memory`` is a fair share of the
node's available memory over the ranks on that node (``memory=`` overrides);
``gpus`` is the count in ``CUDA_VISIBLE_DEVICES`` (the launcher's binding of this
rank), else the node's ``nvidia-smi -L`` count shared over its ranks, else 0
(``gpus=`` overrides). Every rank learns every rank's capacity at the start of a run
(:func:`capacities`, from one allgather), so a task that asks for more than any rank
has fails on every rank before anything runs (:func:`check_fits`).

The gate (:class:`Gate`) admits calls onto a rank's resources, never more than it
has. The backfill rule::

    arrivals ─► [ head | 2nd | 3rd | ... ]      (in order of arrival)
                   │
                   ├─ head fits the free resources ─► starts
                   └─ head does not fit: a later call that fits starts in the free
                      resources (backfill), and the head counts one bypass; once the
                      head has been bypassed ``max_bypass`` times, nothing new starts
                      until the head fits (running calls end, resources free up).

So a stream of 1-core calls never starves a 4-core call: after at most
``max_bypass`` (default: 2 x cores) small calls overtook it, the rank drains for it.

The throttle: :class:`TokenBucket` spaces launches at most ``rate`` a second (a
burst of one: never more than ``rate * T + 1`` in any T seconds); :class:`Slots`
caps the calls launching at once (``max_launching``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..core.errors import GraphError
from ..dsl.options import TaskOptions

WAIT_STEP = 0.05  # seconds between looks while waiting: an async interrupt lands within it


@dataclass(frozen=True)
class Capacity:
    """What one rank may hand out at once: ``cores`` (core slots), ``memory``
    (bytes) and ``gpus``."""

    cores: int
    memory: int
    gpus: int

    def __str__(self) -> str:
        return f"{self.cores} cores, {_size(self.memory)} memory, {self.gpus} GPUs"


@dataclass(frozen=True)
class Need:
    """What one call holds while it runs: ``cores`` (its ``ranks`` x ``cores``
    slots), ``memory`` (bytes) and ``gpus``."""

    cores: int
    memory: int
    gpus: int

    def __str__(self) -> str:
        parts = [f"{self.cores} cores"]
        if self.memory:
            parts.append(f"{_size(self.memory)} memory")
        if self.gpus:
            parts.append(f"{self.gpus} GPUs")
        return ", ".join(parts)


def need_of(options: TaskOptions, extra_cores: int = 0) -> Need:
    """What a call with ``options`` holds; ``extra_cores``: at least this many cores
    (an executable's MPI ranks)."""
    return Need(max(options.slots, extra_cores), options.memory, options.gpus)


def fits(need: Need | TaskOptions, capacity: Capacity) -> bool:
    """Whether a call asking ``need`` (or a task's options) can ever run on a rank of
    ``capacity``."""
    if isinstance(need, TaskOptions):
        need = need_of(need)
    return (
        need.cores <= capacity.cores
        and need.memory <= capacity.memory
        and need.gpus <= capacity.gpus
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def misfit(label: str, need: Need, capacities: list[Capacity]) -> str | None:
    """Why a call ``label`` asking ``need`` fits no rank of ``capacities`` (None if
    one fits): names the call, what it asked for, and the largest rank."""
    if any(fits(need, c) for c in capacities):
        return None
    big = max(range(len(capacities)), key=lambda r: _bigness(capacities[r]))
    return (
        f"task {label} asks for {need}, more than any rank has: the largest, rank "
        f"{big}/{len(capacities)}, has {capacities[big]}"
    )


def _bigness(c: Capacity) -> tuple[int, int, int]:
    return (c.cores, c.gpus, c.memory)


def check_fits(calls: Iterable[tuple[str, Need]], capacities: list[Capacity]) -> None:
    """GraphError naming the first of ``calls`` (label, need) that fits no rank of
    ``capacities``; checked before anything runs."""
    cache: dict[Need, bool] = {}
    for label, need in calls:
        ok = cache.get(need)
        if ok is None:
            ok = cache[need] = any(fits(need, c) for c in capacities)
        if not ok:
            raise GraphError(misfit(label, need, capacities))


# -- a rank's capacity ----------------------------------------------------------------


def gpus_here() -> tuple[int, bool]:
    """(GPUs this process sees, whether they are this rank's own): the count in
    ``CUDA_VISIBLE_DEVICES`` (the launcher bound them to this rank), else the node's
    ``nvidia-smi -L`` count (shared by the node's ranks), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return len(ids), True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0, False
    if out.returncode != 0:
        return 0, False
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")), False


def memory_here() -> int:
    """Bytes of memory available on this node now (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available)


@dataclass(frozen=True)
class RankInfo:
    """What one rank tells the others at a run's start (see :func:`capacities`)."""

    host: str
    workers: int
    memory: int  # available on its node
    gpus: int
    own_gpus: bool  # gpus are this rank's (CUDA_VISIBLE_DEVICES), not the node's
    limits: tuple[int | None, int | None, int | None]  # the cluster's cores=, memory=, gpus=


def rank_info(host: str, workers: int) -> RankInfo:
    """This rank's :class:`RankInfo` (``workers``: its worker threads)."""
    gpus, own = _gpus_cached()
    return RankInfo(host, workers, memory_here(), gpus, own, _limits)


def capacities(infos: list[RankInfo]) -> list[Capacity]:
    """Each rank's capacity from every rank's :class:`RankInfo` (pure): cores = its
    workers unless limited; memory and shared GPUs: its node's, over that node's
    ranks."""
    per_host: dict[str, int] = {}
    for info in infos:
        per_host[info.host] = per_host.get(info.host, 0) + 1
    out = []
    for info in infos:
        share = per_host[info.host]
        cores, memory, gpus = info.limits
        out.append(
            Capacity(
                cores if cores is not None else info.workers,
                memory if memory is not None else info.memory // share,
                gpus if gpus is not None else (info.gpus if info.own_gpus else info.gpus // share),
            )
        )
    return out


_limits: tuple[int | None, int | None, int | None] = (None, None, None)
_gpu_count: tuple[int, bool] | None = None


def set_limits(cores: int | None = None, memory: int | None = None, gpus: int | None = None):
    """This process's rank capacity as a cluster was told (``Cluster(cores=...)``):
    None leaves one as measured. ValueError for a bad value."""
    global _limits
    for name, v in (("cores", cores), ("memory", memory), ("gpus", gpus)):
        least = 1 if name == "cores" else 0
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise ValueError(f"Cluster({name}={v!r}): an int >= {least}, or None")
    _limits = (cores, memory, gpus)


def _gpus_cached() -> tuple[int, bool]:
    global _gpu_count
    if _gpu_count is None:
        _gpu_count = gpus_here()  # (nvidia-smi takes a while: once a process)
    return _gpu_count


# -- the gate ---------------------------------------------------------------------------


class _Ticket:
    __slots__ = ("bypassed", "need")

    def __init__(self, need: Need):
        self.need = need
        self.bypassed = 0


class Gate:
    """Admits calls onto a rank's resources in order of arrival, with backfill (see
    the module). ``capacity``: the rank's; ``max_bypass``: how many later calls may
    overtake a waiting head (default 2 x cores). Thread-safe."""

    def __init__(self, capacity: Capacity, max_bypass: int | None = None):
        self.capacity = capacity
        self.max_bypass = 2 * capacity.cores if max_bypass is None else max_bypass
        self.cv = threading.Condition(threading.Lock())
        self.free = [capacity.cores, capacity.memory, capacity.gpus]
        self.queue: deque[_Ticket] = deque()
        self.in_use_peak = 0  # the most cores held at once (for tests and the summary)

    def _fits_now(self, need: Need) -> bool:
        free = self.free
        return need.cores <= free[0] and need.memory <= free[1] and need.gpus <= free[2]

    def _may_start(self, ticket: _Ticket) -> bool:
        """Whether ``ticket`` starts now (lock held): the head if it fits; another if
        it fits and the head has been bypassed fewer than ``max_bypass`` times."""
        if not self._fits_now(ticket.need):
            return False
        head = self.queue[0]
        if head is ticket:
            return True
        return head.bypassed < self.max_bypass and not self._fits_now(head.need)

    def _take(self, ticket: _Ticket) -> None:
        head = self.queue[0]
        if head is not ticket:
            head.bypassed += 1
        self.queue.remove(ticket)
        need, free = ticket.need, self.free
        free[0] -= need.cores
        free[1] -= need.memory
        free[2] -= need.gpus
        self.in_use_peak = max(self.in_use_peak, self.capacity.cores - free[0])
        if self.queue:
            self.cv.notify_all()  # (a new head, or others may fit the rest)

    def try_acquire(self, need: Need) -> bool:
        """Take ``need`` now if the rule lets a new arrival start; False otherwise
        (nothing queued)."""
        with self.cv:
            if self.queue or not self._fits_now(need):
                return False
            ticket = _Ticket(need)
            self.queue.append(ticket)
            self._take(ticket)
            return True

    def acquire(self, need: Need, stop: Callable[[], bool] | None = None) -> bool:
        """Wait for ``need`` (which must fit the capacity: :func:`fits`), in turn;
        True once taken, False if ``stop()`` became true first. An exception raised in
        this thread while it waits (an interrupt) leaves the queue as it was."""
        if not fits(need, self.capacity):
            raise ValueError(f"asks for {need}; this rank has {self.capacity}")
        ticket = _Ticket(need)
        with self.cv:
            self.queue.append(ticket)
            try:
                while not self._may_start(ticket):
                    if stop is not None and stop():
                        return False
                    self.cv.wait(WAIT_STEP if stop is not None else None)
            except BaseException:
                self._leave(ticket)
                raise
            self._take(ticket)
            return True

    def _leave(self, ticket: _Ticket) -> None:
        if ticket in self.queue:
            self.queue.remove(ticket)
            self.cv.notify_all()

    def release(self, need: Need) -> None:
        """Give back what a call held (once per acquire that returned True)."""
        with self.cv:
            free = self.free
            free[0] += need.cores
            free[1] += need.memory
            free[2] += need.gpus
            if self.queue:
                self.cv.notify_all()

    def in_use(self) -> int:
        """Cores held now."""
        return self.capacity.cores - self.free[0]


# -- the throttle ----------------------------------------------------------------------


class TokenBucket:
    """At most ``rate`` launches a second, evenly spaced (a burst of one). ``clock``:
    seconds (default ``time.monotonic``). Thread-safe."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        if not rate > 0:
            raise ValueError(f"rate must be > 0, not {rate!r}")
        self.rate = float(rate)
        self.clock = clock
        self.lock = threading.Lock()
        self.next_at = -float("inf")  # when the next launch may go

    def reserve(self) -> float:
        """Take the next launch time; seconds to wait for it (0: go now)."""
        with self.lock:
            now = self.clock()
            at = max(now, self.next_at)
            self.next_at = at + 1.0 / self.rate
            return at - now


class Slots:
    """At most ``limit`` holders at once (``max_launching``); an interruptible
    semaphore."""

    def __init__(self, limit: int):
        self.limit = limit
        self.cv = threading.Condition(threading.Lock())
        self.held = 0

    def acquire(self, stop: Callable[[], bool] | None = None) -> bool:
        """Wait for a slot; True once taken, False if ``stop()`` became true first."""
        with self.cv:
            while self.held >= self.limit:
                if stop is not None and stop():
                    return False
                self.cv.wait(WAIT_STEP)
            self.held += 1
            return True

    def release(self) -> None:
        with self.cv:
            self.held -= 1
            self.cv.notify()
