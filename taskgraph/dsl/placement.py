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

* **Follow the inputs** (tasks that write no tile, e.g. ``@tg.task`` futures). Greedy,
  in task order: a task goes to the rank that already holds most of its input bytes;
  with no inputs, or a tie, to the least-loaded of the tied ranks (then the lowest).
  Independent tasks thus spread round-robin, and chains stay on one rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


DISTRIBUTIONS = ("2d", "1d", "random")


def distribution_grid(distribution: str, nranks: int) -> tuple[int, int]:
    """The P x Q grid of a named tile distribution.

    ``"2d"``: the most square grid (2-D block-cyclic); ``"1d"``: 1 x P, tile columns
    dealt round-robin; ``"random"``: no grid (1 x P is returned, the owners are drawn).
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"unknown distribution {distribution!r}: choose one of {', '.join(DISTRIBUTIONS)}"
        )
    return grid_shape(nranks) if distribution == "2d" else (1, nranks)


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
