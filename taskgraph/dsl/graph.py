"""Task graphs as data, built by ordinary Python.

Two ways to add tasks, one graph:

* **Sequential task flow.** Inside ``with tg.Graph() as g:``, calling a kernel on
  marked tiles (``gemm(A[m, k].r, A[n, k].r, A[m, n].rw)``) records a task. The graph
  keeps, for every piece of data, its last writer and the readers since then, and
  infers the edges a sequential run implies::

      read  after write  (RAW): the reader waits for the last writer
      write after read   (WAR): the writer waits for every reader since the last write
      write after write  (WAW): the writer waits for the last writer (if no reader between)

  Readers of the same version get no edges between them.

* **Futures.** ``@tg.task`` functions called inside a graph return a :class:`Future`;
  passing it to another call adds a read of its value.

Every task records which *versions* of data it reads and overwrites: a version is
(data, producing task), with producer -1 for the data as it was before the run. The
planner turns these into messages between ranks.

The graph is checked as it is built (marks, shapes, dtypes, tile ranges) and before
it runs (cycles through explicit dependencies), and every error names the tasks.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import GraphError
from . import nested
from .access import Access, Mode
from .tasks import INITIAL, Data, Future, Ref, Task, TaskRef, check_timeout

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
    """

    def __init__(self, fn: Callable, cost: float = 1.0, timeout: float | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.cost_value = cost
        self.timeout = check_timeout(timeout, f"task {fn.__name__}")
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        g = Graph.active()
        if g is None:
            return self.fn(*args, **kwargs)
        return g.add_call(self, args, kwargs)

    def cost(self, shapes) -> float:
        return self.cost_value

    def __repr__(self) -> str:
        return f"<tg.task {self.name}>"


def task(fn: Callable | None = None, *, cost: float = 1.0, timeout: float | None = None):
    """Make a plain function a task: inside a graph, calls return :class:`Future` s.

    Use as ``@tg.task``, ``@tg.task(cost=..., timeout=...)`` or ``tg.task(fn)``.

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
    """
    if fn is None:
        return lambda f: TaskFunction(f, cost, timeout)
    return TaskFunction(fn, cost, timeout)


_stack = threading.local()

# arguments a call passes on as they are, without a look at what they might refer to
_CONSTANTS = frozenset({int, float, complex, str, bytes, bool, type(None)})

# (mode, tile shape, dtype) of a kernel argument -> a small int, for signature keys
_SIGNATURES: dict[tuple, int] = {}
_SIGNATURE_OF: dict[int, tuple] = {}


def _check_signature(kernel, key: tuple[int, ...]) -> tuple[str, float]:
    """Check a kernel's arguments once per signature; remember (problem, flops)."""
    if len(_SIGNATURE_OF) != len(_SIGNATURES):
        _SIGNATURE_OF.update({v: k for k, v in _SIGNATURES.items()})
    sig = [_SIGNATURE_OF[k] for k in key]
    modes, shapes, dtypes = [Mode(s[0]) for s in sig], [s[1] for s in sig], [s[2] for s in sig]
    problem = kernel.check(modes, shapes, dtypes)
    known = (problem, kernel.cost(shapes) if not problem else 0.0)
    kernel.signatures[key] = known
    return known


class Graph:
    """A task graph: tasks, the data they touch, and the edges between them.

    ``name`` names it in messages and traces. Record tasks inside ``with
    tg.Graph(name) as g:``: kernel calls on marked tiles, and ``@tg.task`` calls (see
    the module docstring); then ``cluster.run(g)``. Inspect it with :meth:`label`,
    :meth:`to_networkx`, :meth:`critical_path` and :meth:`preview`.
    """

    def __init__(self, name: str = "graph"):
        self.name = name
        self.tasks: list[Task] = []
        self.data: list[Data] = []
        self._data_index: dict[tuple, int] = {}
        self._last_writer: list[int] = []
        self._readers: list[list[int] | None] = []  # None: no reader since the last write
        self._values: dict[int, int] = {}  # task -> the data id of its value
        self._order: list[int] | None = None
        self._succ: list[list[int]] | None = None
        self._backward = False  # an explicit dependency on a later task exists
        self.results: dict[int, object] = {}
        self.result_ranks: dict[int, int] = {}
        self.fetch: Callable[[int], object] | None = None  # gets a value from an engine
        self._marks: dict[Access, tuple[int, Ref, int]] = {}  # while recording only
        self._refs: dict[tuple[int, int], Ref] = {}
        self._matrices: dict[int, TiledMatrix] = {}

    def __getstate__(self) -> dict:
        # what travels to the engines: the tasks and data, not results or hooks
        state = dict(self.__dict__)
        state.update(results={}, fetch=None, _order=None, _succ=None, _marks={}, _refs={})
        state.update(_matrices={})
        return state

    # -- context -------------------------------------------------------------------

    def __enter__(self) -> Graph:
        if not hasattr(_stack, "graphs"):
            _stack.graphs = []
        _stack.graphs.append(self)
        # Recording makes millions of small objects and no reference cycles; the
        # cyclic collector would walk the whole growing heap again and again (over
        # half the build time of a 10^6-task graph). It is paused while recording.
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc) -> None:
        _stack.graphs.pop()
        # the recording caches hold tile handles, which refer back to their matrices
        self._marks = {}
        self._refs = {}
        for m in self._matrices.values():
            m.forget_handles()
        self._matrices = {}
        if self.__dict__.pop("_gc_was_enabled", True):
            gc.enable()

    @staticmethod
    def active() -> Graph | None:
        graphs = getattr(_stack, "graphs", None)
        return graphs[-1] if graphs else None

    @staticmethod
    def current(what: str) -> Graph:
        g = Graph.active()
        if g is None:
            raise GraphError(f"{what}() was called on tiles outside `with tg.Graph():`")
        return g

    # -- recording -----------------------------------------------------------------

    def _data_id(self, key: tuple, tile=None, producer: int = INITIAL) -> int:
        d = self._data_index.get(key)
        if d is None:
            d = len(self.data)
            self._data_index[key] = d
            self.data.append(Data(key, tile, producer))
            self._last_writer.append(INITIAL)
            self._readers.append(None)
        return d

    def add_kernel_task(self, kernel, args) -> TaskRef:
        """Record ``kernel(*args)``; every argument must be a marked tile.

        This is the hot loop of building a large graph, so it works from per-mark
        facts looked up by the mark's identity (a matrix hands out the same marks
        for a tile while a graph is recorded): the data id, a shared :class:`Ref`,
        and an interned signature id. The check of modes, shapes and dtypes against
        the kernel's declaration, and the task's flops, are computed once per
        distinct signature: a Cholesky graph has a handful, and up to millions of
        tasks.
        """
        marks = self._marks
        ds, refs, sigs = [], [], []  # (no comprehensions: each is a call before 3.12)
        for a in args:
            p = marks.get(a) if a.__class__ is Access else None
            if p is None:
                p = self._mark_facts(kernel, args, a)
            ds.append(p[0])
            refs.append(p[1])
            sigs.append(p[2])
        key = tuple(sigs)
        known = kernel.signatures.get(key)
        if known is None:
            known = _check_signature(kernel, key)
        if known[0]:
            raise GraphError(f"task {self._kernel_label(kernel, args)}: {known[0]}")
        if len(ds) > 1 and len(set(ds)) < len(ds):  # a tile twice
            modes: dict[int, int] = {}
            for ref in refs:
                self._merge_mode(modes, ref, lambda: self._kernel_label(kernel, args))
            return self._add(kernel, tuple(refs), None, modes, known[1])

        # _add, for distinct data (no merging of modes needed)
        tid = len(self.tasks)
        last_writer, readers_of = self._last_writer, self._readers
        preds: list[int] = []
        reads, writes = [], []
        for ref in refs:
            d = ref.data
            mode = ref.mode
            last = last_writer[d]
            if mode & 1:
                reads.append((d, last))
                if last >= 0:
                    preds.append(last)  # RAW
            if mode & 2:
                readers = readers_of[d]
                if readers:
                    preds.extend(readers)  # WAR
                elif last >= 0 and not mode & 1:
                    preds.append(last)  # WAW
                writes.append((d, last))
                last_writer[d] = tid
                readers_of[d] = None
            else:
                known_readers = readers_of[d]
                if known_readers is None:
                    readers_of[d] = [tid]
                else:
                    known_readers.append(tid)
        if len(preds) > 1:
            preds = sorted(set(preds))
        self.tasks.append(
            Task(tid, kernel, tuple(refs), None, tuple(reads), tuple(writes), preds, known[1])
        )
        self._order = self._succ = None
        return TaskRef(self, tid)

    def _mark_facts(self, kernel, args, a) -> tuple[int, Ref, int]:
        """(data id, shared Ref, signature id) of a marked tile, remembered per mark."""
        if a.__class__ is not Access and not isinstance(a, Access):
            self._not_marked(kernel, args)
        t = a.tile
        m = t.matrix
        d = self._data_id((m.uid, t.i, t.j), t)
        ref = self._ref(d, a.code)
        sig = (a.code, m.tile_shape(t.i, t.j), m.dtype)
        sig_id = _SIGNATURES.setdefault(sig, len(_SIGNATURES))
        facts = (d, ref, sig_id)
        self._marks[a] = facts
        if m.uid not in self._matrices:
            self._matrices[m.uid] = m
        return facts

    def _ref(self, d: int, mode: int) -> Ref:
        """The Ref of data ``d`` in ``mode``, shared by every task that uses it so."""
        ref = self._refs.get((d, mode))
        if ref is None:
            ref = self._refs[d, mode] = Ref(d, mode)
        return ref

    @staticmethod
    def _kernel_label(kernel, args) -> str:
        return f"{kernel.name}({', '.join(repr(a.tile) for a in args)})"

    @staticmethod
    def _not_marked(kernel, args) -> None:
        for i, a in enumerate(args):
            if isinstance(a, Access):
                continue
            if hasattr(a, "matrix"):
                hint = f"mark it: {a!r}.r, {a!r}.w or {a!r}.rw"
            else:
                hint = "kernels take marked tiles such as A[i, j].rw"
            raise GraphError(
                f"task {kernel.name}(...): argument {i + 1} ({nested.describe(a)}) is not a "
                "marked tile; " + hint
            )

    def add_call(self, fn: TaskFunction, args, kwargs) -> Future:
        """Record a call of a ``@tg.task`` function; returns its future."""
        if not kwargs:
            future = self._add_plain_call(fn, args)
            if future is not None:
                return future
        tid = len(self.tasks)
        task_fn: TaskFunction | nested.PackedCall
        if nested.needs_packing(args, kwargs):  # futures in containers, or arrays
            task_fn, enc_args = nested.pack(fn, args, kwargs, self._encode)
            enc_kwargs = None
        else:
            encode = self._encode
            task_fn, enc_args = fn, tuple([encode(a) for a in args])
            enc_kwargs = {k: encode(v) for k, v in kwargs.items()} or None

        def label() -> str:  # only an error message needs it
            return f"{fn.name}#{tid}({self._args_label(task_fn, enc_args, enc_kwargs)})"

        self._record(task_fn, enc_args, enc_kwargs, label, fn.cost_value)
        # the value this task returns is data too, written by it
        d = len(self.data)
        self.data.append(Data(None, None, tid))
        self._last_writer.append(tid)
        self._readers.append(None)
        self._values[tid] = d
        task = self.tasks[tid]
        task.writes = task.writes + ((d, INITIAL),)
        return Future(self, tid)

    def _add_plain_call(self, fn: TaskFunction, args) -> Future | None:
        """The common call, recorded quickly: positional arguments that are futures
        of this graph or constants. None if another kind of argument needs the
        general path. A value is written once, by its task, so reading one needs
        no list of readers (those only serve later writers)."""
        values = self._values
        enc, reads, preds = [], [], []
        for a in args:
            if a.__class__ is Future and a.graph is self:
                d = values[a.id]
                enc.append(Ref(d, 1))
                reads.append((d, a.id))
                preds.append(a.id)
            elif a.__class__ in _CONSTANTS:
                enc.append(a)
            else:
                return None
        if len(preds) > 1:
            unique = sorted(set(preds))
            if len(unique) < len(preds):  # the same future twice: one read
                reads = list(dict.fromkeys(reads))
            preds = unique
        tid = len(self.tasks)
        d = len(self.data)
        self.data.append(Data(None, None, tid))
        self._last_writer.append(tid)
        self._readers.append(None)
        values[tid] = d
        self.tasks.append(
            Task(tid, fn, tuple(enc), None, tuple(reads), ((d, INITIAL),), preds, fn.cost_value)
        )
        self._order = self._succ = None
        return Future(self, tid)

    def _encode(self, a):
        if isinstance(a, TaskRef) and not isinstance(a, Future):
            raise GraphError(
                f"{a!r} is a kernel task: it has no value to pass on; "
                "pass the tiles it wrote, or use graph.add_dependency()"
            )
        if isinstance(a, Future):
            if a.graph is not self:
                raise GraphError(f"{a!r} belongs to graph {a.graph.name!r}, not {self.name!r}")
            return Ref(self._values[a.id], 1)
        if isinstance(a, Access):
            return self._ref(self._data_id(a.tile.key, a.tile), a.code)
        if hasattr(a, "matrix") and hasattr(a, "key"):  # a bare tile: read it
            return self._ref(self._data_id(a.key, a), 1)
        return a

    def _record(self, fn, args, kwargs, label: Callable[[], str], cost: float = 1.0) -> TaskRef:
        """Add a task; infer its edges from the data its Refs touch (modes as ints)."""
        modes: dict[int, int] = {}
        for r in args:
            if r.__class__ is Ref:
                if r.data in modes:
                    self._merge_mode(modes, r, label)
                else:
                    modes[r.data] = r.mode
        if kwargs:
            for r in kwargs.values():
                if r.__class__ is Ref:
                    self._merge_mode(modes, r, label)
        return self._add(fn, args, kwargs, modes, cost)

    def _add(self, fn, args, kwargs, modes: dict[int, int], cost: float) -> TaskRef:
        """Append the task; its edges follow from the modes of the data it touches."""
        tid = len(self.tasks)
        preds: set[int] = set()
        reads, writes = [], []
        last_writer, readers_of = self._last_writer, self._readers
        for d, mode in modes.items():
            last = last_writer[d]
            if mode & 1:  # reads
                reads.append((d, last))
                if last != INITIAL:
                    preds.add(last)  # RAW
            if mode & 2:  # writes
                readers = readers_of[d]
                if readers:
                    preds.update(readers)  # WAR
                elif last != INITIAL:
                    preds.add(last)  # WAW
                writes.append((d, last))
                last_writer[d] = tid
                readers_of[d] = None
            else:
                known = readers_of[d]
                if known is None:
                    readers_of[d] = [tid]
                else:
                    known.append(tid)
        preds.discard(tid)
        self.tasks.append(
            Task(tid, fn, args, kwargs, tuple(reads), tuple(writes), sorted(preds), cost)
        )
        self._order = self._succ = None
        return TaskRef(self, tid)

    def _merge_mode(self, modes: dict[int, int], r: Ref, label: Callable[[], str]) -> None:
        seen = modes.get(r.data)
        if seen is None:
            modes[r.data] = r.mode
        elif (seen | r.mode) & 2:
            raise GraphError(
                f"task {label()}: {self.data[r.data].label()} is both written and used "
                "again by the same task"
            )

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
            self._order = self._succ = None
            if b > a:
                self._backward = True  # task order is no longer a topological order

    # -- inspection ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def ntasks(self) -> int:
        return len(self.tasks)

    @property
    def has_values(self) -> bool:
        """Whether any ``@tg.task`` call (a task with a value) is in the graph."""
        return bool(self._values)

    @property
    def nedges(self) -> int:
        return sum(len(t.preds) for t in self.tasks)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {self.ntasks} tasks, {self.nedges} edges>"

    def label(self, tid: int) -> str:
        """A readable name: ``potrf(A[2,2])`` or ``simulate#7(3, <task 2>)``."""
        t = self.tasks[tid]
        if t.kwargs is None and all(isinstance(a, Ref) for a in t.args) and t.args:
            if all(self.data[a.data].is_tile for a in t.args):
                return f"{t.name}({', '.join(self.data[a.data].label() for a in t.args)})"
        return f"{t.name}#{tid}({self._args_label(t.fn, t.args, t.kwargs)})"

    def _args_label(self, fn, args, kwargs) -> str:
        if isinstance(fn, nested.PackedCall):
            return fn.label([self._arg_label(a) for a in args])
        parts = [self._arg_label(a) for a in args]
        parts += [f"{k}={self._arg_label(v)}" for k, v in (kwargs or {}).items()]
        return ", ".join(parts)

    def _arg_label(self, a) -> str:
        if isinstance(a, Ref):
            d = self.data[a.data]
            return repr(d.tile) if d.is_tile else f"<task {d.producer}>"
        return nested.describe(a)

    def drop_caches(self) -> None:
        """Forget the successor lists (they are rebuilt when next needed)."""
        self._succ = None

    def successors(self) -> list[list[int]]:
        """Each task's successors (computed once per shape of the graph; do not modify)."""
        if self._succ is None:
            succ: list[list[int]] = [[] for _ in self.tasks]
            for t in self.tasks:
                for p in t.preds:
                    succ[p].append(t.id)
            self._succ = succ
        return self._succ

    def order(self) -> list[int]:
        """A topological order of the tasks; raises GraphError naming a cycle."""
        if self._order is not None:
            return self._order
        # recorded tasks only wait for earlier ones; an explicit edge may point back
        if not self._backward:
            self._order = list(range(len(self.tasks)))
            return self._order
        indeg = [len(t.preds) for t in self.tasks]
        succ = self.successors()
        ready = [t for t, n in enumerate(indeg) if n == 0]
        order = []
        while ready:
            t = ready.pop()
            order.append(t)
            for s in succ[t]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if len(order) < len(self.tasks):
            raise GraphError(self._cycle_message({t for t, n in enumerate(indeg) if n > 0}))
        self._order = order
        return order

    def _cycle_message(self, stuck: set[int]) -> str:
        import networkx as nx

        sub = nx.DiGraph()
        sub.add_edges_from((p, t) for t in stuck for p in self.tasks[t].preds if p in stuck)
        cycle = [u for u, _ in nx.find_cycle(sub)]
        names = " -> ".join(self.label(t) for t in cycle + cycle[:1])
        return f"graph {self.name!r} has a cycle: {names}"

    def check(self) -> None:
        """Raise GraphError if the graph cannot run (today: a cycle)."""
        self.order()

    def costs(self) -> list[float]:
        """The cost (flops, or the declared cost) of every task."""
        return [t.cost for t in self.tasks]

    def bottom_levels(self, costs: list[float] | None = None) -> list[float]:
        """Cost of the heaviest path from each task to the end of the graph."""
        costs = costs if costs is not None else self.costs()
        tasks = self.tasks
        level = [0.0] * len(tasks)  # the heaviest successor's level, until t is reached
        for t in reversed(self.order()):
            lv = level[t] = costs[t] + level[t]
            for p in tasks[t].preds:
                if level[p] < lv:
                    level[p] = lv
        return level

    def critical_path(self) -> tuple[float, list[int]]:
        """(length, tasks) of the heaviest path through the graph, by task cost."""
        if not self.tasks:
            return 0.0, []
        level = self.bottom_levels()
        succ = self.successors()
        t = max(
            (t for t in range(len(self.tasks)) if not self.tasks[t].preds),
            key=lambda t: (level[t], -t),
        )
        path = [t]
        while succ[t]:
            t = max(succ[t], key=lambda s: (level[s], -s))
            path.append(t)
        return level[path[0]], path

    @property
    def critical_path_length(self) -> float:
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
        return {d.tile.dtype for d in self.data if d.tile is not None}

    def matrices(self) -> list[TiledMatrix]:
        seen: dict[int, TiledMatrix] = {}
        for d in self.data:
            if d.tile is not None:
                seen.setdefault(d.tile.matrix.uid, d.tile.matrix)
        return list(seen.values())

    # -- results -------------------------------------------------------------------

    def result(self, tid: int):
        if tid in self.results:
            return self.results[tid]
        if self.fetch is not None and tid in self.result_ranks:
            self.results[tid] = value = self.fetch(tid)
            return value
        if tid in self.result_ranks:
            raise GraphError(
                f"the value of task {self.label(tid)} lives on rank {self.result_ranks[tid]}; "
                "only values of tasks that no other task uses are shared with every rank"
            )
        raise GraphError(f"task {self.label(tid)} has not run yet: run the graph first")


def iter_refs(task: Task) -> Iterable[Ref]:
    for a in task.args:
        if isinstance(a, Ref):
            yield a
    if task.kwargs:
        for v in task.kwargs.values():
            if isinstance(v, Ref):
                yield v
