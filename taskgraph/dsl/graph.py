"""Task graphs as data, built by ordinary Python.

Two ways to add tasks, one graph:

* **Sequential task flow.** Inside ``with tg.Graph() as g:``, calling a kernel on
  marked tiles (``gemm(A[m, k].r, A[n, k].r, A[m, n].rw)``) records a task, and the
  read-after-write, write-after-read and write-after-write edges a sequential run
  implies are inferred (:mod:`taskgraph.dsl.builder`, the graph's recorder).
* **Futures.** ``@tg.task`` functions called inside a graph return a :class:`Future`;
  passing it to another call adds a read of its value.

Every task records which *versions* of data it reads and overwrites: a version is
(data, producing task), with producer -1 for the data as it was before the run. The
planner turns these into messages between ranks.

Once recorded, a graph is data: the ordering questions (successors, a topological
order, bottom levels, the critical path, a cycle) are pure functions of its task list
(:mod:`taskgraph.dsl.order`), cached here until the graph changes.

The graph is checked as it is built (marks, shapes, dtypes, tile ranges) and before
it runs (cycles through explicit dependencies), and every error names the tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import GraphError, refuse_async
from . import builder as recording
from . import nested, order
from .options import DEFAULT, TaskOptions
from .tasks import Data, Future, Ref, Task, TaskRef, check_timeout

if TYPE_CHECKING:
    from .tiled import TiledMatrix


def _no_previewer(graph: Graph, ranks: int | None):
    raise RuntimeError("no planner: import taskgraph (its plan layer previews graphs)")


# The plan layer, above this one, installs its preview (use_previewer): graphs never import it
_previewer: Callable = _no_previewer


def use_previewer(preview: Callable) -> None:
    """Install ``preview(graph, ranks)``, what :meth:`Graph.preview` returns."""
    global _previewer
    _previewer = preview


class TaskFunction:
    """A plain Python function that records a task when called inside a graph.

    Made by :func:`task`. Outside ``with tg.Graph():`` a call just calls ``fn``.

    Parameters
    ----------
    fn:
        The function. Its arguments may be constants, futures, tiles (read), marked
        tiles, and lists, tuples, dicts and sets holding futures (each future is a
        dependency, and the function gets its value in its place).
    cost:
        The task's cost for priorities (the unit of a kernel's flops).
    timeout:
        Seconds the task may run before the run fails naming it; None: the run's
        default (``task_timeout``), if any.
    nbytes:
        The size of the task's value in bytes, the planner's estimate of what sending
        it costs: an int, or a callable given the call's arguments (futures stay
        futures) that returns one. None: 64 bytes. The trace shows the real size.
    """

    def __init__(
        self,
        fn: Callable,
        cost: float = 1.0,
        timeout: float | None = None,
        nbytes: int | Callable[..., int] | None = None,
        options: TaskOptions | None = None,
    ):
        self.fn = fn
        self.name = fn.__name__
        self.cost_value = cost
        self.timeout = check_timeout(timeout, f"task {fn.__name__}")
        self.nbytes = nbytes if callable(nbytes) else _check_nbytes(nbytes, f"task {fn.__name__}")
        self.options = options or DEFAULT
        if self.options.timeout != self.timeout:
            self.options = dataclasses.replace(self.options, timeout=self.timeout)
        functools.update_wrapper(self, fn)

    def with_options(self, **kw) -> TaskFunction:
        """A copy of this task function with some options changed, for some calls:
        ``f.with_options(retries=3, cores=2)(x)``. Takes ``cost``, ``timeout``,
        ``nbytes`` and the options of :func:`task` (``retries``, ``on_failure``,
        ``cores``, ``memory``, ``gpus``, ``ranks``, ``process``)."""
        cost = kw.pop("cost", self.cost_value)
        timeout = kw.pop("timeout", self.timeout)
        nbytes = kw.pop("nbytes", self.nbytes)
        options = TaskOptions.make(f"task {self.name}", self.options, timeout=timeout, **kw)
        return type(self)(self.fn, cost, timeout, nbytes, options)

    def __call__(self, *args, **kwargs):
        b = recording.active()
        if b is None:
            return self.fn(*args, **kwargs)
        future = b.add_call(self, args, kwargs)
        if self.nbytes is not None:
            self.declare_size(future, args, kwargs)
        return future

    def declare_size(self, future: Future, args: tuple, kwargs: dict) -> None:
        """Give the value of ``future`` (a call of this function with ``args`` and
        ``kwargs``) its declared size; GraphError naming the task if it is no size."""
        graph = future.graph
        size = self.nbytes
        if callable(size):
            what = f"task {graph.label(future.id)}"
            try:
                size = size(*args, **kwargs)
            except Exception as exc:
                raise GraphError(f"{what}: its nbytes function raised {exc!r}") from exc
            size = _check_nbytes(size, what)
        graph.data[graph._values[future.id]].size = size

    def cost(self, shapes) -> float:
        """The declared cost, whatever the ``shapes`` (a kernel's depends on them)."""
        return self.cost_value

    def __repr__(self) -> str:
        return f"<tg.task {self.name}>"


def _check_nbytes(nbytes, what: str) -> int | None:
    """``nbytes`` as an int (None stays None); GraphError naming ``what`` unless it is
    a size in bytes."""
    if nbytes is None:
        return None
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
        raise GraphError(f"{what}: nbytes must be a number of bytes (an int >= 0), not {nbytes!r}")
    return int(nbytes)


def task(
    fn: Callable | None = None,
    *,
    cost: float = 1.0,
    timeout: float | None = None,
    nbytes: int | Callable[..., int] | None = None,
    **options,
):
    """Make a plain function a task: inside a graph, calls return :class:`Future` s.

    Use as ``@tg.task``, ``@tg.task(cost=..., timeout=..., retries=..., cores=...)`` or
    ``tg.task(fn)``.

    Parameters
    ----------
    fn:
        The function. Called inside ``with tg.Graph():`` it records a task and returns
        a :class:`Future`; outside, it runs at once. Futures given to it, alone or
        inside a list, tuple, dict (values) or set, are dependencies and arrive as
        their values. A plain NumPy array given to it is a constant of the graph and
        arrives read-only: a write into it fails the task.
    cost:
        The task's cost, used for priorities (critical path first).
    timeout:
        Seconds the task may run before the run fails naming it (None: the run's
        ``task_timeout``).
    nbytes:
        The size of the task's value in bytes, for placement and the planned traffic
        (:meth:`Graph.preview`): an int, or a callable of the call's arguments
        (``nbytes=lambda n: 8 * n``; futures arrive as futures). None: 64 bytes. The
        trace and ``run.stats`` always count the real size, measured when it is sent.
    retries, on_failure:
        The failure policy: ``retries`` more attempts after a failed one, then
        ``on_failure="fail"`` (the run fails: the default), ``"skip"`` (its dependents
        are cancelled, the rest goes on) or ``"ignore"`` (dependents get the exception
        as their input). A run's ``cluster.run(g, retries=, on_failure=)`` sets them for
        every task that leaves its own at the default.
    cores, memory, gpus, ranks:
        What one attempt holds on its rank while it runs (``memory`` in bytes or as
        ``"2GB"``); a rank never starts more than it has. ``ranks``: the MPI ranks of
        an executable task (:func:`taskgraph.shell` and friends).
    process:
        Run each call in a process of the rank's pool rather than in a worker thread,
        for functions that hold the GIL (the function and its arguments must pickle).
    """

    def make(f):
        refuse_async(f, "@tg.task")
        opts = TaskOptions.make(f"task {f.__name__}", timeout=timeout, **options)
        return TaskFunction(f, cost, timeout, nbytes, opts)

    return make if fn is None else make(fn)


class Graph:
    """A task graph: tasks, the data they touch, and the edges between them.

    Record tasks inside ``with tg.Graph(name) as g:``: kernel calls on marked tiles,
    and ``@tg.task`` calls (see the module docstring); then ``cluster.run(g)``.
    Inspect it with :meth:`label`, :meth:`to_networkx`, :meth:`critical_path` and
    :meth:`preview`.

    Parameters
    ----------
    name:
        Names the graph in messages, traces and reports.
    """

    def __init__(self, name: str = "graph"):
        self.name = name
        self.internal = False  # its tasks are the runtime's, not the user's (see cluster.submit)
        self.tasks: list[Task] = []
        self.data: list[Data] = []
        self._values: dict[int, int] = {}  # task -> the data id of its value
        self._backward = False  # an explicit dependency on a later task exists
        self._edits = 0  # explicit dependencies added: the caches below go stale
        self._caches: dict[str, tuple[tuple[int, int], Any]] = {}
        self._builder = recording.Builder(self)
        # the run handle of the latest run (set by the cluster); futures ask it
        self.last_run: Any = None

    def __getstate__(self) -> dict:
        # what travels to the engines: the tasks and data, not results, runs or hooks
        state = dict(self.__dict__)
        state.update(last_run=None, _caches={})
        return state

    # -- context -------------------------------------------------------------------

    def __enter__(self) -> Graph:
        self._builder.open(self)
        recording.push(self._builder)
        # Recording makes millions of small objects and no reference cycles; the
        # cyclic collector would walk the whole growing heap again and again (over
        # half the build time of a 10^6-task graph). It is paused while recording.
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc) -> None:
        recording.pop()
        if recording.active() is not self._builder:  # not also open further out
            self._builder.close()
        if self.__dict__.pop("_gc_was_enabled", True):
            gc.enable()

    @staticmethod
    def active() -> Graph | None:
        """The innermost graph open (``with tg.Graph():``) in this thread, or None."""
        b = recording.active()
        return b.graph if b is not None else None

    @staticmethod
    def current(what: str) -> Graph:
        """The innermost open graph; GraphError naming ``what`` (a kernel) if none is."""
        return recording.current(what).graph

    # -- recording -----------------------------------------------------------------

    def add_kernel_task(self, kernel, args: tuple) -> TaskRef:
        """Record ``kernel(*args)`` (marked tiles), as a kernel call inside the graph does."""
        with self._recording() as b:
            return b.add_kernel_task(kernel, args)

    def add_call(self, fn: TaskFunction, args: tuple, kwargs: dict) -> Future:
        """Record ``fn(*args, **kwargs)`` for a ``@tg.task`` function; its future."""
        with self._recording() as b:
            future = b.add_call(fn, args, kwargs)
        if fn.nbytes is not None:
            fn.declare_size(future, args, kwargs)
        return future

    @contextlib.contextmanager
    def _recording(self) -> Iterator[recording.Builder]:
        """The builder, open on this graph for one call if ``with graph:`` is not."""
        b = self._builder
        if b.graph is self:
            yield b
            return
        b.open(self)
        try:
            yield b
        finally:
            b.close()

    def add_dependency(self, before: TaskRef | int, after: TaskRef | int) -> None:
        """An explicit edge: ``after`` waits for ``before``."""
        for ref in (before, after):
            if isinstance(ref, TaskRef) and ref.graph is not self:
                raise GraphError(f"{ref!r} belongs to graph {ref.graph.name!r}, not {self.name!r}")
        b = before.id if isinstance(before, TaskRef) else int(before)
        a = after.id if isinstance(after, TaskRef) else int(after)
        for t in (a, b):
            if not 0 <= t < len(self.tasks):
                raise GraphError(f"graph {self.name!r} has no task {t}")
        if b == a:
            raise GraphError(f"task {self.label(a)} cannot depend on itself")
        if b not in self.tasks[a].preds:
            self.tasks[a].preds.append(b)
            self._edits += 1
            if b > a:
                self._backward = True  # task order is no longer a topological order

    # -- inspection ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def ntasks(self) -> int:
        """The number of tasks recorded."""
        return len(self.tasks)

    @property
    def has_values(self) -> bool:
        """Whether any ``@tg.task`` call (a task with a value) is in the graph."""
        return bool(self._values)

    @property
    def nedges(self) -> int:
        """The number of edges (each task's distinct predecessors, summed)."""
        return sum(len(t.preds) for t in self.tasks)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {self.ntasks} tasks, {self.nedges} edges>"

    def label(self, tid: int) -> str:
        """A readable name of task ``tid``: ``potrf(A[2,2])`` or ``simulate#7(3, <task 2>)``."""
        t = self.tasks[tid]
        if t.kwargs is None and all(isinstance(a, Ref) for a in t.args) and t.args:
            if all(self.data[a.data].is_tile for a in t.args):
                return f"{t.name}({', '.join(self.data[a.data].label() for a in t.args)})"
        return f"{t.name}#{tid}({self.args_label(t.fn, t.args, t.kwargs)})"

    def args_label(self, fn, args: tuple, kwargs: dict | None) -> str:
        """The arguments of a call of ``fn`` as text: the encoded ``args`` and ``kwargs``
        (None: none) shown as tiles, ``<task 2>`` and constants."""
        if isinstance(fn, nested.PackedCall):
            return fn.label([self._arg_label(a) for a in args])
        parts = [self._arg_label(a) for a in args]
        parts += [f"{k}={self._arg_label(v)}" for k, v in (kwargs or {}).items()]
        return ", ".join(parts)

    def _arg_label(self, a) -> str:
        if isinstance(a, Ref):
            d = self.data[a.data]
            return d.label() if d.key is not None else f"<task {d.producer}>"
        return nested.describe(a)

    # -- ordering (pure functions of the task list, cached until it changes) ---------

    def _cached(self, name: str, compute: Callable[[], Any]) -> Any:
        key = (len(self.tasks), self._edits)
        hit = self._caches.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = compute()
        self._caches[name] = (key, value)
        return value

    def drop_caches(self) -> None:
        """Forget the successor lists (they are rebuilt when next needed)."""
        self._caches.pop("successors", None)

    def successors(self) -> list[list[int]]:
        """Each task's successors (computed once per shape of the graph; do not modify)."""
        return self._cached("successors", lambda: order.successors(self.tasks))

    def order(self) -> list[int]:
        """A topological order of the tasks; raises GraphError naming a cycle."""
        return self._cached("order", self._order)

    def _order(self) -> list[int]:
        # recorded tasks only wait for earlier ones; an explicit edge may point back
        if not self._backward:
            return list(range(len(self.tasks)))
        found, stuck = order.topological_order(self.tasks, self.successors())
        if stuck:
            cycle = order.find_cycle(self.tasks, stuck)
            names = " -> ".join(self.label(t) for t in cycle + cycle[:1])
            raise GraphError(f"graph {self.name!r} has a cycle: {names}")
        return found

    def check(self) -> None:
        """Raise GraphError if the graph cannot run (today: a cycle)."""
        self.order()

    def costs(self) -> list[float]:
        """The cost (flops, or the declared cost) of every task."""
        return [t.cost for t in self.tasks]

    def bottom_levels(self, costs: list[float] | None = None) -> list[float]:
        """Cost of the heaviest path from each task to the end of the graph, by
        ``costs`` (one per task; default :meth:`costs`)."""
        costs = costs if costs is not None else self.costs()
        return order.bottom_levels(self.tasks, self.order(), costs)

    def critical_path(self) -> tuple[float, list[int]]:
        """(length, tasks) of the heaviest path through the graph, by task cost."""
        return order.critical_path(self.tasks, self.bottom_levels(), self.successors())

    @property
    def critical_path_length(self) -> float:
        """The cost of the heaviest path (:meth:`critical_path`'s length)."""
        return self.critical_path()[0]

    def preview(self, ranks: int | None = None):
        """What this graph would do on ``ranks`` ranks, from the plan alone.

        Tasks and flops per rank, messages and bytes per rank pair, and (in a notebook)
        the DAG coloured by rank. See :mod:`taskgraph.plan.preview`.
        """
        return _previewer(self, ranks)

    def to_networkx(self):
        """A ``networkx.DiGraph``: nodes are task ids with ``name``, ``label``, ``cost``."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        costs = self.costs()
        for t in self.tasks:
            g.add_node(t.id, name=t.name, label=self.label(t.id), cost=costs[t.id])
        g.add_edges_from((p, t.id) for t in self.tasks for p in t.preds)
        return g

    def kernels_used(self) -> list:
        """Every distinct function (kernel or task function) in the graph."""
        seen: dict[int, object] = {}
        for t in self.tasks:
            seen.setdefault(id(t.fn), t.fn)
        return list(seen.values())

    def dtypes_used(self) -> set[np.dtype]:
        """The dtypes of the tiles the graph touches."""
        return {d.tile.dtype for d in self.data if d.tile is not None}

    def matrices(self) -> list[TiledMatrix]:
        """The tiled matrices whose tiles the graph touches, in order of first use."""
        seen: dict[int, TiledMatrix] = {}
        for d in self.data:
            if d.tile is not None:
                seen.setdefault(d.tile.matrix.uid, d.tile.matrix)
        return list(seen.values())


def iter_refs(task: Task) -> Iterable[Ref]:
    """The :class:`Ref` arguments of ``task``, positional then keyword."""
    for a in task.args:
        if isinstance(a, Ref):
            yield a
    if task.kwargs:
        for v in task.kwargs.values():
            if isinstance(v, Ref):
                yield v
