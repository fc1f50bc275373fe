"""Tiled data beyond square float tiles (taskgraph.dsl.tiled, taskgraph.dsl.placement):
rectangular and ragged tiles, 1-D tiled vectors, every dtype but object, and owners
given as "block", a callable or a map; bad shapes and orders refused by name, before
an automatic tile is chosen. One test moves such tiles between 2 real ranks.
"""

from __future__ import annotations

import pickle
import textwrap

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.fingerprint import fingerprint
from taskgraph.dsl.placement import block_owner
from taskgraph.dsl.tiled import TiledMatrix, TiledVector
from taskgraph.plan.preview import owner_for
from taskgraph.plan.tilesize import choose

pytestmark = pytest.mark.timeout(60)

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "complex128", "longdouble"]  # fmt: skip


def sample(shape, dtype) -> np.ndarray:
    """Distinct entries of ``dtype`` (alternating for bools)."""
    values = np.arange(np.prod(shape)).reshape(shape) % (2 if dtype == "bool" else 97)
    return np.asfortranarray(values.astype(dtype))


class FakeRanks:
    """A cluster of ``size`` ranks seen from ``rank`` (only what a matrix asks)."""

    remote = False

    def __init__(self, size: int, rank: int = 0):
        self.size, self.rank = size, rank


# -- shapes ----------------------------------------------------------------------------


def test_rectangular_tiles_with_ragged_edges():
    """A 5 x 7 matrix in 2 x 3 tiles::

         j: 0    1    2
    i=0   2x3  2x3  2x1
    i=1   2x3  2x3  2x1
    i=2   1x3  1x3  1x1
    """
    A = TiledMatrix((5, 7), tile=(2, 3), dtype=np.int64)
    assert (A.mt, A.nt, A.ndim) == (3, 3, 2)
    assert (A.tile_rows, A.tile_cols, A.tile) == (2, 3, (2, 3))
    shapes = [[A.tile_shape(i, j) for j in range(3)] for i in range(3)]
    assert shapes == [[(2, 3), (2, 3), (2, 1)]] * 2 + [[(1, 3), (1, 3), (1, 1)]]
    assert A[2, 2].shape == (1, 1) and A[1, 2].nbytes == 2 * 1 * 8
    assert all(A.tiles[ij].shape == A.tile_shape(*ij) for ij in A.indices())
    assert all(t.flags.f_contiguous and t.dtype == np.int64 for t in A.tiles.values())


def test_square_tiles_keep_an_int_tile():
    assert TiledMatrix((6, 9), 4).tile == 4
    assert TiledMatrix(8, (4, 4)).tile == 4
    assert TiledMatrix((6, 9), (4, 2)).tile == (4, 2)


def test_a_tiled_vector():
    """10 entries in tiles of 4: (4,) (4,) (2,), keys (uid, i, 0), indexed v[i]."""
    v = tg.TiledVector(10, tile=4, dtype=np.int32)
    assert v.shape == (10,) and v.ndim == 1 and (v.mt, v.nt) == (3, 1)
    assert (v.tile, v.tile_rows, v.tile_cols) == (4, 4, 1)
    assert [v.tile_shape(i) for i in range(3)] == [(4,), (4,), (2,)]
    assert v[2] is v[2, 0] and v[2].key == (v.uid, 2, 0) and repr(v[2]) == f"{v.name}[2]"
    assert v[2].nbytes == 8 and v.tiles[2, 0].shape == (2,)
    assert TiledMatrix((10,), (4,)).tile_shape(2) == (2,)


@pytest.mark.parametrize(
    "shape, tile, problem",
    [
        ((4, 4, 4), 2, "1-D or 2-D"),
        ((4,), (2, 2), "does not fit"),
        ((4, 4), (2,), "does not fit"),
        ((0, 4), 2, "positive"),
        ((4, 4), (2, 0), "positive"),
        ((4, 4), 1.5, "ints"),
    ],
)
def test_bad_shapes_and_tiles_are_refused(shape, tile, problem):
    with pytest.raises(ValueError, match=problem):
        TiledMatrix(shape, tile)


def test_lower_needs_square_tiles():
    with pytest.raises(ValueError, match="square"):
        TiledMatrix(8, (4, 2), lower=True)


def test_a_vector_index_on_a_matrix_is_a_graph_error():
    A = TiledMatrix((4, 4), 2, name="A")
    with pytest.raises(tg.GraphError, match=r"A\[i, j\]"):
        A[1]
    v = TiledVector(4, 2, name="v")
    with pytest.raises(tg.GraphError, match=r"v\[2,0\] is out of range: v has 2 tiles"):
        v[2]


# -- dtypes ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_numeric_dtype_round_trips(dtype):
    a = sample((5, 7), dtype)
    A = TiledMatrix.from_numpy(a, tile=(2, 3))
    assert A.dtype == np.dtype(dtype)
    got = A.gather()
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, a)
    v = TiledMatrix.from_numpy(a[:, 0].copy(), tile=2)
    assert v.ndim == 1 and np.array_equal(v.to_numpy(), a[:, 0])


@pytest.mark.parametrize("dtype", DTYPES + ["datetime64[s]", "U3"])
def test_zeros_is_the_dtypes_zero(dtype):
    A = TiledMatrix.zeros((3, 5), (2, 2), dtype)
    assert np.array_equal(A.gather(), np.zeros((3, 5), dtype))
    assert np.array_equal(TiledMatrix.zeros((5,), 2, dtype).gather(), np.zeros(5, dtype))


def test_object_dtype_is_refused():
    with pytest.raises(ValueError, match="not object.*tg.Data"):
        TiledMatrix((4, 4), 2, dtype=object)
    with pytest.raises(ValueError, match="not object"):
        TiledMatrix.from_numpy(np.array([None, 1]), tile=1)


def test_from_function_gets_each_tiles_index_and_shape():
    A = TiledMatrix.from_function((5, 7), (2, 3), lambda i, j, s: np.full(s, 10 * i + j), "i2")
    expected = np.add.outer(10 * (np.arange(5) // 2), np.arange(7) // 3)
    assert np.array_equal(A.gather(), expected)
    v = TiledMatrix.from_function((5,), 2, lambda i, j, s: np.full(s, i + j * 100), "u1")
    assert v.gather().tolist() == [0, 0, 1, 1, 2]


def test_random_spd_stays_square():
    A = TiledMatrix.random_spd(7, 3)
    full = A.gather()
    assert A.tile == 3 and A.lower and full.shape == (7, 7)
    assert np.array_equal(np.tril(full), np.tril(tg.dsl.tiled.spd_dense(7, 3)))


# -- owners --------------------------------------------------------------------------------


def owners(A) -> list[list[int]]:
    return [[A.owner(i, j) for j in range(A.nt)] for i in range(A.mt)]


def test_block_distribution_deals_contiguous_blocks():
    """4 ranks on a 2 x 2 grid, 5 x 4 tiles::

       j: 0 1 2 3
    i=0   0 0 1 1
    i=1   0 0 1 1
    i=2   0 0 1 1
    i=3   2 2 3 3
    i=4   2 2 3 3
    """
    A = TiledMatrix((10, 8), 2, distribution="block", cluster=FakeRanks(4))
    assert A.grid == (2, 2)
    assert owners(A) == [[0, 0, 1, 1]] * 3 + [[2, 2, 3, 3]] * 2
    assert block_owner(0, 0, (1, 1), (1, 1)) == 0


def test_vectors_are_dealt_over_every_rank():
    v = TiledVector(12, 2, cluster=FakeRanks(3))
    w = TiledVector(12, 2, distribution="block", cluster=FakeRanks(3))
    assert [v.owner(i) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [w.owner(i) for i in range(6)] == [0, 0, 1, 1, 2, 2]


def test_callable_map_and_array_owners():
    ranks = FakeRanks(3, rank=1)
    by_fn = TiledMatrix((6, 4), 2, distribution=lambda i, j: (i + 2 * j) % 3, cluster=ranks)
    table = {(i, j): (i + 2 * j) % 3 for i in range(3) for j in range(2)}
    by_map = TiledMatrix((6, 4), 2, distribution=table, cluster=ranks)
    by_array = TiledMatrix(
        (6, 4), 2, distribution=np.array([[0, 2], [1, 0], [2, 1]]), cluster=ranks
    )
    assert owners(by_fn) == owners(by_map) == owners(by_array) == [[0, 2], [1, 0], [2, 1]]
    assert set(by_fn.tiles) == {(1, 0), (2, 1)}  # rank 1 stores only its own
    v = TiledVector(6, 2, distribution={0: 2, 1: 1, 2: 0}, cluster=ranks)
    assert [v.owner(i) for i in range(3)] == [2, 1, 0]


@pytest.mark.parametrize(
    "distribution, problem",
    [
        (lambda i, j: 3 if (i, j) == (1, 2) else 0, r"tile B\[1,2\] is rank 3, outside 0\.\.2"),
        (lambda i, j: -1, r"tile B\[0,0\] is rank -1"),
        (lambda i, j: 0.0, r"tile B\[0,0\] is 0\.0, not an int rank"),
        ({(0, 0): 1}, r"map of B has no rank for tile B\[1,0\]"),
        (np.zeros((2, 2), int), r"owner array of B \(2 x 2\) has no rank for tile B\[0,2\]"),
        ("cyclic", "unknown distribution 'cyclic'"),
        ([["a"]], "must be a name, a callable, a map or an array of int ranks"),
    ],
)
def test_bad_owners_name_the_matrix_and_the_tile(distribution, problem):
    with pytest.raises(ValueError, match=problem):
        TiledMatrix((4, 6), 2, distribution=distribution, name="B", cluster=FakeRanks(3))


def test_the_named_distributions_are_unchanged():
    ranks = FakeRanks(4)
    two = TiledMatrix(8, 2, cluster=ranks)
    one = TiledMatrix(8, 2, distribution="1d", cluster=ranks)
    rnd = TiledMatrix(8, 2, distribution="random", distribution_seed=3, cluster=ranks)
    assert owners(two) == [[0, 1, 0, 1], [2, 3, 2, 3]] * 2
    assert owners(one) == [[0, 1, 2, 3]] * 4
    assert owners(rnd) == tg.dsl.placement.random_owners(4, 4, 4, 3)


def test_a_custom_owner_survives_spec_and_pickle():
    """Engines remake a matrix from spec(): a callable's owners go as their table, and
    the remade matrix has the same owners and the same fingerprint key."""
    A = TiledMatrix((6, 4), (2, 3), distribution=lambda i, j: (i + j) % 2, cluster=FakeRanks(2))
    spec = pickle.loads(pickle.dumps(A.spec()))
    B = TiledMatrix(**{**spec, "uid": None}, cluster=FakeRanks(2, rank=1))
    assert owners(B) == owners(A) == [[0, 1], [1, 0], [0, 1]]
    assert B.distribution_key == A.distribution_key and A.distribution_key.startswith("owners:")
    C = TiledMatrix((6, 4), (2, 3), distribution=lambda i, j: 0, cluster=FakeRanks(2))
    assert C.distribution_key != A.distribution_key


def test_a_callable_owner_fingerprints_alike_in_every_process():
    """A fingerprint hashes the owners, never the callable's address."""

    def graph(owner):
        A = TiledMatrix((4, 4), 2, distribution=owner, name="A")
        with tg.Graph() as g:
            scale(A[0, 0].rw)
        return g

    assert fingerprint(graph(lambda i, j: 0)).digest == fingerprint(graph(lambda i, j: 0)).digest


@tg.kernel(modes="rw", dims="mn")
def scale(t):
    t *= 2


def test_a_preview_on_another_rank_count_asks_the_distribution():
    A = TiledMatrix(
        (4, 4), 2, distribution=lambda i, j: (i + j) % 4, name="A", cluster=FakeRanks(4)
    )
    v = TiledVector(8, 2, distribution="block", cluster=FakeRanks(1))
    on4 = owner_for(4)
    assert [[on4(A[i, j]) for j in range(2)] for i in range(2)] == [[0, 1], [1, 2]]
    assert [on4(v[i]) for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"tile A\[1,1\] is rank 2, outside 0\.\.1"):
        owner_for(2)(A[0, 0])


# -- a real run on 2 ranks --------------------------------------------------------------------

TWO_RANKS = """
import numpy as np
import taskgraph as tg
from taskgraph.dsl.tiled import TiledVector

@tg.kernel(modes="r,rw", dims="mn,mn", dtypes=["int64"])
def add(x, y):
    y += x

@tg.kernel(modes="r,rw", dims="n,n", dtypes=["int16"])
def add1(x, y):
    y += x

# every tile of B and w lives on the other rank than its A / v: each task moves one
a = np.arange(35, dtype=np.int64).reshape(5, 7) * 1000003
A = tg.TiledMatrix.from_numpy(a, tile=(2, 3), distribution=lambda i, j: (i + j) % 2, name="A")
B = tg.TiledMatrix.zeros(
    (5, 7), (2, 3), np.int64, distribution=lambda i, j: (i + j + 1) % 2, name="B"
)
v = TiledVector(5, 2, np.int16, distribution={0: 0, 1: 1, 2: 1}, name="v")
for ij, t in v.tiles.items():
    t[...] = v.block(np.arange(5, dtype=np.int16), *ij) + 7
w = TiledVector(5, 2, np.int16, distribution=lambda i, j: 1 - v.owner(i), name="w")
for t in w.tiles.values():
    t[...] = 0
with tg.Graph("shapes") as g:
    for i, j in A.indices():
        add(A[i, j].r, B[i, j].rw)
    for i in range(v.mt):
        add1(v[i].r, w[i].rw)
tg.current_cluster().run(g).wait()
got, vec = B.gather(), w.gather()
if tg.current_cluster().rank == 0:
    assert got.dtype == np.int64 and np.array_equal(got, a), got
    assert vec.dtype == np.int16 and vec.tolist() == [7, 8, 9, 10, 11], vec
    print("shapes ok", B.tiles.keys() != A.tiles.keys())
"""


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_ragged_int_tiles_and_vector_tiles_move_between_two_ranks(mpirun, tmp_path):
    script = tmp_path / "shapes.py"
    script.write_text(textwrap.dedent(TWO_RANKS))
    proc = mpirun(2, [str(script)], timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shapes ok True" in proc.stdout


EXOTIC = """
import numpy as np
import taskgraph as tg

@tg.kernel(modes="r,w", dims="mn,mn")
def copy(x, y):
    y[...] = x

rank = tg.current_cluster().rank
for dtype in ["datetime64[s]", "timedelta64[ms]", "U3", "S2", [("a", "i4"), ("b", "f8")]]:
    src = np.arange(12).reshape(3, 4).astype("i8")
    a = src.astype(dtype) if not isinstance(dtype, list) else np.zeros((3, 4), dtype)
    if isinstance(dtype, list):
        a["a"], a["b"] = src, src / 2
    A = tg.TiledMatrix.from_numpy(a, tile=2, distribution=lambda i, j: (i + j) % 2)
    B = tg.TiledMatrix.zeros((3, 4), 2, a.dtype, distribution=lambda i, j: (i + j + 1) % 2)
    with tg.Graph("exotic") as g:
        for i, j in A.indices():
            copy(A[i, j].r, B[i, j].w)
    tg.current_cluster().run(g).wait()
    got = B.gather()
    if rank == 0:
        assert got.dtype == a.dtype and np.array_equal(got, a), (dtype, got)
if rank == 0:
    print("exotic ok")
"""


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_datetime_string_and_structured_tiles_move_as_bytes(mpirun, tmp_path):
    script = tmp_path / "exotic.py"
    script.write_text(textwrap.dedent(EXOTIC))
    proc = mpirun(2, [str(script)], timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exotic ok" in proc.stdout


class TileModel(FakeRanks):
    """One rank whose ``tile="auto"`` asks the real tile model (no measurement)."""

    def cholesky_tile(self, n, dtype):
        speeds = {b: {k: 10.0 for k in ("gemm", "syrk", "trsm", "potrf")} for b in (128, 256)}
        return choose(n, 2, speeds, 10.0)


@pytest.mark.parametrize("n", [0, -5, 2.5, "8", None])
def test_random_spd_refuses_a_bad_order_by_name_before_choosing_a_tile(n):
    """random_spd(0) and (-5) divided by zero in the tile model; (2.5): TypeError: 2.5."""
    with pytest.raises(ValueError, match=r"random_spd's n \(the matrix order\) must be a positive"):
        TiledMatrix.random_spd(n, cluster=TileModel(1))
    with pytest.raises(ValueError, match="n .* must be a positive int"):
        TiledMatrix.random_spd(n, 128, cluster=TileModel(1))


@pytest.mark.parametrize("shape", [0, (-5, -5), 2.5, (2.5, 2.5)])
def test_an_auto_tile_of_a_bad_shape_names_the_shape(shape):
    with pytest.raises(ValueError, match=r"matrix shape .* must be positive ints \(got"):
        TiledMatrix.zeros(shape, "auto", cluster=TileModel(1))


def test_a_good_order_still_gets_its_auto_tile():
    assert TiledMatrix.random_spd(512, cluster=TileModel(1)).tile in (128, 256)
    assert TiledMatrix.random_spd(np.int64(512), 128, cluster=TileModel(1)).mt == 4
