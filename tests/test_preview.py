"""Tile distributions ("2d", "1d", "random") and ``graph.preview``: pure, no MPI.

Matrices for N ranks are built with a fake cluster (``rank=0, size=N``), as in
test_plan.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.placement import distribution_grid, random_owners
from taskgraph.linalg import cholesky
from taskgraph.plan import make_plan

pytestmark = pytest.mark.timeout(30)


def matrix(n, tile, nranks, **kw) -> tg.TiledMatrix:
    cluster = types.SimpleNamespace(rank=0, size=nranks)
    return tg.TiledMatrix(n, tile, cluster=cluster, lower=True, name="A", **kw)


def owners(A) -> np.ndarray:
    out = np.full((A.mt, A.nt), -1)
    for i, j in A.indices():
        out[i, j] = A.owner(i, j)
    return out


def test_distributions_by_hand():
    """4 ranks, 4x4 tiles (lower):  2d = 2x2 grid        1d = columns dealt 0 1 2 3
    0 . . .                          0 . . .
    2 3 . .                          0 1 . .
    0 1 0 .                          0 1 2 .
    2 3 2 3                          0 1 2 3"""
    two = owners(matrix(8, 2, 4))
    one = owners(matrix(8, 2, 4, distribution="1d"))
    assert two[3].tolist() == [2, 3, 2, 3] and two[2, :3].tolist() == [0, 1, 0]
    assert one[3].tolist() == [0, 1, 2, 3] and one[:, 0].tolist() == [0, 0, 0, 0]
    assert distribution_grid("2d", 6) == (2, 3) and distribution_grid("1d", 6) == (1, 6)


def test_random_distribution_is_seeded_and_balanced():
    a = random_owners(6, 6, 4, seed=1)
    assert a == random_owners(6, 6, 4, seed=1)
    assert a != random_owners(6, 6, 4, seed=2)
    counts = np.bincount(np.ravel(a), minlength=4)
    assert counts.max() - counts.min() <= 1
    A = matrix(12, 2, 4, distribution="random", distribution_seed=1)
    assert A.owner(5, 3) == a[5][3]
    assert "random owners" in repr(A)
    # the spec carries the distribution, so engines make the same owners
    B = tg.TiledMatrix(
        **{k: v for k, v in A.spec().items() if k != "uid"},
        cluster=types.SimpleNamespace(rank=0, size=4),
    )
    assert (owners(B) == owners(A)).all()


def test_unknown_distribution_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown distribution 'cyclic'.*2d, 1d, random"):
        matrix(8, 2, 2, distribution="cyclic")


def test_the_plan_follows_the_distribution():
    for dist in ("2d", "1d", "random"):
        A = matrix(16, 2, 4, distribution=dist)
        plan = make_plan(cholesky(A), 4)
        for t in plan.graph.tasks:
            d, _ = t.writes[0]
            tile = plan.graph.data[d].tile
            assert plan.placement[t.id] == A.owner(tile.i, tile.j)
    # 1-D sends every panel tile to every column owner: more messages than 2-D
    traffic = {
        d: len(make_plan(cholesky(matrix(32, 2, 4, distribution=d)), 4).messages)
        for d in ("2d", "1d")
    }
    assert traffic["1d"] > traffic["2d"]


def test_preview_at_another_rank_count_matches_a_real_plan():
    g1 = cholesky(matrix(16, 2, 1))  # made for one rank
    p = g1.preview(ranks=4)
    real = make_plan(cholesky(matrix(16, 2, 4)), 4)  # made for four
    assert p.tasks == real.tasks_per_rank()
    assert p.plan.placement == real.placement
    assert (p.bytes == real.traffic()).all()
    assert p.total_messages == len(real.messages) > 0
    assert p.messages.trace() == 0 and sum(p.tasks) == g1.ntasks
    assert sum(p.flops) == pytest.approx(sum(g1.costs()))


def test_preview_text_html_and_drawing():
    g = cholesky(matrix(8, 2, 2))
    p = g.preview()
    assert p.nranks == 2  # the matrices' own rank count by default
    text = str(p)
    assert "on 2 ranks: 20 tasks" in text and "rank 1:" in text
    page = p._repr_html_()
    assert page.count("<circle") == 20  # every task drawn
    assert page.count('stroke="#d33"') == sum(
        1
        for t, succ in enumerate(g.successors())
        for s in succ
        if p.plan.placement[t] != p.plan.placement[s]
    )
    assert p.summary()["total_bytes"] == p.total_bytes > 0
    with pytest.raises(ValueError, match="at least one rank"):
        g.preview(ranks=0)


def test_preview_of_futures_and_of_an_empty_graph():
    @tg.task
    def f(x):
        return x + 1

    with tg.Graph("futures") as g:
        xs = [f(i) for i in range(8)]
        f(xs[0])
    p = g.preview(ranks=4)
    assert max(p.tasks) - min(p.tasks) <= 2  # independent tasks spread round-robin
    assert sum(p.tasks) == 9
    empty = tg.Graph("empty").preview(ranks=2)
    assert sum(empty.tasks) == 0 and "empty graph" in empty._repr_html_()
