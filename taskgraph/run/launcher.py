"""How one call of a ``@tg.task`` function starts on a rank: its resources taken, the
launch throttle honoured, run on a worker thread or in a process of the rank's pool.

Only managed calls come here (a task with options, or any call of a run with
options: see :mod:`taskgraph.run.attempts`); a call's life, on the trace's clock::

    ready ── gate (cores, memory, GPUs: taskgraph.run.resources) ──► launched
          ── max_launching slot, launch_rate token ──► started ── the call ──► ended
                                                       (slot given back)

- **Resources.** A call holds ``ranks x cores`` core slots (at least an executable's
  MPI ranks), ``memory`` and ``gpus`` of its rank from ``launched`` to ``ended``;
  they go back in a ``finally``, also when the thread is interrupted (an abandoned
  task). The gate's order and backfill rule: :class:`~taskgraph.run.resources.Gate`.
- **Launching.** From ``launched`` (resources taken) until the call's own code
  starts: for a function on this thread, until it is entered; for a process call,
  until it is handed to the pool (``started`` is then read in the child, so the
  picture shows the real start); for an executable (:func:`taskgraph.shell`), until
  its function is entered: its ``started`` is when ``Popen`` returned (the
  ExeResult's), but the launch slot is given back before ``Popen``, there being no
  hook there.
- **Threads of a call.** An executable gets ``OMP_NUM_THREADS=cores`` (unless its
  ``env`` or this process sets it and ``cores`` is 1); a process call holds BLAS to
  ``cores`` threads in its child. A call on a worker thread keeps the run's BLAS
  threads: threadpoolctl's limit is process-wide, so raising it for one call would
  raise it for every worker's kernels at the same time.
- **Capacities.** Every rank's (see :mod:`taskgraph.run.resources`) is gathered when
  the executor is made, for graphs with plain functions (a graph of kernels alone
  has no managed calls: no collective is added to the static path); a task of the
  graph that asks for more than any rank has fails there, on every rank.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.errors import GraphError, RunError
from ..dsl import exe as exemod
from ..dsl.options import DEFAULT, TaskOptions, options_of
from . import procpool
from .resources import (
    WAIT_STEP,
    Capacity,
    Gate,
    Need,
    Slots,
    TokenBucket,
    capacities,
    check_fits,
    fits,
    misfit,
    need_of,
    rank_info,
)

EXES = (exemod.shell.fn, exemod.exe.fn)


class Stamps(NamedTuple):
    """One call's times on the trace's clock (``time.perf_counter``): ``ready`` (it
    came to the launcher), ``launched`` (its resources taken), ``started`` (its code
    ran), ``ended``; None where it never got there. ``cores``: the cores it held."""

    ready: float | None
    launched: float | None
    started: float | None
    ended: float | None
    cores: int


def call_need(fn: Any, kwargs: dict | None, options: TaskOptions | None = None) -> Need:
    """What a call of ``fn`` with ``kwargs`` holds (an executable's ``ranks=k`` takes
    k cores at least)."""
    options = options_of(fn) if options is None else options
    extra = 0
    if kwargs and getattr(fn, "fn", None) in EXES:
        extra = exemod.resources_of_call(kwargs).get("cores", 0) * options.cores
    return need_of(options, extra)


def graph_needs(graph: Any):
    """(label, need) of each task of ``graph`` that asks for more than the default."""
    tasks = graph.tasks
    for t in range(len(tasks)):
        task = tasks[t]
        options = options_of(task.fn)
        if options is DEFAULT and not (task.kwargs and "ranks" in task.kwargs):
            continue
        need = call_need(task.fn, task.kwargs, options)
        if need.cores > 1 or need.memory or need.gpus:
            yield graph.label(t), need


class Launcher:
    """One rank's launcher, made by the executor (``ex.launcher``): reads
    ``ex.graph``, ``ex.net``, ``ex.nworkers``, ``ex.options`` and ``ex.stopping``."""

    def __init__(self, ex: Any):
        self.ex = ex
        self._last: dict[int, Stamps] = {}
        # by thread: what the calls on its stack hold (a waiting call runs deeper ones)
        self._holding: dict[int, list[Need]] = {}
        self._holding_lock = threading.Lock()
        self.capacities: list[Capacity] | None = None
        if ex.graph.has_values:  # (every rank decides alike: the same graph)
            self.capacities = capacities(ex.net.allgather(rank_info(ex.net.host, ex.nworkers)))
            check_fits(graph_needs(ex.graph), self.capacities)
        self._gate: Gate | None = None
        opts = ex.options
        rate = opts.launch_rate
        self.bucket = TokenBucket(rate / max(1, ex.net.size)) if rate else None
        self.slots = Slots(opts.max_launching) if opts.max_launching else None
        self._stop: Callable[[], bool] = lambda: bool(ex.stopping)

    @property
    def capacity(self) -> Capacity:
        """This rank's capacity."""
        return self.gate.capacity

    @property
    def gate(self) -> Gate:
        """This rank's gate (made on first use)."""
        if self._gate is None:
            ex = self.ex
            if self.capacities is not None:
                cap = self.capacities[ex.net.rank]
            else:  # (a graph of kernels: this rank's alone, no collective)
                cap = capacities([rank_info(ex.net.host, ex.nworkers)])[0]
            self._gate = Gate(cap)
        return self._gate

    def check(self, fn: Any, args: tuple, kwargs: dict | None, label: str) -> None:
        """GraphError at once if a call of ``fn`` (a spawned or submitted one, named
        ``label``) asks for more than any rank has."""
        need = call_need(fn, kwargs)
        if need.cores <= 1 and not need.memory and not need.gpus:
            return
        caps = self.capacities or [self.capacity]
        why = misfit(label, need, caps)
        if why is not None:
            raise GraphError(why)

    def abandoned(self, worker: int, ident: int) -> None:
        """``worker``'s call on thread ``ident`` was abandoned, stuck in C
        (taskgraph.run.attempts): its resources go back now (it sleeps or blocks, or
        else it ends soon after: the interrupt waits for it), and it ends now in the
        trace (its thread may still set its stamps if it comes back)."""
        with self._holding_lock:
            needs = self._holding.pop(ident, ())
        for need in needs:
            self.gate.release(need)
        s = self._last.get(worker)
        if s is not None and s.ended is None:
            now = time.perf_counter()
            self._last[worker] = s._replace(started=s.started or s.launched or now, ended=now)

    def last(self, worker: int) -> Stamps | None:
        """The stamps of the last call made for ``worker`` (None before any)."""
        return self._last.get(worker)

    def call(self, fn: Callable, args: tuple, kwargs: dict, label: str, worker: int) -> Any:
        """Run ``fn(*args, **kwargs)`` (``fn``: a TaskFunction or a plain callable) for
        worker ``worker``, once its resources are free and the throttle lets it go;
        its value. ``label`` names the call in errors. The call's stamps are left in
        :meth:`last` (also when it fails)."""
        clock = time.perf_counter
        ready = clock()
        options = options_of(fn)
        need = call_need(fn, kwargs, options)
        self._last[worker] = Stamps(ready, None, None, None, need.cores)
        gate = self.gate
        if not fits(need, gate.capacity):
            ex = self.ex
            raise GraphError(
                f"task {label} asks for {need}; rank {ex.net.rank}/{ex.net.size} has "
                f"{gate.capacity}"
            )
        if not gate.try_acquire(need) and not gate.acquire(need, self._stop):
            raise RunError(f"task {label} not started: the run is stopping")
        launched = clock()
        started: float | None = None
        ended: float | None = None
        ident = threading.get_ident()
        held = self._holding.setdefault(ident, [])
        held.append(need)
        try:
            self._last[worker] = Stamps(ready, launched, None, None, need.cores)
            slot = self._throttle(label)
            call = getattr(fn, "fn", fn)
            if options.process:
                value, started, ended = self._in_process(call, args, kwargs, label, need, slot)
            else:
                if call in EXES:
                    kwargs = _with_threads(kwargs, options.cores)
                started = clock()
                if slot:
                    self.slots.release()  # type: ignore[union-attr]
                try:
                    value = call(*args, **kwargs)
                except BaseException as exc:
                    result = getattr(exc, "result", None)
                    started = getattr(result, "started", None) or started
                    raise
                finally:
                    ended = clock()
                started = getattr(value, "started", started) if call in EXES else started
        finally:
            with self._holding_lock:
                mine = self._holding.get(ident) is held  # (else given back: abandoned)
                if mine:
                    held.pop()
                    if not held:
                        del self._holding[ident]
            if mine:
                gate.release(need)
            self._last[worker] = Stamps(
                ready, launched, started, ended if started else clock(), need.cores
            )
        return value

    def _throttle(self, label: str) -> bool:
        """Take a launch slot and a launch-rate token; True if a slot was taken."""
        slot = False
        if self.slots is not None:
            if not self.slots.acquire(self._stop):
                raise RunError(f"task {label} not started: the run is stopping")
            slot = True
        if self.bucket is not None:
            try:
                delay = self.bucket.reserve()
                deadline = time.monotonic() + delay
                while delay > 0:
                    if self._stop():
                        raise RunError(f"task {label} not started: the run is stopping")
                    time.sleep(min(delay, WAIT_STEP))
                    delay = deadline - time.monotonic()
            except BaseException:
                if slot:
                    self.slots.release()  # type: ignore[union-attr]
                raise
        return slot

    def _in_process(
        self, call: Callable, args: tuple, kwargs: dict, label: str, need: Need, slot: bool
    ) -> tuple[Any, float, float]:
        """(value, started, ended) of a call run in the rank's process pool; the pool
        is killed if this thread is interrupted while it waits (the call cannot be
        stopped alone)."""
        try:
            fut = procpool.submit(call, args, kwargs, label, need.cores, self.capacity.cores)
        finally:
            if slot:
                self.slots.release()  # type: ignore[union-attr]
        try:
            while not fut.done():
                concurrent.futures.wait((fut,), WAIT_STEP)  # (an interrupt lands within it)
        except BaseException:
            fut.cancel()
            if not fut.done():
                procpool.abandon()
            raise
        return procpool.result(fut, label)

    def close(self) -> None:
        """The run ended. The process pool stays for the session's next runs (it ends
        at exit or with the cluster: :func:`taskgraph.run.procpool.shutdown`)."""
        self._last.clear()


def _with_threads(kwargs: dict, cores: int) -> dict:
    """An executable call's kwargs with ``OMP_NUM_THREADS=cores`` in its ``env``
    (unless set there, or set in this process and ``cores`` is 1)."""
    env = kwargs.get("env") or {}
    if "OMP_NUM_THREADS" in env or (cores == 1 and "OMP_NUM_THREADS" in os.environ):
        return kwargs
    return {**kwargs, "env": {**env, "OMP_NUM_THREADS": str(cores)}}
