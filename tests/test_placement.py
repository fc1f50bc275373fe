"""Tests of placement (taskgraph.dsl.placement): rank grids, tile owners, follow the inputs.

All pure functions: numbers in, ranks out.
"""

from __future__ import annotations

import pytest

from taskgraph.dsl.placement import block_cyclic_owner, follow_inputs, grid_shape, pick_rank

pytestmark = pytest.mark.timeout(30)


# -- grid_shape ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, grid",
    [
        (1, (1, 1)),
        (2, (1, 2)),
        (3, (1, 3)),
        (4, (2, 2)),
        (5, (1, 5)),
        (6, (2, 3)),
        (7, (1, 7)),
        (8, (2, 4)),
        (9, (3, 3)),
        (10, (2, 5)),
        (11, (1, 11)),
        (12, (3, 4)),
    ],
)
def test_grid_shape_is_the_most_square_grid(n, grid):
    p, q = grid_shape(n)
    assert (p, q) == grid
    assert p <= q and p * q == n
    # no other factorisation is more square
    assert all(q - p <= b - a for a in range(1, n + 1) for b in [n // a] if a * b == n and a <= b)


@pytest.mark.parametrize("n", [0, -3])
def test_grid_shape_needs_a_rank(n):
    with pytest.raises(ValueError, match="at least one rank"):
        grid_shape(n)


# -- block_cyclic_owner -----------------------------------------------------------------


def test_block_cyclic_owner_on_a_2x3_grid():
    """Six ranks on a P=2 x Q=3 grid, tiles 4 x 7::

       j: 0 1 2 3 4 5 6
    i=0   0 1 2 0 1 2 0
    i=1   3 4 5 3 4 5 3
    i=2   0 1 2 0 1 2 0
    i=3   3 4 5 3 4 5 3
    """
    drawn = """
        0 1 2 0 1 2 0
        3 4 5 3 4 5 3
        0 1 2 0 1 2 0
        3 4 5 3 4 5 3
    """
    expected = [[int(x) for x in row.split()] for row in drawn.strip().splitlines()]
    owners = [[block_cyclic_owner(i, j, (2, 3)) for j in range(7)] for i in range(4)]
    assert owners == expected


def test_block_cyclic_owner_on_one_row_and_one_column():
    """1 x 2: by column (0 1 0 1 ...); 2 x 1: by row; 1 x 1: everything on rank 0."""
    assert [block_cyclic_owner(5, j, (1, 2)) for j in range(4)] == [0, 1, 0, 1]
    assert [block_cyclic_owner(i, 5, (2, 1)) for i in range(4)] == [0, 1, 0, 1]
    assert {block_cyclic_owner(i, j, (1, 1)) for i in range(3) for j in range(3)} == {0}


# -- pick_rank ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where, load, rank, why",
    [
        ({}, [0, 0, 0], 0, "no inputs, all idle: lowest rank"),
        ({}, [2, 1, 1], 1, "no inputs: least loaded, then lowest"),
        ({2: 64.0}, [0, 0, 9], 2, "the only holder, however loaded"),
        ({0: 8.0, 2: 9.0}, [0, 0, 5], 2, "more bytes beat less load"),
        ({0: 8.0, 2: 8.0}, [3, 0, 1], 2, "tie on bytes: least loaded of the tied"),
        ({2: 8.0, 0: 8.0}, [1, 0, 1], 0, "tie on bytes and load: lowest rank"),
    ],
)
def test_pick_rank(where, load, rank, why):
    assert pick_rank(where, load) == rank, why


# -- follow_inputs -----------------------------------------------------------------------


def test_independent_tasks_go_round_robin():
    """Seven tasks without inputs on three ranks::

    t:    0 1 2 3 4 5 6
    rank: 0 1 2 0 1 2 0
    """
    assert follow_inputs([{}] * 7, 3) == [0, 1, 2, 0, 1, 2, 0]


def test_a_chain_stays_on_one_rank():
    """t0 -> t1 -> t2 -> t3, each reading its predecessor's value (on rank 0), and
    an independent t4 after them::

        t:    0 -> 1 -> 2 -> 3     4
        rank: 0    0    0    0     1   (rank 1 idle until then)
    """
    chain = [{}, {0: 64.0}, {0: 64.0}, {0: 64.0}, {}]
    assert follow_inputs(chain, 2) == [0, 0, 0, 0, 1]


def test_ties_go_to_the_least_loaded_then_the_lowest_rank():
    """Three ranks; four independent tasks first (loads 2, 1, 1), then:

    t4 reads 8 B on rank 0 and 8 B on rank 1  -> rank 1 (load 1 < 2)
    t5 reads 8 B on rank 1 and 8 B on rank 2  -> rank 2 (loads 2, 1)
    t6 reads 8 B on rank 1 and 8 B on rank 2  -> rank 1 (loads 2, 2: lowest)
    """
    inputs = [{}, {}, {}, {}, {0: 8.0, 1: 8.0}, {1: 8.0, 2: 8.0}, {2: 8.0, 1: 8.0}]
    assert follow_inputs(inputs, 3) == [0, 1, 2, 0, 1, 2, 1]
