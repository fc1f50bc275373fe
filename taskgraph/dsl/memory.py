"""Tile memory on huge pages: tiles and receive buffers in 2 MiB-aligned blocks.

Between ranks on one node, a large message moves in one copy (cross-memory attach:
the receiver reads the sender's pages), and that copy walks both processes' page
tables: a raw mpi4py ping-pong of 1 MiB took 22.8 us a message on 2 MiB pages and 72
on 4 KiB ones, of 4 MiB 80 against 281 (``python -m benchmarks pages``). NumPy asks
for huge pages only for arrays of 4 MiB and more, and only the 2 MiB-aligned stretches
of one get them, so which tiles got them was luck (NumPy's 4 MiB arrays: 176 us in one
job, 81 in another). So:

* :func:`empty_many`: the tiles a rank owns in a matrix are carved from one block,
  2 MiB-aligned and advised for huge pages (``madvise(MADV_HUGEPAGE)``), when they add
  up to ``BLOCK_MIN`` or more; each tile is its own Fortran-ordered array, 64-byte
  aligned, and the block lives as long as any of them.
* :class:`Slabs`: receive buffers from ``SLAB_MIN`` up are carved from 2 MiB-aligned
  slabs, shared by all shapes (a buffer of 2 MiB or more gets a block of its own,
  rounded up to whole huge pages).

Smaller arrays are plain NumPy arrays: a huge page for a few KiB would only waste
memory. Where the kernel gives no huge pages (THP off, none free), the blocks are
ordinary memory and nothing else changes.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import numpy as np

HUGE_PAGE = 2 << 20
ALIGN = 64  # bytes: each tile starts on a cache line
BLOCK_MIN = 1 << 20  # a matrix's local tiles from one block from this many bytes
SLAB_MIN = 64 << 10  # receive buffers from slabs from this size


def _round(n: int, to: int) -> int:
    return -(-n // to) * to


def huge_block(nbytes: int) -> np.ndarray:
    """``nbytes`` (rounded up to whole huge pages) of zeroed anonymous memory, 2 MiB-
    aligned, advised for huge pages; a uint8 array."""
    size = _round(max(1, nbytes), HUGE_PAGE)
    # private: a shared anonymous mapping is shmem, which gets no transparent huge pages
    # (shmem_enabled is "never" by default). Room to align; the slack is never touched
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0)
    mm = mmap.mmap(-1, size + HUGE_PAGE, flags=flags)
    whole = np.frombuffer(mm, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is not None:
        try:
            mm.madvise(advise, start, size)
        except OSError:  # THP not built in: ordinary pages
            pass
    return whole[start : start + size]


def _nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return math.prod(int(s) for s in shape) * dtype.itemsize


def carve(block: np.ndarray, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A Fortran-ordered array of ``shape`` in ``block`` from byte ``offset``."""
    return np.ndarray(shape, dtype, buffer=block, offset=offset, order="F")


def empty_many(shapes: Sequence[tuple], dtype) -> list[np.ndarray]:
    """Uninitialised Fortran-ordered arrays, one per shape: carved from one huge-page
    block when they add up to ``BLOCK_MIN`` or more, else plain NumPy arrays."""
    dtype = np.dtype(dtype)
    sizes = [_round(_nbytes(s, dtype), ALIGN) for s in shapes]
    if sum(sizes) < BLOCK_MIN:
        return [np.empty(s, dtype, order="F") for s in shapes]
    block = huge_block(sum(sizes))
    out, offset = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(carve(block, offset, tuple(shape), dtype))
        offset += size
    return out


class Slabs:
    """Buffers carved one at a time from huge-page slabs, all shapes and dtypes from
    the same open slab (one 80 KiB buffer must not commit a 2 MiB page of its own);
    nothing is touched until a buffer is used."""

    def __init__(self) -> None:
        self._slab: np.ndarray | None = None
        self._offset = 0  # of the next buffer in it

    def new(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        nbytes = _nbytes(shape, dtype)
        if nbytes < SLAB_MIN:
            return np.empty(shape, dtype, order="F")
        if nbytes >= HUGE_PAGE:
            return carve(huge_block(nbytes), 0, shape, dtype)
        size = _round(nbytes, ALIGN)
        if self._slab is None or self._offset + size > self._slab.nbytes:
            self._slab, self._offset = huge_block(HUGE_PAGE), 0
        out = carve(self._slab, self._offset, shape, dtype)
        self._offset += size
        return out
