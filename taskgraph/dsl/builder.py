"""Recording calls into a graph: the one place where dependencies are inferred.

A :class:`Builder` belongs to one :class:`taskgraph.dsl.graph.Graph` and appends to
its task and data lists while ``with graph:`` is open. It keeps, for every piece of
data, its last writer and the readers since then, and :meth:`Builder.append` turns
the data a new task touches into the edges a sequential run implies::

    read  after write  (RAW): the reader waits for the last writer
    write after read   (WAR): the writer waits for every reader since the last write
    write after write  (WAW): the writer waits for the last writer (if no reader between)

Readers of the same version get no edges between them. Every recording path (kernel
calls on marked tiles or plain data, ``@tg.task`` calls) ends in :meth:`Builder.append`,
except the
plain call of futures and constants (:meth:`Builder.add_plain_call`): a value has one
writer, its task, so reading one is RAW alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import GraphError
from . import nested
from .access import Access, Mode
from .datadeps import Data as DataHandle
from .tasks import INITIAL, Data, Future, Ref, Task, TaskRef

if TYPE_CHECKING:
    from .graph import Graph, TaskFunction
    from .tiled import TiledMatrix

_stack = threading.local()  # the builders of the graphs open in this thread

# arguments a call passes on as they are, without a look at what they might refer to
_CONSTANTS = frozenset({int, float, complex, str, bytes, bool, type(None)})

# kernel arguments passed as they are (scalars): numbers, and small tuples of them
_SCALARS = (int, float, complex, bool, np.integer, np.floating, np.complexfloating, np.bool_)
_SCALAR_TUPLE = 16  # the most items a scalar tuple may have

# (mode, tile shape, dtype) of a kernel argument -> a small int, for signature keys;
# a scalar's is (0, (), its type), a scalar tuple's (0, (), (the types of its items))
_SIGNATURES: dict[tuple, int] = {}
_SIGNATURE_OF: dict[int, tuple] = {}


def active() -> Builder | None:
    """The builder of the innermost graph open in this thread, or None."""
    builders = getattr(_stack, "builders", None)
    return builders[-1] if builders else None


def current(what: str) -> Builder:
    """:func:`active`, or GraphError saying that ``what()`` needs an open graph."""
    builders = getattr(_stack, "builders", None)
    if not builders:
        raise GraphError(f"{what}() was called on tiles outside `with tg.Graph():`")
    return builders[-1]


def push(builder: Builder) -> None:
    """Make ``builder`` the active one in this thread (``with graph:``)."""
    if not hasattr(_stack, "builders"):
        _stack.builders = []
    _stack.builders.append(builder)


def pop() -> None:
    """Undo the last :func:`push` of this thread."""
    _stack.builders.pop()


def _check_signature(kernel, key: tuple[int, ...]) -> tuple[str, float]:
    """Check a kernel's arguments once per signature; remember (problem, flops)."""
    if len(_SIGNATURE_OF) != len(_SIGNATURES):
        _SIGNATURE_OF.update({v: k for k, v in _SIGNATURES.items()})
    sig = [_SIGNATURE_OF[k] for k in key]
    modes = [Mode(s[0]) if s[0] else None for s in sig]
    shapes, dtypes = [s[1] for s in sig], [s[2] for s in sig]
    problem = kernel.check(modes, shapes, dtypes)
    known = (problem, kernel.cost(shapes) if not problem else 0.0)
    kernel.signatures[key] = known
    return known


class Builder:
    """Records calls into ``graph`` (its ``tasks``, ``data`` and values) and infers
    the edges; see the module docstring."""

    def __init__(self, graph: Graph):
        # the graph while it records (see open); no cycle holds it, or its tiles, after
        self.graph: Graph = None  # type: ignore[assignment]
        self.tasks: list[Task] = graph.tasks
        self.data: list[Data] = graph.data
        self.values: dict[int, int] = graph._values  # task -> the data id of its value
        self._data_index: dict[tuple, int] = {}
        self.last_writer: list[int] = []
        self.readers: list[list[int] | None] = []  # None: no reader since the last write
        self._marks: dict[Access, tuple[int, Ref, int]] = {}  # while recording only
        self._refs: dict[tuple[int, int], Ref] = {}
        self._matrices: dict[int, TiledMatrix] = {}

    def __getstate__(self) -> dict:
        # the per-mark caches hold tiles, which refer back to their matrices
        return dict(self.__dict__, _marks={}, _refs={}, _matrices={})

    def open(self, graph: Graph) -> None:
        """Start recording into ``graph`` (``with graph:`` begins)."""
        self.graph = graph

    def close(self) -> None:
        """End one recording (``with graph:`` ends): drop the graph and the caches."""
        self.graph = None  # type: ignore[assignment]
        self._marks = {}
        self._refs = {}
        for m in self._matrices.values():
            m.forget_handles()
        self._matrices = {}

    # -- the inference ---------------------------------------------------------------

    def append(self, fn, args, kwargs, touched, cost: float) -> TaskRef:
        """Append task ``fn(*args, **kwargs)`` of cost ``cost``; ``touched`` holds one
        :class:`Ref` per distinct piece of data it uses, and its mode gives the edges
        (RAW, WAR, WAW) and the versions read and overwritten."""
        tasks = self.tasks
        tid = len(tasks)
        last_writer, readers_of = self.last_writer, self.readers
        preds: list[int] = []
        reads, writes = [], []
        for ref in touched:
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
        tasks.append(Task(tid, fn, args, kwargs, tuple(reads), tuple(writes), preds, cost))
        return TaskRef(self.graph, tid)

    def _merged(self, refs, label: Callable[[], str]) -> list[Ref]:
        """One Ref per distinct data of ``refs``; GraphError if one is written and
        used again by the same task."""
        modes: dict[int, int] = {}
        for r in refs:
            seen = modes.get(r.data)
            if seen is None:
                modes[r.data] = r.mode
            elif (seen | r.mode) & 2:
                raise GraphError(
                    f"task {label()}: {self.data[r.data].label()} is both written and used "
                    "again by the same task"
                )
        return [self._ref(d, mode) for d, mode in modes.items()]

    # -- kernel calls ----------------------------------------------------------------

    def data_id(self, key: tuple, tile=None, item: DataHandle | None = None) -> int:
        """The id of the data with ``key`` (a tile's, or a plain datum's: then ``item``
        is its handle), added on first use."""
        d = self._data_index.get(key)
        if d is None:
            d = len(self.data)
            self._data_index[key] = d
            self.data.append(Data(key, tile, INITIAL, item))
            self.last_writer.append(INITIAL)
            self.readers.append(None)
        return d

    def add_kernel_task(self, kernel, args) -> TaskRef:
        """Record ``kernel(*args)``; every argument must be a marked tile, marked plain
        data (``tg.rw(x)``) or, where the kernel declares one, a scalar (passed on as a
        constant of the task).

        Per-mark facts are looked up by the mark's identity (a matrix hands out the
        same marks for a tile while a graph is recorded): a shared :class:`Ref` and an
        interned signature id. The check of modes, shapes and dtypes against the
        kernel's declaration, and the task's flops, are computed once per distinct
        signature: a Cholesky graph has a handful, and up to millions of tasks.
        """
        marks = self._marks
        ds, refs, sigs = [], [], []  # (no comprehensions: each is a call before 3.12)
        scalars = False
        for a in args:
            p = marks.get(a) if a.__class__ is Access else None
            if p is None:
                p = self._mark_facts(kernel, args, a)
                scalars = scalars or p[0] is None
            ds.append(p[0])
            refs.append(p[1])
            sigs.append(p[2])
        key = tuple(sigs)
        known = kernel.signatures.get(key)
        if known is None:
            known = _check_signature(kernel, key)
        if known[0]:
            raise GraphError(f"task {self._kernel_label(kernel, args)}: {known[0]}")
        task_args = tuple(refs)
        touched = task_args
        if scalars:  # the constants are arguments, not data
            touched = tuple([r for r in refs if r.__class__ is Ref])
            ds = [d for d in ds if d is not None]
        if len(ds) > 1 and len(set(ds)) < len(ds):  # a tile twice
            merged = self._merged(touched, lambda: self._kernel_label(kernel, args))
            return self.append(kernel, task_args, None, merged, known[1])
        return self.append(kernel, task_args, None, touched, known[1])

    def _mark_facts(self, kernel, args, a) -> tuple:
        """(data id, shared Ref, signature id) of a marked tile or datum, remembered
        per mark; (None, the value, signature id) of a scalar."""
        if a.__class__ is not Access and not isinstance(a, Access):
            kind = _scalar_kind(a)
            if kind is None:
                self._not_marked(kernel, args)
            return (None, a, _SIGNATURES.setdefault((0, (), kind), len(_SIGNATURES)))
        t = a.tile
        if t.__class__ is DataHandle:
            return self._datum_facts(kernel, args, a, t)
        m = t.matrix
        d = self.data_id((m.uid, t.i, t.j), t)
        sig = (a.code, m.tile_shape(t.i, t.j), m.dtype)
        facts = (d, self._ref(d, a.code), _SIGNATURES.setdefault(sig, len(_SIGNATURES)))
        self._marks[a] = facts
        if m.uid not in self._matrices:
            self._matrices[m.uid] = m
        return facts

    def _datum_facts(self, kernel, args, a: Access, item: DataHandle) -> tuple:
        """:meth:`_mark_facts` of a marked plain datum (it must be an array)."""

        def label() -> str:  # only an error message needs it
            return self._kernel_label(kernel, args)

        if not item.is_array:
            raise GraphError(
                f"task {label()}: {item.describe()} is not a NumPy array: kernels take arrays "
                "and tiles; pass objects to @tg.task functions"
            )
        d = self._datum_id(item, a.code, label)
        sig = (a.code, item.shape, item.dtype)
        facts = (d, self._ref(d, a.code), _SIGNATURES.setdefault(sig, len(_SIGNATURES)))
        self._marks[a] = facts
        return facts

    def _datum_id(self, item: DataHandle, mode: int, label: Callable[[], str]) -> int:
        """The data id of a plain datum used in ``mode``; GraphError naming the task if
        it cannot be sent between ranks, or is a read-only array marked as written."""
        problem = item.problem()
        if problem:
            raise GraphError(f"task {label()}: {problem}")
        if mode & 2 and item.is_array and not item.value.flags.writeable:
            raise GraphError(
                f"task {label()}: {item.describe()} is marked as written but is a read-only "
                "array: mark it .r, or mark a writable copy"
            )
        return self.data_id(item.key, None, item)

    def _ref(self, d: int, mode: int) -> Ref:
        """The Ref of data ``d`` in ``mode``, shared by every task that uses it so."""
        ref = self._refs.get((d, mode))
        if ref is None:
            ref = self._refs[d, mode] = Ref(d, mode)
        return ref

    @staticmethod
    def _kernel_label(kernel, args) -> str:
        shown = (_shown(a.tile) if isinstance(a, Access) else nested.describe(a) for a in args)
        return f"{kernel.name}({', '.join(shown)})"

    @staticmethod
    def _not_marked(kernel, args) -> None:
        for i, a in enumerate(args):
            if isinstance(a, Access):
                continue
            if _scalar_kind(a) is not None:
                continue
            modes = kernel.modes
            if i < len(modes) and modes[i] is None:  # a scalar is declared here
                raise GraphError(
                    f"task {kernel.name}(...): argument {i + 1} must be a scalar "
                    f"({kernel.scalars[i]}), not {nested.describe(a)}"
                )
            what = "a marked tile" if hasattr(a, "matrix") else "marked data"
            if hasattr(a, "matrix"):
                hint = f"mark it: {a!r}.r, {a!r}.w or {a!r}.rw"
            elif isinstance(a, DataHandle):
                hint = f"mark it: {a!r}.r, {a!r}.w or {a!r}.rw"
            elif isinstance(a, np.ndarray):
                hint = "mark it: tg.r(x), tg.w(x) or tg.rw(x)"
            else:
                hint = "kernels take marked tiles (A[i, j].rw), marked arrays (tg.rw(x)) or scalars"
            raise GraphError(
                f"task {kernel.name}(...): argument {i + 1} ({nested.describe(a)}) is not "
                f"{what}; " + hint
            )

    # -- @tg.task calls --------------------------------------------------------------

    def add_call(self, fn: TaskFunction, args, kwargs) -> Future:
        """Record a call of a ``@tg.task`` function; returns its future."""
        if not kwargs:
            future = self.add_plain_call(fn, args)
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
            return f"{fn.name}#{tid}({self.graph.args_label(task_fn, enc_args, enc_kwargs)})"

        refs = [r for r in enc_args if r.__class__ is Ref]
        refs += [r for r in (enc_kwargs or {}).values() if r.__class__ is Ref]
        self._check_data(refs, label)
        self.append(task_fn, enc_args, enc_kwargs, self._merged(refs, label), fn.cost_value)
        task = self.tasks[tid]
        task.writes = task.writes + ((self._new_value(tid), INITIAL),)
        return Future(self.graph, tid)

    def _check_data(self, refs: list[Ref], label: Callable[[], str]) -> None:
        """GraphError naming the task for plain data it cannot use (see _datum_id)."""
        data = self.data
        for r in refs:
            item = data[r.data].item
            if item is not None:
                self._datum_id(item, r.mode, label)

    def _new_value(self, tid: int) -> int:
        """Data for the value task ``tid`` returns, written by it; its id."""
        d = len(self.data)
        self.data.append(Data(None, None, tid))
        self.last_writer.append(tid)
        self.readers.append(None)
        self.values[tid] = d
        return d

    def add_plain_call(self, fn: TaskFunction, args) -> Future | None:
        """The common call, recorded quickly: positional arguments that are futures
        of this graph or constants. None if another kind of argument needs the
        general path. A value is written once, by its task, so reading one needs
        no list of readers (those only serve later writers)."""
        values = self.values
        graph = self.graph
        enc, reads, preds = [], [], []
        for a in args:
            if a.__class__ is Future and a.graph is graph:
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
        d = len(self.data)  # _new_value, inline: this is the hot path of a futures graph
        self.data.append(Data(None, None, tid))
        self.last_writer.append(tid)
        self.readers.append(None)
        values[tid] = d
        self.tasks.append(
            Task(tid, fn, tuple(enc), None, tuple(reads), ((d, INITIAL),), preds, fn.cost_value)
        )
        return Future(graph, tid)

    def _encode(self, a):
        if isinstance(a, TaskRef) and not isinstance(a, Future):
            raise GraphError(
                f"{a!r} is a kernel task: it has no value to pass on; "
                "pass the tiles it wrote, or use graph.add_dependency()"
            )
        graph = self.graph
        if isinstance(a, Future):
            if a.graph is not graph:
                raise GraphError(f"{a!r} belongs to graph {a.graph.name!r}, not {graph.name!r}")
            return Ref(self.values[a.id], 1)
        if isinstance(a, Access):
            t = a.tile
            if t.__class__ is DataHandle:
                return self._ref(self.data_id(t.key, None, t), a.code)
            return self._ref(self.data_id(t.key, t), a.code)
        if a.__class__ is DataHandle:  # a bare datum, as a bare tile: read it
            return self._ref(self.data_id(a.key, None, a), 1)
        if hasattr(a, "matrix") and hasattr(a, "key"):  # a bare tile: read it
            return self._ref(self.data_id(a.key, a), 1)
        return a


def _shown(t) -> str:
    """A marked tile or datum in a task's label (a datum: its name, dtype and shape)."""
    return t.describe() if t.__class__ is DataHandle else repr(t)


def _scalar_kind(a):
    """A scalar kernel argument's type (a tuple's: its items' types), or None if ``a``
    is not a scalar: a number, a bool, or a small tuple of them."""
    if isinstance(a, _SCALARS):
        return a.__class__
    if a.__class__ is tuple and 0 < len(a) <= _SCALAR_TUPLE:
        if all(isinstance(x, _SCALARS) for x in a):
            return tuple(x.__class__ for x in a)
    return None
