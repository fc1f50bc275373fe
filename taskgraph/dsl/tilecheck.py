"""Before a run: every tile a graph uses is, on its owner, the array its matrix promises.

Receives are posted from the plan (each tile's shape and dtype, as its matrix says),
and tiles travel as raw bytes; a tile replaced on its owner by an array of another
shape, dtype or layout (``A.tiles[i, j] = other``) would otherwise be sent as it is and
read as the plan says: a silent wrong result, or a truncated message. Each rank checks
the tiles it owns; the first problem on any rank fails the run on every rank, as a
:class:`~taskgraph.core.errors.TaskError` naming the first task that uses the tile and
the rank that holds it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..core.errors import TaskError
from .graph import Graph, iter_refs


class _Net(Protocol):
    rank: int
    size: int
    host: str

    def allgather(self, obj) -> list: ...


def tile_problem(graph: Graph, rank: int, size: int, host: str) -> TaskError | None:
    """The first tile of ``graph`` held on this rank that is not the array its matrix
    promises (shape, dtype, Fortran order), as a TaskError naming the first task that
    uses it and ``rank``/``size`` on ``host``; None when every tile is right."""
    for d, data in enumerate(graph.data):
        tile = data.tile
        if tile is None:
            continue
        arr = tile.matrix.tiles.get((tile.i, tile.j))
        if arr is None:  # not held here
            continue
        want = (tuple(tile.matrix.tile_shape(tile.i, tile.j)), tile.matrix.dtype)
        if isinstance(arr, np.ndarray) and _is(arr, want):
            continue
        return TaskError(
            _first_user(graph, d),
            rank,
            size,
            host,
            f"ValueError: tile {tile!r} on rank {rank} is {_describe(arr)}, but "
            f"{tile.matrix.name} has {want[0]} {np.dtype(want[1])} tiles in Fortran order: "
            "was it replaced? Write into a tile in place (A.tiles[i, j][...] = array)",
        )
    return None


def check_tiles(graph: Graph, net: _Net) -> None:
    """Raise :func:`tile_problem`'s error on every rank of ``net`` if any rank has one
    (the lowest such rank's). Collective over ``net``: one allgather."""
    mine = tile_problem(graph, net.rank, net.size, net.host)
    found = net.allgather(mine) if net.size > 1 else [mine]
    first = next((p for p in found if p is not None), None)
    if first is not None:
        raise first


def _describe(arr) -> str:
    if not isinstance(arr, np.ndarray):
        return f"a {type(arr).__name__}"
    order = "in Fortran order" if arr.flags.f_contiguous else "not in Fortran order"
    return f"a {arr.shape} {arr.dtype} array {order}"


def _is(arr: np.ndarray, want: tuple) -> bool:
    return (arr.shape, arr.dtype) == want and arr.flags.f_contiguous


def _first_user(graph: Graph, d: int) -> str:
    for t in graph.tasks:
        if any(ref.data == d for ref in iter_refs(t)):
            return graph.label(t.id)
    return f"(none: data {d})"
