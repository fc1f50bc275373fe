"""``taskgraph.dsl.memory``: tiles and receive buffers carved from huge-page blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl import memory
from taskgraph.dsl.tiled import spd_dense
from taskgraph.run.executor import BufferPool

MiB = 1 << 20


def anon_huge_mib() -> float:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) / 1024
    return 0.0


def thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[")[1].split("]")[0]


def spans(arrays) -> list[tuple[int, int]]:
    return sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)


def test_a_matrix_share_of_a_mib_or_more_is_one_aligned_block_of_separate_tiles():
    shapes = [(300, 300), (300, 200), (200, 300), (200, 200)]  # ragged edges, 1.9 MiB
    tiles = memory.empty_many(shapes, np.float64)
    assert [t.shape for t in tiles] == shapes
    assert all(t.flags.f_contiguous and t.flags.writeable for t in tiles)
    assert all(t.ctypes.data % memory.ALIGN == 0 for t in tiles)
    assert tiles[0].ctypes.data % memory.HUGE_PAGE == 0  # the block's start
    s = spans(tiles)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(s, s[1:])), "tiles overlap"
    for k, t in enumerate(tiles):
        t[...] = k
    assert [float(t.mean()) for t in tiles] == [0.0, 1.0, 2.0, 3.0]  # none wrote another


def test_a_small_share_stays_plain_numpy():
    tiles = memory.empty_many([(10, 10)] * 3, np.float32)
    assert all(t.base is None and t.dtype == np.float32 for t in tiles)


def test_tiled_matrices_keep_their_tiles_in_one_block():
    A = tg.TiledMatrix.random_spd(1000, 256)  # 10 lower tiles, ragged at the edge: 4.6 MiB
    assert A.tiles[0, 0].ctypes.data % memory.HUGE_PAGE == 0
    s = spans(A.tiles.values())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(s, s[1:])), "tiles overlap"
    assert np.array_equal(np.tril(A.gather()), np.tril(spd_dense(1000, 256, np.float64, 0)))


def test_receive_buffers_come_from_slabs_one_at_a_time():
    slabs = memory.Slabs()
    dt = np.dtype(np.float64)
    a, b = slabs.new((128, 128), dt), slabs.new((128, 128), dt)  # 128 KiB each
    assert a.ctypes.data % memory.HUGE_PAGE == 0
    assert b.ctypes.data == a.ctypes.data + a.nbytes  # the next one in the same slab
    many = [slabs.new((128, 128), dt) for _ in range(16)]  # 16 fit a slab: a new one
    assert len({m.ctypes.data for m in many}) == 16
    assert not any(
        lo < hi2 and lo2 < hi for (lo, hi), (lo2, hi2) in zip(spans(many), spans(many)[1:])
    )
    # other shapes and dtypes share the open slab: no 2 MiB page for each
    c = slabs.new((200, 100), np.dtype(np.float32))  # 78 KiB
    d = slabs.new((128, 128), dt)
    assert d.ctypes.data == c.ctypes.data + memory._round(c.nbytes, memory.ALIGN)
    big = slabs.new((1024, 512), dt)  # 4 MiB: a block of its own
    assert big.ctypes.data % memory.HUGE_PAGE == 0 and big.flags.f_contiguous
    assert slabs.new((8, 8), dt).base is None  # tiny: plain NumPy


def test_the_pool_hands_out_slab_buffers_and_takes_them_back():
    pool = BufferPool()
    a = pool.get((256, 256), "<f8")
    assert a.ctypes.data % memory.HUGE_PAGE == 0 and a.flags.f_contiguous
    pool.put(a)
    assert pool.get((256, 256), "<f8") is a
    assert pool.allocated == 1 and pool.handed_out == 2


@pytest.mark.skipif(thp_mode() == "never", reason="transparent huge pages are off here")
def test_touched_blocks_are_backed_by_huge_pages():
    before = anon_huge_mib()
    block = memory.huge_block(8 * MiB)
    block[:] = 1  # huge pages are given on first touch
    # all 8 MiB where THP is "madvise" or "always" and the kernel has 2 MiB pages free;
    # a fragmented machine may give fewer, but not one would mean the advice was lost
    # (a shared mapping, as Python's mmap makes by default, got none)
    assert anon_huge_mib() - before >= 2
