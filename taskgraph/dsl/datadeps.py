"""Plain data a task reads or writes: NumPy arrays of any shape and dtype, and objects.

``tg.rw(y)`` marks ``y`` as read and written by the call it is passed to, as
``A[i, j].rw`` marks a tile; the graph infers dependencies from the marks (as
Dagger.jl's Datadeps, StarPU's data handles and PyCOMPSs's ``INOUT`` do)::

    x, y = np.arange(4.0), np.zeros(4)
    with tg.Graph() as g:
        axpy(tg.r(x), tg.rw(y))      # a kernel call
        scale(tg.rw(y), 2.0)         # a @tg.task call: scale gets y itself

Each object has one :class:`Data` handle per process (``tg.Data(x)`` twice gives the
same handle), which keeps the object alive. A handle pickles with its value and comes
back, in another process, as one handle per handle of the sender, kept there for the
life of that process: a graph sent twice to an engine refers to the same array there
both times.

**Where the values are.** At the start of a run the values the caller holds are the
truth: a handle an engine knows already takes the value the notebook sends with the
next run (copied into the engine's array in place when shape and dtype match). During
the run a datum lives on its home rank, where its writers update it in place. When a
run ends well, every datum it wrote holds its final value everywhere the user can
look (:func:`settle`)::

    home rank ──Bcast (arrays: the buffer; objects: pickle protocol 5)──► every rank
    engine rank 0 ──the run's summary──► the notebook's own arrays and objects

on every rank of a batch job and on every engine, and in the notebook. Arrays are
updated in place (``np.copyto`` into the same array object); objects too where Python
allows it (the contents of a list, dict, set or bytearray, else the ``__dict__`` of an
object of the same type). Any other object (a tuple, a str, an object with slots
only) cannot change in place: off its home rank the handle gets the new object
(``tg.Data(x).value``, and later graphs use it), but the user's own variable still
names the old one. A failed run changes nothing off the home ranks (what its tasks
wrote there stays). While an engine run that writes a datum is still going, a later
run sends the handle marked not fresh: the engines keep their value, which the earlier
run updates.
"""

from __future__ import annotations

import itertools
import os
import pickle
import uuid
import weakref
from collections.abc import Container

import numpy as np

from ..core.errors import GraphError
from .access import Access, Markable
from .tasks import TaskRef

_uids = itertools.count()
# who made a handle: a handle that comes back from pickling is found again by it
_ORIGIN = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
_by_object: weakref.WeakValueDictionary[int, Data] = weakref.WeakValueDictionary()
_by_uid: weakref.WeakValueDictionary[tuple[str, int], Data] = weakref.WeakValueDictionary()
# handles received from other processes live as long as this one (an engine): a later
# graph on the same data sees what the earlier ones wrote, whatever the engine dropped
_received: dict[tuple[str, int], Data] = {}


class Data(Markable):
    """A handle on a NumPy array or a picklable object that tasks read and write.

    value:
        The array or object (any NumPy dtype, any number of dimensions).
    rank:
        The rank it lives on, or None: the planner chooses one by size.
    name:
        The name in labels and messages (default ``Data#<uid>``).

    ``tg.Data(x)`` of an object that already has a handle returns that handle.
    Mark it with ``D.r``, ``D.w`` or ``D.rw`` (or ``tg.r(D)``...).
    """

    __slots__ = (
        "value",
        "rank",
        "name",
        "uid",
        "origin",
        "_problem",
        "_pickled_size",
        "_in_flight",
        "__weakref__",
    )

    def __new__(cls, value, rank: int | None = None, name: str | None = None):
        if isinstance(value, Data):
            value._agree(rank, name)
            return value
        _refuse_handles(value, "tg.Data")
        known = _by_object.get(id(value))
        if known is not None and known.value is value:
            known._agree(rank, name)
            return known
        self = object.__new__(cls)
        self._setup(value, _check_rank(rank, name), name, next(_uids), _ORIGIN)
        _by_object[id(value)] = self
        return self

    def _setup(self, value, rank: int | None, name: str | None, uid: int, origin: str) -> None:
        self.value = value
        self.rank = rank
        self.uid = uid
        self.origin = origin
        self.name = name or f"Data#{uid}"
        self.forget_marks()
        self._problem: str | None = None  # None: not checked yet
        self._pickled_size = 64  # (measured by problem(), for objects)
        self._in_flight = 0  # engine runs going that write it: its value here is stale
        _by_uid[origin, uid] = self

    def _agree(self, rank: int | None, name: str | None) -> None:
        """Pin or name a handle made before; ValueError if that contradicts it."""
        rank = _check_rank(rank, self.name)
        if rank is not None and self.rank is not None and rank != self.rank:
            raise ValueError(f"{self.name} is pinned to rank {self.rank}, not {rank}")
        if rank is not None:
            self.rank = rank
        if name is not None and name != self.name:
            if not self.name.startswith("Data#"):
                raise ValueError(f"{self.name} already has a name; cannot call it {name!r}")
            self.name = name

    def __reduce__(self):
        # the receiver takes the value, unless a run still going writes it (not fresh):
        # then it keeps its own, which that run updates (the value is for one that has none)
        fresh = not self._in_flight
        return (_restore, (self.origin, self.uid, self.value, self.rank, self.name, _ORIGIN, fresh))

    def hold(self, runs: int) -> None:
        """Count ``runs`` more (or fewer, if negative) engine runs going that write this
        datum: while any is, a process that knows the handle already keeps its own value
        when it receives it (see the module doc)."""
        self._in_flight = max(0, self._in_flight + runs)

    def __repr__(self) -> str:
        return self.name

    # -- what the planner and the executor need ------------------------------------

    @property
    def key(self) -> tuple[str, int]:
        """``("data", uid)``: names this datum in a graph."""
        return ("data", self.uid)

    @property
    def is_array(self) -> bool:
        """Whether the value is a NumPy array sent as a buffer (any dtype but object)."""
        v = self.value
        return isinstance(v, np.ndarray) and v.dtype != object

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The array's shape (None for objects)."""
        return self.value.shape if self.is_array else None

    @property
    def dtype(self) -> np.dtype | None:
        """The array's dtype (None for objects)."""
        return self.value.dtype if self.is_array else None

    @property
    def nbytes(self) -> int:
        """The array's size in bytes; an object's pickled size (measured once)."""
        if self.is_array:
            return int(self.value.nbytes)
        self.problem()
        return self._pickled_size

    def describe(self) -> str:
        """The name, and an array's dtype and shape (never its values)."""
        if self.is_array:
            return f"{self.name}<{self.dtype} {self.shape}>"
        return f"{self.name}<{type(self.value).__name__}>"

    def problem(self) -> str:
        """ "" if the value can be sent between ranks, else why not (checked once)."""
        if self._problem is None:
            self._problem = self._find_problem()
        return self._problem

    def _find_problem(self) -> str:
        v = self.value
        if self.is_array:
            if not (v.flags.c_contiguous or v.flags.f_contiguous):
                return (
                    f"{self.describe()} is a strided view, which cannot move as one buffer: "
                    "mark a contiguous array (np.ascontiguousarray(x)) and read the result there"
                )
            return ""
        try:
            self._pickled_size = len(pickle.dumps(v, protocol=5))
        except (pickle.PicklingError, TypeError, AttributeError, ValueError) as e:
            return f"{self.describe()} cannot be sent to another rank: pickling fails ({e})"
        return ""


def _restore(
    origin: str,
    uid: int,
    value,
    rank: int | None,
    name: str,
    sender: str | None = None,
    fresh: bool = True,
) -> Data:
    """The handle ``(origin, uid)`` in this process: the one made or received before,
    else a new one on the value that came with it. A known handle sent by another
    process (``sender``) with its value (``fresh``) takes that value: the sender's
    is the truth (see :func:`settle`)."""
    known = _by_uid.get((origin, uid))
    if known is not None:
        if fresh and sender is not None and sender != _ORIGIN:
            settle(known, value)
        return known
    self = object.__new__(Data)
    self._setup(value, rank, name, uid, origin)
    if origin != _ORIGIN:
        _received[origin, uid] = self
    if _by_object.get(id(value)) is None:
        _by_object[id(value)] = self
    return self


def update_in_place(old, new) -> bool:
    """Make ``old`` hold what ``new`` holds, in place; False where Python cannot (then
    ``old`` is unchanged). Arrays of the same shape and dtype (``np.copyto``); lists,
    dicts, sets and bytearrays (their contents); other objects of the same type with a
    ``__dict__`` (its contents)."""
    if old is new:
        return True
    if isinstance(old, np.ndarray):
        same = isinstance(new, np.ndarray) and (old.shape, old.dtype) == (new.shape, new.dtype)
        if not same or not old.flags.writeable:
            return False
        np.copyto(old, new)
        return True
    if type(old) is not type(new):
        return False
    if isinstance(old, list | bytearray):
        old[:] = new
    elif isinstance(old, dict | set):
        old.clear()
        old.update(new)
    elif isinstance(getattr(old, "__dict__", None), dict) and not hasattr(type(old), "__slots__"):
        old.__dict__.clear()
        old.__dict__.update(new.__dict__)
    else:
        return False
    return True


def settle(item: Data, new) -> None:
    """``item`` holds ``new`` (a final value from its home, or the notebook's value at
    the start of a run): copied into its value in place where
    :func:`update_in_place` can, else its value becomes ``new``."""
    if update_in_place(item.value, new):
        return
    item.value = new
    item._problem = None  # (checked again for the new value when next used)
    _by_object[id(new)] = item


def written_data(graph, plain: Container[int] | None = None) -> list[int]:
    """The plain data (indices into ``graph.data``) some task of ``graph`` writes, in
    order. ``plain``: the plain data of the graph, if known (a plan's ``homes``; empty:
    none, found at no cost)."""
    if plain is None:
        plain = {d for d, datum in enumerate(graph.data) if datum.item is not None}
    if not plain:
        return []
    return sorted({d for t in graph.tasks for d, _ in t.writes if d in plain})


def _check_rank(rank, name: str | None = None) -> int | None:
    """``rank`` as an int (or None); ValueError naming the data ``name`` if it is not one."""
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or rank < 0:
        raise ValueError(
            f"tg.Data({name or 'x'}, rank={rank!r}): rank must be a rank number "
            "(an int >= 0) or None"
        )
    return int(rank)


def _refuse_handles(x, what: str) -> None:
    """GraphError for what has its own marks or dependencies: futures, tiles, marks."""
    if isinstance(x, TaskRef):
        raise GraphError(
            f"{what}({x!r}): a future is the value of a task; pass it as it is "
            "(a task that gets it reads it and waits for its task)"
        )
    if isinstance(x, Access):
        raise GraphError(f"{what}({x!r}): this is marked already; pass it as it is")
    if hasattr(x, "matrix") and hasattr(x, "key"):
        raise GraphError(f"{what}({x!r}): mark a tile with {x!r}.r, {x!r}.w or {x!r}.rw")
    if hasattr(x, "tiles") and hasattr(x, "uid"):
        raise GraphError(f"{what}({x.name}): mark its tiles (A[i, j].rw), not the whole matrix")


def data(x) -> Data:
    """The handle of ``x`` (a :class:`Data`, or an array or object: its handle, made on
    first use)."""
    return x if isinstance(x, Data) else Data(x)


def r(x) -> Access:
    """``x`` (an array, an object or a :class:`Data`) marked as read by the task."""
    _refuse_handles(x, "tg.r")
    return data(x).r


def w(x) -> Access:
    """``x`` (an array, an object or a :class:`Data`) marked as written by the task:
    it may overwrite it in place (its old contents are not read)."""
    _refuse_handles(x, "tg.w")
    return data(x).w


def rw(x) -> Access:
    """``x`` (an array, an object or a :class:`Data`) marked as read and written by
    the task: it may update it in place."""
    _refuse_handles(x, "tg.rw")
    return data(x).rw
