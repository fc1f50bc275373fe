"""Which runs may be in flight at once: a pure decision on two graphs' data.

Runs of one cluster run at once, each on its own communicators, unless they share data
that one of them writes: a later run that reads or writes a matrix or a plain datum an
earlier run still going writes (or writes what that run reads) waits for it, queued,
so that it sees the earlier run's final values, as it would one run after the other::

    run(g1: writes A)    ─► running ────────────► done
    run(g2: reads B)     ─► running ──► done                 (nothing shared: at once)
    run(g3: reads A)     ─► queued ··············► running ──► done

Whole matrices count, not tiles; a task's value is its run's own and never counts.
"""

from __future__ import annotations

from typing import NamedTuple

from ..dsl.graph import Graph


class Footprint(NamedTuple):
    """The shared data a graph touches, writes and reads: ``("matrix", uid)`` and plain
    data's keys."""

    touched: frozenset
    written: frozenset
    read: frozenset = frozenset()


def _key(datum):
    if datum.tile is not None:
        return ("matrix", datum.tile.matrix.uid)
    if datum.item is not None:
        return datum.item.key
    return None  # a task's value: this run's alone


def footprint(graph: Graph) -> Footprint:
    """What ``graph`` touches and writes of the data that outlive a run."""
    touched = {_key(d) for d in graph.data}
    written = {_key(graph.data[d]) for t in graph.tasks for d, _ in t.writes}
    read = {_key(graph.data[d]) for t in graph.tasks for d, _ in t.reads}
    return Footprint(*(frozenset(s - {None}) for s in (touched, written, read)))


def must_wait(earlier: Footprint, later: Footprint) -> bool:
    """Whether a run of ``later`` must wait for a run of ``earlier`` still going: one
    writes what the other touches."""
    return bool(earlier.written & later.touched or later.written & earlier.touched)


def left_stale(earlier: Footprint, later: Footprint) -> frozenset:
    """What a run of ``later`` reads that a run of ``earlier``, which it waited for and
    which failed, writes: its values are the failed run's half-way ones, or older (a
    run that only overwrites them may be the very fix)."""
    return earlier.written & later.read


def data_names(graph: Graph, keys: frozenset) -> list[str]:
    """The names of ``graph``'s data under ``keys`` (see :class:`Footprint`)."""
    names = set()
    for d in graph.data:
        if _key(d) in keys:
            item, tile = d.item, d.tile
            name = item.name if item is not None else getattr(tile and tile.matrix, "name", None)
            names.add(str(name or "a matrix"))
    return sorted(names)


__all__ = ["Footprint", "data_names", "footprint", "left_stale", "must_wait"]
