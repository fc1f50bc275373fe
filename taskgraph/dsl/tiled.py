"""Tiled matrices and vectors distributed over ranks.

A :class:`TiledMatrix` is an m x n matrix cut into tiles of ``mb x nb`` (``tile=b``
for square ones), smaller ("ragged") at the bottom and right edges; or, made with
``shape=(m,)`` (or as :func:`TiledVector`), a vector of m entries cut into 1-D tiles
of mb. Its dtype is any NumPy dtype but ``object``. Each tile has one owner rank
(:mod:`taskgraph.dsl.placement`): on a P x Q grid, 2-D block-cyclic by default
(``distribution="2d"``), dealt by tile column over 1 x P (``"1d"``), in contiguous
blocks of tiles (``"block"``), drawn at random, balanced and seeded (``"random"``), or
as the user says: a callable ``owner(i, j) -> rank`` or a map / array of ranks. Each
rank stores only the tiles it owns, as Fortran-ordered arrays that BLAS and LAPACK
use in place. Tiles are allocated once, when the matrix is made, and every task that
writes a tile writes it in place on its owner::

    A = TiledMatrix((5, 7), tile=(2, 3))      v = TiledVector(5, tile=2)
         j: 0    1    2                          i: 0    1    2
    i=0   2x3  2x3  2x1                             (2,) (2,) (1,)
    i=1   2x3  2x3  2x1                          key (uid, i, 0), v[i]
    i=2   1x3  1x3  1x1   (ragged edges)

``A[i, j]`` (``v[i]``) is a :class:`Tile` handle; ``.r``, ``.w`` and ``.rw`` on it are
the access marks a graph records. A matrix made with ``lower=True`` stores only the
tiles on and below the diagonal (what a Cholesky factorisation touches).

Constructors build tiles on the rank that owns them, from a seed, so no rank ever
holds the whole matrix: ``random_spd``, ``zeros``, ``from_function``, ``from_numpy``.
``gather()`` assembles the whole matrix on one rank.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from ..core.errors import GraphError
from . import memory
from .access import Markable
from .nested import describe
from .placement import distribution_grid, owner_table

_uids = itertools.count()  # matrices made here; a notebook's are negative
AUTO_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what calibration measures
_registry: weakref.WeakValueDictionary[int, TiledMatrix] = weakref.WeakValueDictionary()


def lookup(uid: int) -> TiledMatrix:
    """The matrix with this uid in this process (how pickled matrices come back)."""
    try:
        return _registry[uid]
    except KeyError:
        raise GraphError(
            f"no matrix {uid} in this process: in a notebook, the bare TiledMatrix(...) "
            "makes no tiles on the engines; make it with TiledMatrix.zeros, from_function, "
            "from_numpy or random_spd"
        ) from None


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


class Tile(Markable):
    """Handle on tile (i, j) of a matrix; ``.r``, ``.w``, ``.rw`` mark how a task uses it.

    A matrix hands out one handle per tile (``A[i, j] is A[i, j]``) while a graph is
    being recorded, and a handle makes each of its marks once: recording a 10^6-task
    graph indexes tiles millions of times.
    """

    __slots__ = ("matrix", "i", "j")

    def __init__(self, matrix: TiledMatrix, i: int, j: int):
        self.matrix = matrix
        self.i = i
        self.j = j
        self.forget_marks()

    def __getstate__(self):
        return (self.matrix, self.i, self.j)

    def __setstate__(self, state):
        Tile.__init__(self, *state)

    @property
    def key(self) -> tuple[int, int, int]:
        """``(matrix uid, i, j)``: names this tile's data in a graph."""
        return (self.matrix.uid, self.i, self.j)

    @property
    def shape(self) -> tuple[int, ...]:
        """The tile's shape (smaller than the others in the last row or column; a
        1-tuple for a vector's tile)."""
        return self.matrix.tile_shape(self.i, self.j)

    @property
    def nbytes(self) -> int:
        """The tile's size in bytes (what moving it costs)."""
        return math.prod(self.shape) * self.matrix.dtype.itemsize

    @property
    def dtype(self) -> np.dtype:
        """The matrix's dtype."""
        return self.matrix.dtype

    @property
    def owner(self) -> int:
        """The rank that stores this tile (and runs the tasks that write it)."""
        return self.matrix.owner(self.i, self.j)

    def __repr__(self) -> str:
        if self.matrix.ndim == 1:
            return f"{self.matrix.name}[{self.i}]"
        return f"{self.matrix.name}[{self.i},{self.j}]"


class TiledMatrix:
    """A matrix (or a vector) of tiles, each stored on its owner rank.

    Parameters
    ----------
    shape:
        ``(m, n)``, ``n`` for a square matrix, or ``(m,)`` for a vector of m entries.
    tile:
        The tile size: ``b`` (tiles of ``b x b``, or of ``b`` entries for a vector),
        ``(mb, nb)`` (tiles of mb rows and nb columns) or ``(mb,)`` for a vector.
        Tiles in the last row or column are smaller when the size does not divide.
        ``"auto"`` (a square float32 or float64 matrix): the square tile a tiled
        Cholesky runs fastest in on this cluster, from the kernels' speeds measured
        on its first rank's node (:meth:`Cluster.cholesky_tile`; cached, so measured
        once per machine and dtype); ``tile_choice.why()`` says why.
    dtype:
        Any NumPy dtype but ``object`` (floats, complex, ints, bools, float16, ...).
    grid:
        The ``(P, Q)`` rank grid of the ``"2d"`` and ``"block"`` distributions
        (default: the most square grid of the cluster's ranks; P x 1 for a vector).
    distribution:
        Who owns which tile: ``"2d"`` (block-cyclic on the grid), ``"1d"`` (dealt by
        tile column; a vector's by tile), ``"block"`` (contiguous blocks of tiles on
        the grid), ``"random"`` (balanced, drawn from ``distribution_seed``), a
        callable ``owner(i, j) -> rank`` (``j`` is 0 for a vector), or a map
        ``{(i, j): rank}`` (``{i: rank}`` for a vector) or an mt x nt array of ranks.
        A rank out of range is a ValueError naming the matrix and the tile.
    distribution_seed:
        The seed of a ``"random"`` distribution.
    lower:
        Store only the tiles on and below the diagonal (square matrices, square tiles).
    name:
        The name in labels and traces (default ``M<uid>``).
    cluster:
        The cluster whose ranks hold the tiles (default: the current one).
    uid:
        The matrix's id in every process (given by the cluster when None).

    ``A[i, j]`` (``v[i]`` for a vector) is a :class:`Tile`; ``.r``, ``.w``, ``.rw``
    on it mark it for a kernel call inside a graph. ``tile_rows``, ``tile_cols``: mb
    and nb (nb is 1 for a vector); ``tile``: b when tiles are square (and mb for a
    vector), else ``(mb, nb)``; ``mt`` x ``nt``: the tile counts (``nt`` is 1 for a
    vector). Constructors that also fill the tiles: :meth:`random_spd`,
    :meth:`zeros`, :meth:`from_function`, :meth:`from_numpy`.
    """

    def __init__(
        self,
        shape: tuple[int, ...] | int,
        tile: tuple[int, ...] | int,
        dtype=np.float64,
        *,
        grid: tuple[int, int] | None = None,
        distribution: Any = "2d",
        distribution_seed: int = 0,
        lower: bool = False,
        name: str | None = None,
        cluster=None,
        uid: int | None = None,
    ):
        self.cluster: Any = cast(Any, cluster if cluster is not None else _current_cluster())
        self.tile_choice = None  # what tile="auto" chose, and why
        if isinstance(tile, str):
            self.tile_choice = _auto_tile(self.cluster, shape, tile, dtype)
            tile = self.tile_choice.tile
        dims, (mb, nb) = _geometry(shape, tile)
        self.ndim = len(dims)
        if lower and (self.ndim != 2 or dims[0] != dims[1] or mb != nb):
            raise ValueError("a lower-triangular matrix must be square, in square tiles")
        self.dtype = np.dtype(dtype)
        if self.dtype.hasobject:
            raise ValueError(
                f"tiled matrices hold arrays of numbers, not {self.dtype} (Python objects "
                "cannot move as buffers: mark them with tg.Data instead)"
            )
        self.remote = bool(getattr(self.cluster, "remote", False))  # made from a notebook
        self.nranks = self.cluster.size
        self.rank = self.cluster.rank
        self.distribution = distribution
        self.distribution_seed = int(distribution_seed)
        self.grid: tuple[int, int] = (
            (int(grid[0]), int(grid[1]))
            if grid is not None
            else distribution_grid(distribution, self.nranks, vector=self.ndim == 1)
        )
        if self.grid[0] * self.grid[1] != self.nranks:
            raise ValueError(f"grid {self.grid} does not cover {self.nranks} ranks")
        self.shape: tuple[int, ...] = dims
        self.tile_rows, self.tile_cols = mb, nb
        self.tile: Any = mb if mb == nb or self.ndim == 1 else (mb, nb)
        self.lower = lower
        if uid is None:
            uid = self.cluster.new_uid() if self.remote else next(_uids)
        self.uid = uid
        self.name = name or f"M{abs(self.uid)}"
        m, n = dims if self.ndim == 2 else (dims[0], 1)
        self.mt, self.nt = -(-m // mb), -(-n // nb)
        self._full: tuple[int, ...] = (mb, nb) if self.ndim == 2 else (mb,)
        self._full_rows, self._full_cols = m // mb, n // nb
        owners = owner_table(
            distribution,
            list(self.indices()),
            (self.mt, self.nt),
            self.nranks,
            self.grid,
            self.distribution_seed,
            self.name,
        )
        self._owners = owners if isinstance(owners, list) else None
        self._owner_fn = None if isinstance(owners, list) else owners
        self._handles: dict[Any, Tile] = {}
        self.tiles: dict[tuple[int, int], np.ndarray] = {}
        # a notebook's rank is None: it owns none. One block for them all, on huge pages
        # when large (taskgraph.dsl.memory: a tile moves between ranks 2-3x as fast)
        mine = [ij for ij in self.indices() if self.owner(*ij) == self.rank]
        arrays = memory.empty_many([self.tile_shape(i, j) for i, j in mine], self.dtype)
        self.tiles.update(zip(mine, arrays))
        _registry[self.uid] = self

    def spec(self) -> dict:
        """What another process needs to make its share of this matrix (a callable or
        map of owners goes as its table of ranks, the same in every process)."""
        custom = not isinstance(self.distribution, str)
        return {
            "shape": self.shape,
            "tile": self.tile,
            "dtype": self.dtype.descr if self.dtype.fields else self.dtype.str,
            "grid": self.grid,
            "distribution": self._owners if custom else self.distribution,
            "distribution_seed": self.distribution_seed,
            "lower": self.lower,
            "name": self.name,
            "uid": self.uid,
        }

    @property
    def distribution_key(self) -> str:
        """The distribution as text that is the same in every process for the same
        owners: the name, or a digest of the owner table (what fingerprints hash)."""
        if isinstance(self.distribution, str):
            return self.distribution
        table = np.asarray(self._owners, np.int64)
        return "owners:" + hashlib.blake2b(table.tobytes(), digest_size=8).hexdigest()

    def owners_on(self, nranks: int) -> Callable[[int, int], int]:
        """``(i, j) -> rank``: the owners this matrix's distribution would give on
        ``nranks`` ranks (what a preview for another rank count places by)."""
        if nranks == self.nranks:
            return self.owner
        named = isinstance(self.distribution, str)
        grid = distribution_grid(self.distribution, nranks, vector=self.ndim == 1)
        owners = owner_table(
            self.distribution if named else self._custom_owner,
            list(self.indices()),
            (self.mt, self.nt),
            nranks,
            grid,
            self.distribution_seed,
            self.name,
        )
        if isinstance(owners, list):
            return lambda i, j: owners[i][j]
        return owners

    def _custom_owner(self, i: int, j: int) -> Any:
        """The user's owner of tile (i, j), as given (a callable, a map or an array)."""
        d = self.distribution
        if callable(d):
            return d(i, j)
        return self._owners[i][j] if self._owners is not None else -1

    def __reduce__(self):
        # a graph sent to the engines refers to their matrices, not to copies
        return (lookup, (self.uid,))

    # -- geometry ------------------------------------------------------------------

    def indices(self) -> Iterator[tuple[int, int]]:
        """Every stored tile index, column by column (``(i, 0)`` for a vector)."""
        for j in range(self.nt):
            for i in range(j if self.lower else 0, self.mt):
                yield i, j

    def tile_shape(self, i: int, j: int = 0) -> tuple[int, ...]:
        """The shape of tile ``(i, j)``: ``(mb, nb)``, smaller in the last row or
        column; ``(mb,)`` (or less, last) for a vector's tile ``i``."""
        if i < self._full_rows and j < self._full_cols:
            return self._full  # one shared tuple for every full tile
        mb, nb = self.tile_rows, self.tile_cols
        if self.ndim == 1:
            return (min(mb, self.shape[0] - i * mb),)
        m, n = self.shape
        return (min(mb, m - i * mb), min(nb, n - j * nb))

    def owner(self, i: int, j: int = 0) -> int:
        """The rank that stores tile ``(i, j)`` (by the matrix's distribution)."""
        if self._owners is not None:
            return self._owners[i][j]
        assert self._owner_fn is not None
        return self._owner_fn(i, j)

    def __getitem__(self, ij) -> Tile:
        try:
            return self._handles[ij]  # the common case: a tile indexed before
        except (KeyError, TypeError):
            pass
        t = self._new_handle(ij)
        self._handles[t.i, t.j] = t
        if self.ndim == 1:
            self._handles[t.i] = t  # v[i] finds it at once next time
        return t

    def forget_handles(self) -> None:
        """Drop the cached tile handles and their marks (they refer back to this
        matrix), so that the matrix is freed as soon as nothing else uses it."""
        for t in self._handles.values():
            t.forget_marks()
        self._handles.clear()

    def _new_handle(self, ij) -> Tile:
        i, j = self._index(ij)
        if not (0 <= i < self.mt and 0 <= j < self.nt):
            where = f"{self.mt} tiles" if self.ndim == 1 else f"{self.mt} x {self.nt} tiles"
            raise GraphError(f"tile {self.name}[{i},{j}] is out of range: {self.name} has {where}")
        if self.lower and i < j:
            raise GraphError(
                f"tile {self.name}[{i},{j}] is above the diagonal, and {self.name} stores "
                "only the lower triangle"
            )
        return Tile(self, i, j)

    def _index(self, ij) -> tuple[int, int]:
        """``(i, j)`` of ``A[i, j]``, or of ``v[i]`` (``v[i, 0]``) for a vector."""
        try:
            if self.ndim == 1 and not isinstance(ij, tuple):
                return operator.index(ij), 0
            i, j = ij
            return operator.index(i), operator.index(j)  # (int() took A[0.5, 0] as A[0, 0])
        except (TypeError, ValueError):
            how = f"{self.name}[i]" if self.ndim == 1 else f"{self.name}[i, j]"
            raise GraphError(f"index tiles of {self.name} as {how}, not {describe(ij)}") from None

    def __repr__(self) -> str:
        kind = "lower " if self.lower else ""
        size = "x".join(map(str, self.shape))
        what = "TiledVector" if self.ndim == 1 else "TiledMatrix"
        tiles = f"{self.mt} tiles" if self.ndim == 1 else f"{self.mt}x{self.nt} tiles"
        if isinstance(self.distribution, str) and self.distribution != "random":
            where = f"{self.distribution} on grid {self.grid[0]}x{self.grid[1]}"
        elif self.distribution == "random":
            where = f"random owners (seed {self.distribution_seed})"
        else:
            where = "owners given"
        return (
            f"<{what} {self.name}: {kind}{size} {self.dtype}, tile {self.tile} ({tiles}), {where}>"
        )

    def local(self, i: int, j: int = 0) -> np.ndarray:
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
        tiles with ``fn(i, j, tile_shape)`` (on the engines too; ``j`` is 0 and
        ``tile_shape`` a 1-tuple for a vector); ``kw`` as for :class:`TiledMatrix`."""
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
        zero = np.zeros((), dtype)  # the dtype's own zero (False, 0, 0.0, "", epoch...)
        return cls.from_function(shape, tile, lambda i, j, s: zero, dtype, **kw)

    @classmethod
    def random_spd(cls, n: int, tile: int | str = "auto", dtype=np.float64, *, seed=0, **kw):
        """A random symmetric positive definite n x n matrix of ``dtype`` in tiles of
        ``tile`` (lower tiles stored; ``"auto"``, the default: the tile a tiled
        Cholesky runs fastest in here, see :class:`TiledMatrix`).

        Entries off the diagonal are uniform in [0, 1), and n is added to the diagonal,
        so the matrix is strictly diagonally dominant. Every tile is generated from
        ``(seed, i, j)`` alone: any rank count gives the same matrix. ``kw`` as for
        :class:`TiledMatrix` (``lower=True`` and ``name="A"`` unless given).
        """
        n = _positive("random_spd's n (the matrix order)", (n,))[0]  # (before "auto" uses it)
        kw.setdefault("lower", True)
        kw.setdefault("name", "A")
        return cls.from_function(
            n, tile, lambda i, j, s: spd_tile(seed, i, j, s, n, dtype), dtype, **kw
        )

    @classmethod
    def from_numpy(cls, *args, tile: Any = None, **kw) -> TiledMatrix:
        """Cut a 1-D or 2-D NumPy array (any dtype but object) into tiles owned by
        their ranks.

        ``from_numpy(array, tile)`` in a batch job (every rank has the array), or
        ``from_numpy(cluster, array, tile=...)`` in a notebook, which sends each engine
        only its own tiles. ``tile``: ``b``, ``(mb, nb)``, or ``(mb,)`` for a 1-D
        array; ``kw`` as for :class:`TiledMatrix`.
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

    def block(self, array: np.ndarray, i: int, j: int = 0) -> np.ndarray:
        """The part of a full-size array that tile (i, j) covers (a view: writing it
        writes ``array``)."""
        mb, nb = self.tile_rows, self.tile_cols
        shape = self.tile_shape(i, j)
        if self.ndim == 1:
            return array[i * mb : i * mb + shape[0]]
        return array[i * mb : i * mb + shape[0], j * nb : j * nb + shape[1]]

    # -- results --------------------------------------------------------------------

    def gather(self, root: int | None = 0) -> np.ndarray | None:
        """The whole matrix as one array on ``root`` (on every rank if root is None).

        A vector gathers to a 1-D array. Tiles not stored (above the diagonal of a
        lower matrix) are zero. In a batch
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


class TiledVector(TiledMatrix):
    """A vector of ``n`` entries of ``dtype`` in 1-D tiles of ``tile``: a
    ``TiledMatrix((n,), tile, dtype)``, with its constructors (``TiledVector.zeros(n,
    tile)``, ``TiledVector.from_numpy(v, tile)``, ...).

    Indexed ``v[i]`` (its tiles' keys are ``(uid, i, 0)``); ``kw`` as for
    :class:`TiledMatrix`. Its tiles are dealt over all ranks (a P x 1 grid) by the
    named distributions, and a callable owner is asked ``owner(i, 0)``.
    """

    def __init__(self, n: int | tuple[int], tile: int | tuple[int], dtype=np.float64, **kw):
        shape = tuple(n) if isinstance(n, tuple | list) else (n,)
        if len(shape) != 1:
            raise ValueError(f"a TiledVector has one dimension, not shape {shape}")
        super().__init__(shape, tile, dtype, **kw)


def _auto_tile(cluster, shape, tile: str, dtype):
    """The Choice for ``tile="auto"`` (see :class:`TiledMatrix`); a ValueError where
    it does not apply."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape, shape)
    if tile != "auto":
        raise ValueError(f'tile must be a size, (mb, nb) or "auto", not {tile!r}')
    if len(dims) != 2 or dims[0] != dims[1] or np.dtype(dtype) not in AUTO_DTYPES:
        raise ValueError(
            'tile="auto" picks the square tile of a tiled Cholesky, for a square float32 '
            f"or float64 matrix, not {np.dtype(dtype)} of shape {shape}: give the tile size"
        )
    order = _positive(f"matrix shape {shape}", dims)[0]  # (the tile model divides by it)
    return cluster.cholesky_tile(order, np.dtype(dtype).name)


def _geometry(shape, tile) -> tuple[tuple[int, ...], tuple[int, int]]:
    """``(shape, (mb, nb))`` from the user's ``shape`` and ``tile`` (nb is 1 for a
    vector); a ValueError says what is wrong."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape, shape)
    if len(dims) not in (1, 2):
        raise ValueError(f"a tiled matrix is 1-D or 2-D, not of shape {shape}")
    sizes = tuple(tile) if isinstance(tile, (tuple, list)) else (tile,) * len(dims)
    if len(sizes) != len(dims):
        raise ValueError(
            f"tile {tile} does not fit shape {shape}: give "
            + ("b or (mb,)" if len(dims) == 1 else "b or (mb, nb)")
        )
    whole = _positive(f"matrix shape {shape}", dims)
    steps = _positive(f"tile {tile}", sizes)
    return whole, (steps[0], steps[1] if len(steps) == 2 else 1)


def _positive(what: str, values) -> tuple[int, ...]:
    """``values`` as ints of at least 1; else a ValueError saying that ``what`` (the
    argument, as the user gave it) must be."""
    values = tuple(values)
    allowed = "a positive int" if len(values) == 1 else "positive ints"
    for x in values:
        try:
            ok = _whole(x) >= 1
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ValueError(f"{what} must be {allowed} (got {x!r})")
    return tuple(map(_whole, values))


def _whole(x) -> int:
    """``x`` as an int, where it is a whole number (not a bool); else a TypeError."""
    if isinstance(x, (bool, np.bool_)) or int(x) != x:
        raise TypeError(f"{x!r} is not a whole number")
    return int(x)


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
