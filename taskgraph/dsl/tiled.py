"""Tiled matrices distributed over ranks.

A :class:`TiledMatrix` is an m x n matrix cut into tiles of ``tile x tile`` (smaller at
the bottom and right edges). Each tile has one owner rank: on a P x Q grid, 2-D
block-cyclic by default (``distribution="2d"``), dealt by tile column over 1 x P
(``"1d"``), or drawn at random, balanced and seeded (``"random"``; see
:mod:`taskgraph.dsl.placement`), and each rank stores only the
tiles it owns, as Fortran-ordered arrays that BLAS and LAPACK use in place. Tiles are
allocated once, when the matrix is made, and every task that writes a tile writes it
in place on its owner.

``A[i, j]`` is a :class:`Tile` handle; ``A[i, j].r``, ``.w`` and ``.rw`` are the access
marks a graph records. A matrix made with ``lower=True`` stores only the tiles on and
below the diagonal (what a Cholesky factorisation touches).

Constructors build tiles on the rank that owns them, from a seed, so no rank ever
holds the whole matrix: ``random_spd``, ``zeros``, ``from_function``, ``from_numpy``.
``gather()`` assembles the whole matrix on one rank.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from ..core.errors import GraphError
from . import memory
from .access import Access, Mode
from .nested import describe
from .placement import block_cyclic_owner, distribution_grid, random_owners

_uids = itertools.count()  # matrices made here; a notebook's are negative
_registry: weakref.WeakValueDictionary[int, TiledMatrix] = weakref.WeakValueDictionary()


def lookup(uid: int) -> TiledMatrix:
    """The matrix with this uid in this process (how pickled matrices come back)."""
    try:
        return _registry[uid]
    except KeyError:
        raise GraphError(f"no matrix {uid} in this process") from None


def _no_cluster() -> Any:
    raise RuntimeError("no default cluster: import taskgraph (its cluster layer names one)")


# The cluster layer, above this one, installs these (use_clusters): matrices never import it
_cluster_kind: type = type(None)
_current_cluster: Callable[[], Any] = _no_cluster


def use_clusters(kind: type, current: Callable[[], Any]) -> None:
    """Install the cluster class ``kind`` (for ``from_numpy(cluster, ...)``) and
    ``current``, which gives the cluster a matrix made without one lives on."""
    global _cluster_kind, _current_cluster
    _cluster_kind, _current_cluster = kind, current


class Tile:
    """Handle on tile (i, j) of a matrix; ``.r``, ``.w``, ``.rw`` mark how a task uses it.

    A matrix hands out one handle per tile (``A[i, j] is A[i, j]``) while a graph is
    being recorded, and a handle makes each of its marks once: recording a 10^6-task
    graph indexes tiles millions of times.
    """

    __slots__ = ("matrix", "i", "j", "_r", "_w", "_rw")

    def __init__(self, matrix: TiledMatrix, i: int, j: int):
        self.matrix = matrix
        self.i = i
        self.j = j
        self._r: Access | None = None
        self._w: Access | None = None
        self._rw: Access | None = None

    @property
    def r(self) -> Access:
        """This tile marked as read by the task (``A[i, j].r``)."""
        a = self._r
        if a is None:
            a = self._r = Access(self, Mode.R, 1)
        return a

    @property
    def w(self) -> Access:
        """This tile marked as overwritten, not read, by the task (``A[i, j].w``)."""
        a = self._w
        if a is None:
            a = self._w = Access(self, Mode.W, 2)
        return a

    @property
    def rw(self) -> Access:
        """This tile marked as read and written by the task (``A[i, j].rw``)."""
        a = self._rw
        if a is None:
            a = self._rw = Access(self, Mode.RW, 3)
        return a

    def forget_marks(self) -> None:
        """Drop the cached marks (each refers back to this tile)."""
        self._r = self._w = self._rw = None

    def __getstate__(self):
        return (self.matrix, self.i, self.j)

    def __setstate__(self, state):
        Tile.__init__(self, *state)

    @property
    def key(self) -> tuple[int, int, int]:
        """``(matrix uid, i, j)``: names this tile's data in a graph."""
        return (self.matrix.uid, self.i, self.j)

    @property
    def shape(self) -> tuple[int, int]:
        """The tile's shape (smaller than the others in the last row or column)."""
        return self.matrix.tile_shape(self.i, self.j)

    @property
    def dtype(self) -> np.dtype:
        """The matrix's dtype."""
        return self.matrix.dtype

    @property
    def owner(self) -> int:
        """The rank that stores this tile (and runs the tasks that write it)."""
        return self.matrix.owner(self.i, self.j)

    def __repr__(self) -> str:
        return f"{self.matrix.name}[{self.i},{self.j}]"


class TiledMatrix:
    """A matrix of tiles, each stored on its owner rank.

    Parameters
    ----------
    shape:
        ``(m, n)``, or ``n`` for a square matrix.
    tile:
        The tile size: tiles are ``tile x tile``, smaller at the bottom and right edges.
    dtype:
        A floating-point dtype (float32, float64, complex64, complex128).
    grid:
        The ``(P, Q)`` rank grid of a 2-D block-cyclic distribution (default: the most
        square grid of the cluster's ranks, or as ``distribution`` says).
    distribution:
        ``"2d"`` (block-cyclic on the grid), ``"1d"`` (dealt by tile column) or
        ``"random"`` (balanced, drawn from ``distribution_seed``).
    distribution_seed:
        The seed of a ``"random"`` distribution.
    lower:
        Store only the tiles on and below the diagonal (square matrices).
    name:
        The name in labels and traces (default ``M<uid>``).
    cluster:
        The cluster whose ranks hold the tiles (default: the current one).
    uid:
        The matrix's id in every process (given by the cluster when None).

    ``A[i, j]`` is a :class:`Tile`; ``A[i, j].r``, ``.w``, ``.rw`` mark it for a
    kernel call inside a graph. Constructors that also fill the tiles:
    :meth:`random_spd`, :meth:`zeros`, :meth:`from_function`, :meth:`from_numpy`.
    """

    def __init__(
        self,
        shape: tuple[int, int] | int,
        tile: int,
        dtype=np.float64,
        *,
        grid: tuple[int, int] | None = None,
        distribution: str = "2d",
        distribution_seed: int = 0,
        lower: bool = False,
        name: str | None = None,
        cluster=None,
        uid: int | None = None,
    ):
        m, n = (shape, shape) if isinstance(shape, int) else shape
        if m < 1 or n < 1 or tile < 1:
            raise ValueError(f"matrix shape ({m}, {n}) and tile {tile} must be positive")
        if lower and m != n:
            raise ValueError("a lower-triangular matrix must be square")
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "fc":
            raise ValueError(f"tiled matrices hold floating-point numbers, not {self.dtype}")
        self.cluster: Any = cast(Any, cluster if cluster is not None else _current_cluster())
        self.remote = bool(getattr(self.cluster, "remote", False))  # made from a notebook
        self.nranks = self.cluster.size
        self.rank = self.cluster.rank
        self.distribution = distribution
        self.distribution_seed = int(distribution_seed)
        self.grid: tuple[int, int] = (
            (int(grid[0]), int(grid[1]))
            if grid is not None
            else distribution_grid(distribution, self.nranks)
        )
        if self.grid[0] * self.grid[1] != self.nranks:
            raise ValueError(f"grid {self.grid} does not cover {self.nranks} ranks")
        self.shape = (m, n)
        self.tile = tile
        self.lower = lower
        if uid is None:
            uid = self.cluster.new_uid() if self.remote else next(_uids)
        self.uid = uid
        self.name = name or f"M{abs(self.uid)}"
        self.mt = -(-m // tile)
        self.nt = -(-n // tile)
        self._full = (tile, tile)
        self._full_rows, self._full_cols = m // tile, n // tile
        self._owners = (
            random_owners(self.mt, self.nt, self.nranks, self.distribution_seed)
            if distribution == "random"
            else None
        )
        self._handles: dict[tuple[int, int], Tile] = {}
        self.tiles: dict[tuple[int, int], np.ndarray] = {}
        # a notebook's rank is None: it owns none. One block for them all, on huge pages
        # when large (taskgraph.dsl.memory: a tile moves between ranks 2-3x as fast)
        mine = [ij for ij in self.indices() if self.owner(*ij) == self.rank]
        arrays = memory.empty_many([self.tile_shape(i, j) for i, j in mine], self.dtype)
        self.tiles.update(zip(mine, arrays))
        _registry[self.uid] = self

    def spec(self) -> dict:
        """What another process needs to make its share of this matrix."""
        return {
            "shape": self.shape,
            "tile": self.tile,
            "dtype": self.dtype.str,
            "grid": self.grid,
            "distribution": self.distribution,
            "distribution_seed": self.distribution_seed,
            "lower": self.lower,
            "name": self.name,
            "uid": self.uid,
        }

    def __reduce__(self):
        # a graph sent to the engines refers to their matrices, not to copies
        return (lookup, (self.uid,))

    # -- geometry ------------------------------------------------------------------

    def indices(self) -> Iterator[tuple[int, int]]:
        """Every stored tile index, column by column."""
        for j in range(self.nt):
            for i in range(j if self.lower else 0, self.mt):
                yield i, j

    def tile_shape(self, i: int, j: int) -> tuple[int, int]:
        """The shape of tile ``(i, j)``: ``(tile, tile)``, smaller in the last row or column."""
        if i < self._full_rows and j < self._full_cols:
            return self._full  # one shared tuple for every full tile
        m, n = self.shape
        return (min(self.tile, m - i * self.tile), min(self.tile, n - j * self.tile))

    def owner(self, i: int, j: int) -> int:
        """The rank that stores tile ``(i, j)`` (by the matrix's distribution)."""
        if self._owners is not None:
            return self._owners[i][j]
        return block_cyclic_owner(i, j, self.grid)

    def __getitem__(self, ij) -> Tile:
        try:
            return self._handles[ij]  # the common case: a tile indexed before
        except (KeyError, TypeError):
            pass
        t = self._new_handle(ij)
        self._handles[t.i, t.j] = t
        return t

    def forget_handles(self) -> None:
        """Drop the cached tile handles and their marks (they refer back to this
        matrix), so that the matrix is freed as soon as nothing else uses it."""
        for t in self._handles.values():
            t.forget_marks()
        self._handles.clear()

    def _new_handle(self, ij) -> Tile:
        try:
            i, j = ij
            i, j = int(i), int(j)
        except (TypeError, ValueError):
            raise GraphError(
                f"index tiles of {self.name} as {self.name}[i, j], not {describe(ij)}"
            ) from None
        if not (0 <= i < self.mt and 0 <= j < self.nt):
            raise GraphError(
                f"tile {self.name}[{i},{j}] is out of range: {self.name} has "
                f"{self.mt} x {self.nt} tiles"
            )
        if self.lower and i < j:
            raise GraphError(
                f"tile {self.name}[{i},{j}] is above the diagonal, and {self.name} stores "
                "only the lower triangle"
            )
        return Tile(self, i, j)

    def __repr__(self) -> str:
        m, n = self.shape
        kind = "lower " if self.lower else ""
        return (
            f"<TiledMatrix {self.name}: {kind}{m}x{n} {self.dtype}, tile {self.tile} "
            f"({self.mt}x{self.nt} tiles), "
            + (
                f"random owners (seed {self.distribution_seed})>"
                if self._owners is not None
                else f"grid {self.grid[0]}x{self.grid[1]}>"
            )
        )

    def local(self, i: int, j: int) -> np.ndarray:
        """The array of tile ``(i, j)``, which this rank owns; KeyError naming its owner."""
        try:
            return self.tiles[i, j]
        except KeyError:
            raise KeyError(
                f"tile {self.name}[{i},{j}] lives on rank {self.owner(i, j)}, not {self.rank}"
            ) from None

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def from_function(cls, shape, tile, fn: Callable, dtype=np.float64, **kw) -> TiledMatrix:
        """A ``shape`` matrix in tiles of ``tile`` and ``dtype``, each owner filling its
        tiles with ``fn(i, j, tile_shape)`` (on the engines too); ``kw`` as for
        :class:`TiledMatrix`."""
        a = cls(shape, tile, dtype, **kw)
        if a.remote:
            a.cluster.build_matrix(a, fn)
        for (i, j), t in a.tiles.items():
            t[...] = fn(i, j, t.shape)
        return a

    @classmethod
    def zeros(cls, shape, tile, dtype=np.float64, **kw) -> TiledMatrix:
        """A ``shape`` matrix of zeros in tiles of ``tile`` and ``dtype``; ``kw`` as for
        :class:`TiledMatrix`."""
        return cls.from_function(shape, tile, lambda i, j, s: 0.0, dtype, **kw)

    @classmethod
    def random_spd(cls, n: int, tile: int, dtype=np.float64, *, seed: int = 0, **kw):
        """A random symmetric positive definite n x n matrix of ``dtype`` in tiles of
        ``tile`` (lower tiles stored).

        Entries off the diagonal are uniform in [0, 1), and n is added to the diagonal,
        so the matrix is strictly diagonally dominant. Every tile is generated from
        ``(seed, i, j)`` alone: any rank count gives the same matrix. ``kw`` as for
        :class:`TiledMatrix` (``lower=True`` and ``name="A"`` unless given).
        """
        kw.setdefault("lower", True)
        kw.setdefault("name", "A")
        return cls.from_function(
            n, tile, lambda i, j, s: spd_tile(seed, i, j, s, n, dtype), dtype, **kw
        )

    @classmethod
    def from_numpy(cls, *args, tile: int | None = None, **kw) -> TiledMatrix:
        """Cut a NumPy array into tiles owned by their ranks.

        ``from_numpy(array, tile)`` in a batch job (every rank has the array), or
        ``from_numpy(cluster, array, tile=...)`` in a notebook, which sends each engine
        only its own tiles.
        """
        if args and isinstance(args[0], _cluster_kind):
            kw["cluster"], args = args[0], args[1:]
        if tile is None and len(args) > 1:
            args, tile = args[:1], args[1]
        if len(args) != 1 or tile is None:
            raise TypeError("use from_numpy(array, tile) or from_numpy(cluster, array, tile=...)")
        array = np.asarray(args[0])
        a = cls(array.shape, tile, array.dtype, **kw)
        if a.remote:
            a.cluster.build_matrix(a, None)
            a.cluster.scatter_matrix(a, array)
        for (i, j), t in a.tiles.items():
            t[...] = a.block(array, i, j)
        return a

    def block(self, array: np.ndarray, i: int, j: int) -> np.ndarray:
        """The part of a full-size array that tile (i, j) covers."""
        t = self.tile
        r, c = self.tile_shape(i, j)
        return array[i * t : i * t + r, j * t : j * t + c]

    # -- results --------------------------------------------------------------------

    def gather(self, root: int | None = 0) -> np.ndarray | None:
        """The whole matrix as one array on ``root`` (on every rank if root is None).

        Tiles not stored (above the diagonal of a lower matrix) are zero. In a batch
        job every rank must call it; in a notebook it collects the tiles from the
        engines and returns the array there.
        """
        out = None
        if root is None or self.rank == root or self.rank is None:  # None: the notebook
            out = np.zeros(self.shape, self.dtype, order="F")
        self.cluster.gather_tiles(self, out, root)
        return out

    def to_numpy(self) -> np.ndarray:
        """The whole matrix on every rank (collective)."""
        out = self.gather(root=None)
        assert out is not None
        return out


def spd_tile(seed: int, i: int, j: int, shape, n: int, dtype) -> np.ndarray:
    """Tile (i, j) of the random SPD matrix of :meth:`TiledMatrix.random_spd`."""
    if i < j:
        return spd_tile(seed, j, i, shape[::-1], n, dtype).T
    rng = np.random.default_rng((seed, i, j))
    t = rng.random(shape, dtype=np.dtype(dtype) if np.dtype(dtype) == np.float32 else np.float64)
    if i == j:
        t = (t + t.T) / 2
        t[np.diag_indices_from(t)] += n
    return t.astype(dtype, copy=False)


def spd_dense(n: int, tile: int, dtype=np.float64, seed: int = 0) -> np.ndarray:
    """The full random SPD matrix, built on one process (for checking results)."""
    a = np.empty((n, n), dtype, order="F")
    nt = -(-n // tile)
    for j in range(nt):
        for i in range(nt):
            rows = slice(i * tile, min(n, (i + 1) * tile))
            cols = slice(j * tile, min(n, (j + 1) * tile))
            shape = (rows.stop - rows.start, cols.stop - cols.start)
            a[rows, cols] = spd_tile(seed, i, j, shape, n, dtype)
    return a
