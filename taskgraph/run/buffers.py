"""Long-lived pieces a run uses and reports: receive buffers kept between runs
(:class:`BufferPool`), a run's counters (:class:`Stats`), and :func:`gc_frozen`."""

from __future__ import annotations

import contextlib
import gc

import numpy as np

from ..dsl import memory


@contextlib.contextmanager
def gc_frozen():
    """Collections leave the objects that exist now alone, for the duration.

    The graph, its plan and the data of a run are up to millions of long-lived objects,
    and every full collection during the run (the executor's own allocations trigger
    them) walks them all. Nothing is done if the collector is off or the process froze
    objects itself.
    """
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


class BufferPool:
    """Receive buffers, kept by (shape, dtype) and handed out again instead of freed.

    Keyed by NumPy dtype objects, not their strings: ``arr.dtype.str`` makes a string
    each time (0.3 us), and a buffer goes back on every received tile's way."""

    def __init__(self):
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._dtypes: dict[str | np.dtype, np.dtype] = {}
        self.allocated = 0  # buffers ever made
        self.handed_out = 0  # buffers ever handed out
        self._slabs = memory.Slabs()  # large ones on huge pages (see taskgraph.dsl.memory)

    def get(self, shape: tuple, dtype: str | np.dtype, order: str = "F") -> np.ndarray:
        """A buffer of ``shape`` and ``dtype``, Fortran-ordered (tiles) or, with
        ``order="C"``, C-ordered (plain arrays: a buffer is received as it is sent)."""
        self.handed_out += 1
        dt = self._dtypes.get(dtype)
        if dt is None:
            dt = self._dtypes[dtype] = np.dtype(dtype)
        key: tuple = (shape, dt) if order == "F" else (shape, dt, "C")
        stack = self._free.get(key)
        if stack:
            return stack.pop()
        self.allocated += 1
        return self._slabs.new(shape, dt) if order == "F" else np.empty(shape, dt)

    def put(self, arr: np.ndarray) -> None:
        """``arr`` back, for a later :meth:`get` of its shape, dtype and order."""
        key: tuple = (arr.shape, arr.dtype)
        if not arr.flags.f_contiguous:
            key += ("C",)
        stack = self._free.get(key)
        if stack is None:
            self._free[key] = [arr]
        else:
            stack.append(arr)

    def __len__(self) -> int:
        return sum(len(s) for s in self._free.values())


class Stats:
    """What a run did on one rank (kept tiny: it is returned to the caller)."""

    def __init__(self):
        self.tasks = 0
        self.sent = 0
        self.received = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.polls = 0
        self.sleeps = 0
        self.spins = 0
        self.peak_sends = 0  # most sends in flight at once
        self.direct = 0  # tasks run the moment their message landed (taskgraph.run.direct)
        self.spawned = 0  # calls spawned by tasks here (taskgraph.run.dynamic)
        self.steals = 0  # spawned calls this rank took from another, asking
        self.pushes = 0  # ... that another rank pushed to it (taskgraph.run.steal)
        self.claims = 0  # ... of the steals, those taken from a board (taskgraph.run.board)
        self.steal_latency_median_us = 0.0  # request to arrival (taskgraph.run.steal)
        self.seconds = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))

    def __repr__(self) -> str:
        """Its counts, those not zero (a notebook shows ``run.stats`` so)."""
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in vars(self).items() if v)  # fmt: skip
        return f"Stats({shown})"
