"""cloudpickle that keeps where a function's code came from.

A function of the notebook or of a script travels by value (cloudpickle), and
cloudpickle names its code ``<dynamic-code>``: a traceback from an engine, a thief
rank or a process task then reads ``File "<dynamic-code>", line 4, in f``, with no
source line. :func:`dumps` pickles as cloudpickle does, but each code object carries
its file name, and where that file exists only in this process's ``linecache`` (a
notebook cell) its lines too; the receiving process restores both, so the traceback
names the script or cell and shows the line. The receiver needs only taskgraph
(plain :func:`pickle.loads` or :func:`cloudpickle.loads` reads it).
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

MAX_SOURCE = 1 << 16  # bytes of a cell's source sent along, at most (a longer one is not)

_cloud_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _reduce_code(code: types.CodeType) -> Any:
    rv = _cloud_code(code)
    if not (isinstance(rv, tuple) and rv[0] is types.CodeType):  # (another cloudpickle)
        return rv
    return _code, (rv[1], code.co_filename, _cell_lines(code.co_filename))


def _cell_lines(filename: str) -> list[str] | None:
    """The lines of ``filename`` where only this process has them (a notebook cell, in
    ``linecache`` with no file behind it); None for a file on disk, or none known."""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or os.path.exists(filename):
        return None
    lines = entry[2]
    if sum(map(len, lines)) > MAX_SOURCE:
        return None
    return list(lines)


def _code(args: tuple, filename: str, lines: list[str] | None) -> types.CodeType:
    """A code object rebuilt from cloudpickle's ``args``, named ``filename`` again (its
    ``lines`` known to ``linecache`` here, unless this process has that file)."""
    code = types.CodeType(*args)
    if filename:
        code = code.replace(co_filename=filename)
        if lines and filename not in linecache.cache:
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return code


class Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with code objects that keep their file (see module)."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any, protocol: int | None = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``obj`` pickled as :func:`cloudpickle.dumps` does, code keeping its file."""
    with io.BytesIO() as f:
        Pickler(f, protocol=protocol).dump(obj)
        return f.getvalue()
