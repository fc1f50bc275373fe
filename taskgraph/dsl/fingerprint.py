"""Graph fingerprints: do the ranks of a job run the same graph?

Every rank of a batch job builds its own graph and plans it; the plan is only right
if the graphs are the same. A set walked in another order, or a random number drawn
without a common seed, makes them differ: unplanned messages, or each rank running
its share of its own graph (a silently wrong result). So before a run every rank
compares a fingerprint of its graph with the others'.

A fingerprint covers every task: its function (module and qualified name, never an
``id()``), its arguments (constants by value; NumPy arrays by shape, dtype and a CRC
of their bytes; a matrix's tiles by the matrix's geometry, dtype and distribution
and the tile's index), the versions it reads and writes, its edges and its cost.
Tasks are hashed in blocks of :data:`BLOCK`::

    task t      -> code(t)              a 64-bit int (see below)
    block b     -> blake2b(codes of tasks b*BLOCK ... (b+1)*BLOCK - 1), 8 bytes
    graph       -> blake2b(task count, block digests), 16 bytes

Naming the first task that differs needs little data (:func:`compare_ranks`): the
16-byte digests first; on a mismatch, the block digests (8 bytes per BLOCK tasks),
then the codes of the first differing block, then one text per rank describing the
first differing task.

Codes must be equal in every process for equal graphs: ``hash()`` of a str or bytes
is salted per process (PYTHONHASHSEED), so text is reduced to an int with blake2b
first, and only ints, floats and tuples of them go through ``hash()`` (their hashes
are not salted).
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .graph import Graph
from .tasks import Ref, paused_gc

BLOCK = 1024  # tasks per block digest
_ARRAY_BYTES = 1 << 24  # arrays up to 16 MiB are hashed whole, larger ones sampled
_DESCRIBE_CHARS = 300


@dataclass(frozen=True)
class Fingerprint:
    """The fingerprint of a graph: ``digest`` over everything, ``blocks`` per
    :data:`BLOCK` tasks, ``ntasks`` the task count."""

    ntasks: int
    digest: bytes
    blocks: tuple[bytes, ...]


def fingerprint(graph: Graph) -> Fingerprint:
    """The fingerprint of ``graph`` (a pure function of what the graph does)."""
    n = len(graph.tasks)
    with paused_gc():  # many short-lived tuples: see Graph.__enter__
        coder = _Coder(graph)
        blocks = tuple(_block_digest(coder.codes(s, min(s + BLOCK, n))) for s in range(0, n, BLOCK))
    h = hashlib.blake2b(digest_size=16)
    h.update(n.to_bytes(8, "little"))
    h.update(b"".join(blocks))
    return Fingerprint(n, h.digest(), blocks)


def task_codes(graph: Graph, start: int, stop: int) -> list[int]:
    """The codes of tasks ``start`` to ``stop - 1`` (what a block digest hashes)."""
    return _Coder(graph).codes(start, min(stop, len(graph.tasks)))


def first_difference(seqs: Sequence[Sequence]) -> int | None:
    """The first index at which the sequences (one per rank) are not all equal, a
    missing item counting as different; None if they are equal."""
    longest = max((len(s) for s in seqs), default=0)
    for i in range(longest):
        first = seqs[0][i] if i < len(seqs[0]) else None
        for s in seqs[1:]:
            if i >= len(s) or s[i] != first or first is None:
                return i
    return None


def describe_task(graph: Graph, tid: int) -> str:
    """A text naming task ``tid`` and what it is made of, for a mismatch message."""
    if not 0 <= tid < len(graph.tasks):
        return f"no task {tid} (the graph has {len(graph.tasks)} tasks)"
    t = graph.tasks[tid]
    text = (
        f"{graph.label(tid)} [{_qualname(t.fn)}], reads {list(t.reads)}, "
        f"after tasks {list(t.preds)}"
    )
    return text if len(text) <= _DESCRIBE_CHARS else text[: _DESCRIBE_CHARS - 3] + "..."


def compare_ranks(
    graph: Graph, allgather: Callable[[object], list], fp: Fingerprint | None = None
) -> str | None:
    """None if every rank's graph has the same fingerprint, else a message naming the
    first task that differs and what it is on each rank.

    ``allgather(obj) -> [obj of rank 0, obj of rank 1, ...]`` is a collective (such as
    ``comm.allgather``); every rank calls this function, and every rank gets the same
    answer. Equal graphs cost one allgather of 24 bytes; a mismatch, three more small
    ones."""
    fp = fp if fp is not None else fingerprint(graph)
    heads = allgather((fp.ntasks, fp.digest))
    if all(h == heads[0] for h in heads):
        return None
    block = first_difference(allgather(fp.blocks))
    if block is None:  # (equal blocks, different counts: cannot happen, but say so)
        block = min(n for n, _ in heads) // BLOCK
    start = block * BLOCK
    offset = first_difference(allgather(task_codes(graph, start, start + BLOCK)))
    tid = start + (offset if offset is not None else 0)
    texts = allgather(describe_task(graph, tid))
    return _mismatch_message(tid, texts, [n for n, _ in heads])


def _mismatch_message(tid: int, texts: list[str], counts: list[int]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        groups.setdefault(text, []).append(rank)
    lines = [f"  rank{'s' if len(r) > 1 else ''} {_ranks(r)}: {text}" for text, r in groups.items()]
    note = ""
    if len(groups) == 1:
        note = " (they differ in a value the description does not show, such as an array's data)"
    sizes = ""
    if len(set(counts)) > 1:
        sizes = f"; task counts by rank: {counts}"
    return (
        f"the ranks built different graphs: task {tid} is the first that differs{note}{sizes}\n"
        + "\n".join(lines)
        + "\nBuild the graph alike on every rank: seed random numbers alike, and walk "
        "sets and dicts in a sorted order"
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _block_digest(codes: list[int]) -> bytes:
    return hashlib.blake2b(array("q", codes).tobytes(), digest_size=8).digest()


def _text_code(text: str) -> int:
    """A signed 64-bit int from a text, equal in every process."""
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True
    )


def _qualname(fn) -> str:
    """``module.qualname`` of the user's function behind a task's function."""
    inner = getattr(fn, "task_fn", None)  # a PackedCall
    if inner is not None:
        return _qualname(inner)
    base = getattr(fn, "fn", fn)  # a TaskFunction's or a Kernel's function
    module = getattr(base, "__module__", None) or type(base).__module__
    name = getattr(base, "__qualname__", None) or type(base).__qualname__
    return f"{module}.{name}"


class _Coder:
    """Codes of one graph's tasks, with what they share computed once."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.fn_codes: dict[object, int] = {}  # by the function object (its identity)
        self.const_codes: dict[tuple, int] = {}
        self.array_codes: dict[int, int] = {}  # by id(array), likewise
        self.data_codes = self._data_codes()

    def _data_codes(self) -> list[int]:
        matrices: dict[int, int] = {}  # matrix uid -> code (uids differ between runs)
        codes = []
        for d in self.graph.data:
            tile = d.tile
            if d.item is not None:  # plain data: its uid, pin and geometry
                it = d.item
                codes.append(_text_code(f"data|{it.uid}|{it.rank}|{it.shape}|{it.dtype}"))
                continue
            if tile is None:
                codes.append(hash((-1, d.producer, -1 if d.size is None else d.size)))
                continue
            m = tile.matrix
            mcode = matrices.get(m.uid)
            if mcode is None:
                mcode = matrices[m.uid] = self._matrix_code(m, len(matrices))
            codes.append(hash((mcode, tile.i, tile.j)))
        return codes

    @staticmethod
    def _matrix_code(m, ordinal: int) -> int:
        geometry = (m.shape, m.tile, m.dtype.str, m.grid, m.distribution_key, m.distribution_seed)
        return _text_code(f"{ordinal}|{geometry}|{m.lower}")

    def codes(self, start: int, stop: int) -> list[int]:
        """The codes of tasks ``start`` to ``stop - 1``. The hot loop: about half a
        microsecond a task, so one comprehension for the arguments (a Ref by its
        datum's code and its mode, an int as itself, another constant by value)."""
        fn_codes, dc, const = self.fn_codes, self.data_codes, self.const_code
        out = []
        for t in self.graph.tasks[start:stop]:
            fcode = fn_codes.get(t.fn)
            if fcode is None:
                fcode = fn_codes[t.fn] = self._fn_code(t.fn)
            args = tuple(
                [
                    dc[a.data] * 4 + a.mode
                    if a.__class__ is Ref
                    else (a if a.__class__ is int else const(a))
                    for a in t.args
                ]
            )
            kcode = self._kwargs_code(t.kwargs) if t.kwargs else 0
            out.append(hash((fcode, args, kcode, t.reads, t.writes, tuple(t.preds), t.cost)))
        return out

    def _kwargs_code(self, kwargs: dict) -> int:
        return hash(tuple((_text_code(k), self.arg_code(v)) for k, v in kwargs.items()))

    def arg_code(self, a) -> int:
        if a.__class__ is Ref:
            return self.data_codes[a.data] * 4 + a.mode
        return self.const_code(a)

    def _fn_code(self, fn) -> int:
        parts = [_qualname(fn), str(getattr(fn, "name", ""))]
        modes = getattr(fn, "modes", None)
        if modes is not None:
            parts.append(",".join(str(int(m)) if m is not None else "s" for m in modes))
        shape = getattr(fn, "shape", None)
        if callable(shape):  # a PackedCall: the arguments' structure
            parts.append(shape())
        return _text_code("|".join(parts))

    def const_code(self, a) -> int:
        """The code of a constant argument, by value."""
        c = a.__class__
        if c is int:
            return a
        if c is float:
            return hash((2, a)) if a == a else 2  # (a NaN's hash is its id())
        if c is str:
            code = self.const_codes.get((str, a))
            if code is None:
                code = self.const_codes[str, a] = _text_code("s" + a)
            return code
        if isinstance(a, np.ndarray):
            return self._array_code(a)
        if c is tuple or c is list:
            return hash((3 if c is tuple else 4, tuple(self.const_code(x) for x in a)))
        if c is dict:
            return hash((5, tuple((self.const_code(k), self.const_code(v)) for k, v in a.items())))
        if c is set or c is frozenset:
            return hash((6, tuple(sorted(self.const_code(x) for x in a))))
        return _text_code(_stable_text(a))

    def _array_code(self, a: np.ndarray) -> int:
        code = self.array_codes.get(id(a))
        if code is None:
            code = self.array_codes[id(a)] = _text_code(
                f"array|{a.shape}|{a.dtype.str}|{_array_crc(a)}"
            )
        return code


def _array_crc(a: np.ndarray) -> int:
    """A CRC of an array's bytes; of an evenly spread sample of 16 MiB when larger."""
    if a.dtype.hasobject:
        return zlib.crc32(repr(a.tolist()).encode())
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.nbytes > _ARRAY_BYTES:
        step = -(-flat.nbytes // _ARRAY_BYTES)
        flat = np.ascontiguousarray(flat[::step])
    return zlib.crc32(flat.view(np.uint8).data)


def _stable_text(a) -> str:
    """A text for any other constant that is equal in every process: its repr, unless
    that shows a memory address (then only its type)."""
    kind = f"{type(a).__module__}.{type(a).__qualname__}"
    text = repr(a)
    return kind if " at 0x" in text else f"{kind}|{text}"
