"""Placement: which rank runs which task. Pure functions, no MPI.

Two policies, one per kind of task:

* **Owner computes** (tasks that write tiles). Tiles are spread over a P x Q grid of
  ranks 2-D block-cyclically, as ScaLAPACK and DAGuE do, so that every rank owns a
  share of every block row and column::

        Q=2 ->   j: 0 1 2 3
      P=2   i=0    0 1 0 1        owner(i, j) = (i mod P) * Q + (j mod Q)
            i=1    2 3 2 3
            i=2    0 1 0 1

  A task runs on the rank that owns the tile it writes; every version of a tile is
  therefore produced in place on its owner, and other ranks only ever read copies.

  Other tile distributions (:func:`owner_table`): ``"1d"`` (1 x P, dealt by tile
  column), ``"random"`` (balanced, seeded), ``"block"`` (contiguous blocks of tiles on
  the grid, as a simulation's slabs are), or the user's own: a callable
  ``owner(i, j) -> rank`` or a map ``{(i, j): rank}`` / an array of ranks. Every
  owner is checked against the rank count where the matrix is made.

* **Follow the inputs** (tasks that write no tile, e.g. ``@tg.task`` futures). Greedy,
  in task order: a task goes to the rank that already holds most of its input bytes;
  with no inputs, or a tie, to the least-loaded of the tied ranks (then the lowest).
  Independent tasks thus spread round-robin, and chains stay on one rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def grid_shape(nranks: int) -> tuple[int, int]:
    """The most square P x Q grid with P * Q == nranks and P <= Q."""
    if nranks < 1:
        raise ValueError(f"need at least one rank, got {nranks}")
    p = math.isqrt(nranks)
    while nranks % p:
        p -= 1
    return p, nranks // p


def block_cyclic_owner(i: int, j: int, grid: tuple[int, int]) -> int:
    """The rank that owns tile (i, j) on a P x Q grid."""
    p, q = grid
    return (i % p) * q + (j % q)


def block_owner(i: int, j: int, grid: tuple[int, int], tiles: tuple[int, int]) -> int:
    """The rank that owns tile (i, j) of mt x nt ``tiles`` cut into P x Q contiguous
    blocks (balanced to within one tile row or column)::

        P=2, Q=2, 4 x 4 tiles:   0 0 1 1
                                 0 0 1 1
                                 2 2 3 3
                                 2 2 3 3
    """
    (p, q), (mt, nt) = grid, tiles
    return (i * p // mt) * q + (j * q // nt)


DISTRIBUTIONS = ("2d", "1d", "random", "block")


def distribution_grid(distribution: Any, nranks: int, vector: bool = False) -> tuple[int, int]:
    """The P x Q grid of a tile distribution.

    ``"2d"`` and ``"block"``: the most square grid; ``"1d"``: 1 x P, tile columns dealt
    round-robin; ``"random"``, a callable or a map: no grid (1 x P is returned, the
    owners are given). A vector's (``vector``: one tile column) is P x 1 for every
    named distribution, so that its tiles go to every rank.
    """
    if not isinstance(distribution, str):
        return (1, nranks)
    if distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"unknown distribution {distribution!r}: choose one of {', '.join(DISTRIBUTIONS)},"
            " a callable owner(i, j) -> rank or a map {(i, j): rank}"
        )
    if vector and distribution != "random":
        return (nranks, 1)
    return grid_shape(nranks) if distribution in ("2d", "block") else (1, nranks)


def owner_table(
    distribution: Any,
    indices: Sequence[tuple[int, int]],
    tiles: tuple[int, int],
    nranks: int,
    grid: tuple[int, int],
    seed: int = 0,
    what: str = "matrix",
) -> Callable[[int, int], int] | list[list[int]]:
    """The owners of a matrix's tiles: a function ``(i, j) -> rank`` for the grid
    distributions ("2d", "1d", "block"), else an mt x nt table (-1 where no tile is
    stored). ``indices``: the stored tiles; ``tiles``: (mt, nt). A callable or a map
    is asked for every stored tile; a missing tile or a rank outside
    ``0..nranks-1`` is a ValueError naming ``what`` (the matrix) and the tile.
    """
    mt, nt = tiles
    if isinstance(distribution, str):
        distribution_grid(distribution, nranks)  # an unknown name fails here
        if distribution == "random":
            return random_owners(mt, nt, nranks, seed)
        if distribution == "block":
            return lambda i, j: block_owner(i, j, grid, tiles)
        return lambda i, j: block_cyclic_owner(i, j, grid)
    ask = _asker(distribution, what)
    table = [[-1] * nt for _ in range(mt)]
    for i, j in indices:
        table[i][j] = _checked_rank(ask(i, j), nranks, what, i, j)
    return table


def _asker(distribution: Any, what: str) -> Callable[[int, int], Any]:
    """``(i, j) -> the rank distribution gives``, for a callable, a map or an array."""
    if callable(distribution):
        return distribution
    if isinstance(distribution, Mapping):

        def from_map(i: int, j: int) -> Any:
            for key in ((i, j), i) if j == 0 else ((i, j),):
                if key in distribution:
                    return distribution[key]
            raise ValueError(f"the owner map of {what} has no rank for tile {what}[{i},{j}]")

        return from_map
    import numpy as np

    ranks = np.asarray(distribution)
    if ranks.ndim == 1:
        ranks = ranks[:, None]
    if ranks.ndim != 2 or ranks.dtype.kind not in "iu":
        raise ValueError(
            f"the owners of {what} must be a name, a callable, a map or an array of int "
            f"ranks, not {type(distribution).__name__}"
            + (f" of {ranks.dtype} {ranks.shape}" if isinstance(distribution, np.ndarray) else "")
        )

    def from_array(i: int, j: int) -> Any:
        if i >= ranks.shape[0] or j >= ranks.shape[1]:
            raise ValueError(
                f"the owner array of {what} ({ranks.shape[0]} x {ranks.shape[1]}) has no rank "
                f"for tile {what}[{i},{j}]"
            )
        return ranks[i, j]

    return from_array


def _checked_rank(rank: Any, nranks: int, what: str, i: int, j: int) -> int:
    import numpy as np

    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise ValueError(f"the owner of tile {what}[{i},{j}] is {rank!r}, not an int rank")
    if not 0 <= rank < nranks:
        raise ValueError(
            f"the owner of tile {what}[{i},{j}] is rank {rank}, outside 0..{nranks - 1} "
            f"({nranks} ranks)"
        )
    return int(rank)


def random_owners(mt: int, nt: int, nranks: int, seed: int = 0) -> list[list[int]]:
    """A seeded random owner for each of mt x nt tiles, balanced: every rank gets
    the same number of tiles (to within one), in a random arrangement."""
    import numpy as np

    deal = np.arange(mt * nt) % nranks
    np.random.default_rng(seed).shuffle(deal)
    return deal.reshape(mt, nt).tolist()


def pick_rank(where: dict[int, float], load: list[float]) -> int:
    """Follow the inputs: the rank holding most input bytes; ties go to the least loaded."""
    if where:
        best = max(where.values())
        tied = [r for r, b in where.items() if b == best]
    else:
        tied = list(range(len(load)))
    return min(tied, key=lambda r: (load[r], r))


def follow_inputs(input_ranks: Sequence[dict[int, float]], nranks: int) -> list[int]:
    """Place tasks in order; ``input_ranks[t]`` maps rank -> bytes of t's inputs there."""
    load = [0.0] * nranks
    placed = []
    for where in input_ranks:
        rank = pick_rank(where, load)
        load[rank] += 1.0
        placed.append(rank)
    return placed
