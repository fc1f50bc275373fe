"""The numba leaves of the Tascell programs (fib, N-Queens, UTS) and their serial splits.

Each program has three tiers, as the dynamic benchmark uses them:

* a jitted leaf (``nogil``, cached) that does a whole subproblem serially: the serial
  program is the leaf called on the root;
* :func:`expand`-style helpers in plain Python that unfold the top levels of the
  recursion into the subproblems a static split hands out (the process pool's chunks);
* the one-level step (:func:`fib_children`, :func:`queens_children`,
  :func:`uts_children`) that the recursive task versions spawn from.

UTS walks a geometric tree: the number of children of a node is geometric with mean
``b0`` (``P(k) = p (1 - p)^k``, ``p = 1 / (1 + b0)``) below depth ``max_depth``, and the
id of child ``i`` is splitmix64 of its parent's id and ``i``. The tree is a pure
function of the root's id, so every run walks the same nodes and the count is a check.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


@numba.njit(nogil=True)  # no cache: numba's cache cannot reload self-recursion
def fib(n: int) -> int:
    """fib(n) by plain doubly recursive calls (fib(0) = 0, fib(1) = 1)."""
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def fib_children(n: int) -> tuple[int, int]:
    """The two subproblems of fib(n), n >= 2."""
    return n - 1, n - 2


def fib_split(n: int, cutoff: int) -> list[int]:
    """The leaves of fib(n) when every n > cutoff is split: fib(n) = sum of fib(leaf)."""
    if n <= cutoff or n < 2:
        return [n]
    return fib_split(n - 1, cutoff) + fib_split(n - 2, cutoff)


@numba.njit(nogil=True)  # no cache: numba's cache cannot reload self-recursion
def queens(n: int, cols: int, diag1: int, diag2: int) -> int:
    """Solutions of n-queens that extend the placed rows: ``cols`` marks used columns,
    ``diag1`` / ``diag2`` the diagonals attacked on the next row (bit masks)."""
    full = (1 << n) - 1
    if cols == full:
        return 1
    count = 0
    free = full & ~(cols | diag1 | diag2)
    while free:
        bit = free & -free
        free ^= bit
        count += queens(n, cols | bit, ((diag1 | bit) << 1) & full, (diag2 | bit) >> 1)
    return count


def queens_children(n: int, cols: int, diag1: int, diag2: int) -> list[tuple[int, int, int, int]]:
    """The states one row further, one per safe column of the next row."""
    full = (1 << n) - 1
    free = full & ~(cols | diag1 | diag2)
    out = []
    while free:
        bit = free & -free
        free ^= bit
        out.append((n, cols | bit, ((diag1 | bit) << 1) & full, (diag2 | bit) >> 1))
    return out


def queens_split(n: int, depth: int) -> list[tuple[int, int, int, int]]:
    """The partial boards of ``depth`` rows (every queen safe): N-Queens(n) is the sum
    of :func:`queens` over them."""
    level = [(n, 0, 0, 0)]
    for _ in range(depth):
        level = [child for state in level for child in queens_children(*state)]
    return level


@numba.njit(nogil=True, cache=True)
def splitmix64(x: np.uint64) -> np.uint64:
    """One splitmix64 step: a well-mixed 64-bit hash of ``x``."""
    z = np.uint64(x) + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(nogil=True, cache=True)
def uts_child_id(parent: np.uint64, i: int) -> np.uint64:
    """The id of child ``i`` of node ``parent``."""
    return splitmix64(np.uint64(parent) ^ splitmix64(np.uint64(i + 1)))


@numba.njit(nogil=True, cache=True)
def uts_degree(node: np.uint64, depth: int, b0: float, max_depth: int) -> int:
    """How many children ``node`` (at ``depth``) has: geometric with mean ``b0``."""
    if depth >= max_depth:
        return 0
    u = (float(splitmix64(node) >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
    return int(math.log(u) / math.log(b0 / (1.0 + b0)))


@numba.njit(nogil=True)  # no cache: numba's cache cannot reload self-recursion
def uts(node: np.uint64, depth: int, b0: float, max_depth: int) -> int:
    """The number of nodes in the subtree of ``node`` (itself included)."""
    count = 1
    for i in range(uts_degree(node, depth, b0, max_depth)):
        count += uts(np.uint64(uts_child_id(node, i)), depth + 1, b0, max_depth)
    return count


def uts_children(node: int, depth: int, b0: float, max_depth: int) -> list[tuple]:
    """The (node, depth, b0, max_depth) of each child of ``node``."""
    degree = uts_degree(np.uint64(node), depth, b0, max_depth)
    return [
        (int(uts_child_id(np.uint64(node), i)), depth + 1, b0, max_depth) for i in range(degree)
    ]


def uts_split(root: int, b0: float, max_depth: int, depth: int) -> tuple[int, list[tuple]]:
    """The subtrees ``depth`` levels below ``root``, and the nodes above them: the tree's
    size is that count plus the sum of :func:`uts` over the subtrees."""
    above, level = 0, [(root, 0, b0, max_depth)]
    for _ in range(depth):
        above += len(level)
        level = [child for state in level for child in uts_children(*state)]
    return above, level


def warm() -> None:
    """Compile (or load from numba's cache) every leaf, so no timing counts it."""
    fib(10)
    queens(6, 0, 0, 0)
    uts(np.uint64(1), 0, 2.0, 3)
    uts_children(1, 0, 2.0, 3)
