"""The records a graph is made of: tasks, the data they touch, and handles on them.

They know nothing of how a graph is built (:mod:`taskgraph.dsl.graph`) or run, so
that argument handling (:mod:`taskgraph.dsl.nested`) and kernels can use them.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import GraphError

if TYPE_CHECKING:
    from .datadeps import Data as DataHandle
    from .graph import Graph
    from .tiled import Tile

INITIAL = -1  # producer of the data as it is before the run


class Ref:
    """A task argument that refers to data: a tile or another task's value.

    ``mode`` is a plain int (1 read, 2 write, 3 both): recording a task is a hot loop.
    """

    __slots__ = ("data", "mode")

    def __init__(self, data: int, mode: int):
        self.data = data
        self.mode = mode


@dataclass(slots=True)
class Data:
    """One piece of data a graph touches: a tile of a matrix, a task's value, or a
    plain array or object marked with ``tg.r/w/rw`` (its handle is ``item``)."""

    key: tuple | None  # (matrix, i, j) for tiles; ("data", uid) for plain data; None for values
    tile: Tile | None = None  # the Tile, for tiles
    producer: int = INITIAL  # the task, for values
    item: DataHandle | None = None  # the taskgraph.dsl.datadeps.Data, for plain data
    size: int | None = None  # a value's declared size in bytes (``@tg.task(nbytes=...)``)

    @property
    def is_tile(self) -> bool:
        return self.tile is not None

    @property
    def the_tile(self) -> Tile:
        """The tile (for data known to be one)."""
        if self.tile is None:
            raise TypeError(f"{self.label()} is not a tile")
        return self.tile

    @property
    def nbytes(self) -> int:
        if self.item is not None:
            return self.item.nbytes
        if self.tile is None:  # values are small unless declared otherwise
            return 64 if self.size is None else self.size
        size = self.tile.dtype.itemsize
        for n in self.tile.shape:  # (2-D tiles, 1-D tiles of vectors)
            size *= n
        return size

    def label(self) -> str:
        if self.tile is not None:
            return repr(self.tile)
        if self.item is not None:
            return self.item.describe()
        return f"value of task {self.producer}"


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while making many acyclic objects."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Task:
    """One call: a function, its arguments, and the versions of data it reads and writes."""

    __slots__ = ("id", "fn", "args", "kwargs", "reads", "writes", "preds", "cost")

    def __init__(self, tid, fn, args, kwargs, reads, writes, preds, cost=1.0):
        self.id = tid
        self.cost = cost  # flops (kernels) or the declared cost; shared float objects
        self.fn = fn
        self.args = args  # Ref for data, anything else is a constant
        self.kwargs = kwargs
        self.reads = reads  # ((data, producer), ...): versions read
        self.writes = writes  # ((data, previous producer), ...): versions overwritten
        self.preds = preds  # task ids this task waits for

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "name", None) or getattr(self.fn, "__name__", "task"))


class TaskRef:
    """What a kernel call inside a graph returns: a handle on the recorded task
    ``tid`` of ``graph``, for :meth:`Graph.add_dependency` (it has no value)."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: Graph, tid: int):
        self.graph = graph
        self.id = tid

    def __repr__(self) -> str:
        return f"<task {self.id}: {self.graph.label(self.id)}>"


class Future(TaskRef):
    """The value of a ``@tg.task`` call (task ``tid`` of ``graph``), available after
    the run. Pass it to other calls, alone or inside lists, tuples, dicts and sets,
    to make them depend on it."""

    __slots__ = ()

    def result(self):
        """The task's value, from the graph's latest run (``graph.last_run``);
        GraphError before any run. A run's own values: ``run.result(future)``."""
        run = self.graph.last_run
        if run is None:
            raise GraphError(
                f"task {self.graph.label(self.id)} has not run yet: run the graph first"
            )
        return run.result(self)

    def done(self) -> bool:
        """Whether the graph's latest run is over (its values are here or can be
        fetched); False before any run."""
        run = self.graph.last_run
        return run is not None and bool(run.done())


def check_timeout(timeout: float | None, what: str) -> float | None:
    """``timeout`` as float seconds (None stays None); ValueError naming ``what``
    (``"task f"``) unless it is a positive number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"{what}: timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)
