"""Task arguments with futures or NumPy arrays inside containers.

``total([f(1), f(2)], k={"a": g()})`` passes futures inside a list and a dict: each is
a dependency of the call, and the task gets the containers with the futures' values
in their place, as dask does. The graph records such a call with *flat* arguments
(every leaf, in order) and a :class:`PackedCall` as the task's function, which keeps
the shape of the arguments (a template) and rebuilds them from the leaves' values
when the task runs. The executor resolves flat arguments as it does for any task (a
``Ref`` becomes its value), and the planner sees the reads as for any task::

    total([f1, (f2, 3)], k={"a": f3})
      leaves   (Ref f1, Ref f2, 3, Ref f3)
      template args ([0, (1, 2)],)  kwargs {"k": {"a": 3}}     (ints: leaf indices)

Only list, tuple (and named tuples), dict values, set and frozenset are looked into;
a container with nothing to resolve stays one constant leaf. A set's leaves are
ordered by task id (futures) and by type and repr (others), so that every process
records the same task.

Plain NumPy arrays given to a task are constants of the graph (at any depth). The
task gets a read-only view of each, so that a write into one raises instead of being
lost silently (on another rank it would write a copy), and the error says so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.errors import GraphError
from .access import Access
from .datadeps import Data
from .tasks import TaskRef

# leaves that are never looked into
_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None)})
_SEQUENCES = (list, tuple, set, frozenset)


class _ReadOnly:
    """A template leaf: a NumPy array, handed to the task as a read-only view."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Node:
    """A template container: its type, its items' templates, and a dict's keys."""

    __slots__ = ("kind", "items", "keys")

    def __init__(self, kind: type, items: tuple, keys: tuple | None = None):
        self.kind = kind
        self.items = items
        self.keys = keys


def describe(a) -> str:
    """A short text for an argument in a message: an array by its shape and dtype,
    never its values; anything else by its repr, cut to 40 characters."""
    if isinstance(a, np.ndarray):
        return f"<{a.dtype} array {a.shape}>"
    text = repr(a)
    return text if len(text) <= 40 else text[:37] + "..."


def needs_packing(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a future, a tile or an array the quick encoding
    of top-level arguments misses: one inside a container, or an array anywhere."""
    for a in args:
        if a.__class__ not in _PLAIN and _wants(a, top=True):
            return True
    for v in kwargs.values():
        if v.__class__ not in _PLAIN and _wants(v, top=True):
            return True
    return False


def _is_ref_like(a) -> bool:
    if isinstance(a, (TaskRef, Access, Data)):  # (a bare Data handle is read, as a bare tile)
        return True
    return hasattr(a, "matrix") and hasattr(a, "key")


def _is_container(a) -> bool:
    c = a.__class__
    return c in _SEQUENCES or c is dict or (isinstance(a, tuple) and hasattr(c, "_fields"))


def _wants(a, top: bool = False) -> bool:
    """Whether ``a`` is, or holds, something to resolve or protect (a future, a
    tile, an array); at the top level, futures and tiles are handled already."""
    c = a.__class__
    if c in _PLAIN:
        return False
    if isinstance(a, np.ndarray):
        return True
    if _is_container(a):
        if c is dict and any(k.__class__ not in _PLAIN and _is_ref_like(k) for k in a):
            return True  # (refused when flattened)
        items = a.values() if c is dict else a
        for x in items:
            if x.__class__ not in _PLAIN and _wants(x):
                return True
        return False
    return not top and _is_ref_like(a)


def _set_order(x) -> tuple:
    """A key that orders a set's items alike in every process (no salted hashes)."""
    if isinstance(x, TaskRef):
        return (0, "", x.id, "")
    return (1, type(x).__qualname__, 0, repr(x))


def _flatten(a, leaves: list, encode: Callable):
    """The template of ``a``; its leaves (encoded: futures and tiles as Refs) are
    appended to ``leaves``."""
    if isinstance(a, np.ndarray):
        leaves.append(a)
        return _ReadOnly(len(leaves) - 1)
    if _is_container(a) and _wants(a):
        if a.__class__ is dict:
            for k in a:
                if _is_ref_like(k):
                    raise GraphError(
                        f"{k!r} is a key of a dict argument: only values may be futures"
                    )
            keys = tuple(a)
            return _Node(dict, tuple(_flatten(a[k], leaves, encode) for k in keys), keys)
        items = sorted(a, key=_set_order) if isinstance(a, (set, frozenset)) else a
        return _Node(a.__class__, tuple(_flatten(x, leaves, encode) for x in items))
    leaves.append(encode(a))
    return len(leaves) - 1


def readonly_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (no copy): what a task, or a spawned call, is given."""
    view = a.view()
    view.flags.writeable = False
    return view


def _build(node, flat: tuple):
    """The value of a template, from its leaves' values."""
    c = node.__class__
    if c is int:
        return flat[node]
    if c is _ReadOnly:
        return readonly_view(flat[node.index])
    items = [_build(x, flat) for x in node.items]
    kind = node.kind
    if kind is list:
        return items
    if kind is dict:
        return dict(zip(node.keys, items))
    if kind in (tuple, set, frozenset):
        return kind(items)
    return kind(*items)  # a named tuple


def _render(node, labels: list[str]) -> str:
    """The template as text, with each leaf's label."""
    c = node.__class__
    if c is int:
        return labels[node]
    if c is _ReadOnly:
        return labels[node.index]
    parts = [_render(x, labels) for x in node.items]
    kind = node.kind
    if kind is dict:
        parts = [f"{describe(k)}: {p}" for k, p in zip(node.keys, parts)]
        return "{" + ", ".join(parts) + "}"
    if kind is list:
        return "[" + ", ".join(parts) + "]"
    if kind is tuple:
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if kind in (set, frozenset):
        text = "{" + ", ".join(parts) + "}"
        return text if kind is set else f"frozenset({text})"
    return f"{kind.__name__}({', '.join(parts)})"


def _shape(node) -> str:
    """The template as a stable text without leaves (what a fingerprint hashes)."""
    c = node.__class__
    if c is int:
        return "."
    if c is _ReadOnly:
        return "a"
    inner = ",".join(_shape(x) for x in node.items)
    keys = "" if node.keys is None else "|" + ",".join(repr(k) for k in node.keys)
    return f"{node.kind.__module__}.{node.kind.__qualname__}({inner}{keys})"


def _has_arrays(node) -> bool:
    if node.__class__ is _ReadOnly:
        return True
    return node.__class__ is _Node and any(_has_arrays(x) for x in node.items)


def _readonly_error(e: BaseException) -> bool:
    text = str(e)
    return "read-only" in text or "readonly" in text


class PackedCall:
    """The function of a task whose arguments were flattened: called with the leaves'
    values, it rebuilds the arguments and calls the ``@tg.task`` function.

    ``task_fn``: the TaskFunction; ``args``: a template per positional argument;
    ``kwargs``: a template per keyword argument (see the module docstring).
    """

    __slots__ = ("task_fn", "args", "kwargs", "arrays")

    def __init__(self, task_fn, args: tuple, kwargs: dict):
        self.task_fn = task_fn
        self.args = args
        self.kwargs = kwargs
        self.arrays = any(_has_arrays(n) for n in (*args, *kwargs.values()))

    @property
    def name(self) -> str:
        return self.task_fn.name

    @property
    def cost_value(self) -> float:
        return self.task_fn.cost_value

    @property
    def timeout(self) -> float | None:
        return getattr(self.task_fn, "timeout", None)

    @property
    def __wrapped__(self):
        return self.task_fn.fn

    def fn(self, *flat):
        """Run the task on its leaves' values (what the executor calls)."""
        args = [_build(n, flat) for n in self.args]
        kwargs = {k: _build(n, flat) for k, n in self.kwargs.items()}
        try:
            return self.task_fn.fn(*args, **kwargs)
        except Exception as e:
            if self.arrays and _readonly_error(e):
                raise GraphError(self._write_message(flat)) from e
            raise

    def _write_message(self, flat: tuple) -> str:
        arrays = [describe(a) for a in flat if isinstance(a, np.ndarray)]
        return (
            f"task {self.name} wrote into a NumPy array it was given ({', '.join(arrays)}): "
            "a plain array passed to a task is a read-only constant of the graph; "
            "mark it to write it (tg.rw(x) or tg.w(x) where the task is called), or return "
            "a new array"
        )

    def label(self, labels: list[str]) -> str:
        """The call's arguments as text, from each leaf's label."""
        parts = [_render(n, labels) for n in self.args]
        parts += [f"{k}={_render(n, labels)}" for k, n in self.kwargs.items()]
        return ", ".join(p if len(p) <= 60 else p[:57] + "..." for p in parts)

    def shape(self) -> str:
        """The arguments' structure as stable text (for :mod:`taskgraph.dsl.fingerprint`)."""
        kw = ",".join(f"{k}={_shape(n)}" for k, n in self.kwargs.items())
        return ",".join(_shape(n) for n in self.args) + ";" + kw

    def __repr__(self) -> str:
        return f"<tg.task {self.name} (packed arguments)>"


def pack(task_fn, args: tuple, kwargs: dict, encode: Callable) -> tuple[PackedCall, tuple]:
    """(the PackedCall, the encoded leaves) of a call ``task_fn(*args, **kwargs)``."""
    leaves: list = []
    arg_nodes = tuple(_flatten(a, leaves, encode) for a in args)
    kw_nodes = {k: _flatten(v, leaves, encode) for k, v in kwargs.items()}
    return PackedCall(task_fn, arg_nodes, kw_nodes), tuple(leaves)
