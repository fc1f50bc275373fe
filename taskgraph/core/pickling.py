"""cloudpickle that keeps where a function's code came from.

A function of the notebook or of a script travels by value (cloudpickle), and
cloudpickle names its code ``<dynamic-code>``: a traceback from an engine, a thief
rank or a process task then reads ``File "<dynamic-code>", line 4, in f``, with no
source line. :func:`dumps` pickles as cloudpickle does, but each code object carries
its file name, and where that file exists only in this process's ``linecache`` (a
notebook cell) the code's own lines too (not the rest of the cell); the receiving
process restores both, so the traceback names the script or cell and shows the line.
The receiver needs only taskgraph (plain :func:`pickle.loads` or
:func:`cloudpickle.loads` reads it).
"""

from __future__ import annotations

import io
import linecache
import os
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle

MAX_SOURCE = 1 << 16  # characters of a code's lines sent along, at most (longer: none)

_cloud_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


_LINES: dict = {}  # code -> what _code_lines said (a cell's lines do not change)
LINES_KEPT = 512  # answers kept, at most (then forgotten: redefined cells come and go)


def _code_lines(code: types.CodeType) -> tuple[int, tuple[str, ...]] | None:
    """(first line number, the lines) of ``code`` where its file exists only in this
    process's ``linecache`` (a notebook cell); None for a file on disk, or none known."""
    try:
        return _LINES[code]
    except KeyError:
        pass
    got = None
    entry = linecache.cache.get(code.co_filename)
    if entry is not None and len(entry) == 4 and not os.path.exists(code.co_filename):
        numbers = [n for _, _, n in code.co_lines() if n is not None]
        first, last = code.co_firstlineno, max(numbers, default=code.co_firstlineno)
        own = tuple(entry[2][first - 1 : last])
        if own and sum(map(len, own)) <= MAX_SOURCE:
            got = (first, own)
    if len(_LINES) >= LINES_KEPT:
        _LINES.clear()
    _LINES[code] = got
    return got


def _code(args: tuple, filename: str, lines: tuple[int, tuple[str, ...]] | None):
    """A code object rebuilt from cloudpickle's ``args``, named ``filename`` again, its
    ``lines`` (first line number, lines) known to ``linecache`` here unless this process
    has that file (or its lines) already."""
    code = types.CodeType(*args)
    if not filename:
        return code
    code = code.replace(co_filename=filename)
    if lines and not os.path.exists(filename):
        _remember(filename, *lines)
    return code


_cells: dict[str, list[str]] = {}  # lines of cells that other processes sent here


def _remember(filename: str, first: int, own: tuple[str, ...]) -> None:
    """Put ``own`` at line ``first`` of ``filename`` in ``linecache`` (lines not sent are
    empty), unless a cell of that name came from elsewhere than us."""
    entry: Any = linecache.cache.get(filename)
    lines = _cells.get(filename)
    if entry is not None and (lines is None or len(entry) != 4 or entry[2] is not lines):
        return  # (this process's own cell, or a file it read)
    if lines is None:
        lines = _cells[filename] = []
    if len(lines) < first - 1 + len(own):
        lines.extend([""] * (first - 1 + len(own) - len(lines)))
    lines[first - 1 : first - 1 + len(own)] = own
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def _reduce_code(code: types.CodeType) -> Any:
    rv = _cloud_code(code)
    if not (isinstance(rv, tuple) and rv[0] is types.CodeType):  # (another cloudpickle)
        return rv
    return _code, (rv[1], code.co_filename, _code_lines(code))


class Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with code objects that keep their file (see module)."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any, protocol: int | None = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``obj`` pickled as :func:`cloudpickle.dumps` does, code keeping its file."""
    with io.BytesIO() as f:
        Pickler(f, protocol=protocol).dump(obj)
        return f.getvalue()


# what plain pickle raises for what it cannot find by name (a lambda, a closure): then
# :func:`dumps` takes it by value (see :func:`plain_first`)
NOT_BY_NAME = (pickle.PicklingError, AttributeError, TypeError)


def plain_first(obj: Any, protocol: int = 5) -> bytes:
    """``obj`` pickled by plain pickle where all it holds is found by name (a few µs),
    else by value (:func:`dumps`: a function of the notebook or the script, a lambda, a
    closure): values between ranks and stolen calls (taskgraph.run.comm, .steal)."""
    try:
        return pickle.dumps(obj, protocol=protocol)
    except NOT_BY_NAME:  # (looked up only then: the usual value costs as plain pickle)
        return dumps(obj, protocol=protocol)


class ByValue:
    """``obj`` wrapped to go by value inside something a plain pickler pickles (a
    message of ipyparallel's): it unpickles as ``obj`` itself, not as a ByValue."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __reduce__(self):
        return pickle.loads, (dumps(self.obj),)
