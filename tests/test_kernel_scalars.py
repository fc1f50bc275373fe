"""Scalar arguments of kernels: ``tg.kernel(modes="rw,scalar")`` (taskgraph.dsl.kernel).

A scalar (declared ``scalar``, ``int`` or ``float``) is passed to the kernel as it is,
a constant of the task; its type, not its value, is part of the signature checked
once. A scalar where data is expected, and the reverse, is a GraphError naming the
task before anything runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.tasks import Ref

pytestmark = pytest.mark.timeout(60)

flops_seen: list[dict] = []


def _flops(**sizes):
    flops_seen.append(sizes)
    return 2.0 * sizes["m"] * sizes["n"]


@tg.kernel(modes="r,rw,float", dims="mn,mn,", flops=_flops)
def axpy(x, y, alpha):
    y += alpha * x


@tg.kernel(modes="rw,int", dims="n,")
def shift(y, k):
    y[:] = np.roll(y, k)


@tg.kernel(modes="rw,scalar")
def affine(y, ab):
    a, b = ab
    y *= a
    y += b


def tiles(n=4, tile=2, dtype=np.float64):
    return tg.TiledMatrix.zeros((n, n), tile, dtype, grid=(1, 1), name="A")


def test_modes_and_dims_declare_scalars():
    assert axpy.modes == (tg.Mode.R, tg.Mode.RW, None)
    assert axpy.scalars == ("", "", "float") and axpy.dims == ("mn", "mn", "")
    assert repr(axpy) == "<kernel axpy(r,rw,float)>"
    k = tg.kernel(lambda y, a: None, modes=("rw", "scalar"))
    assert k.modes == (tg.Mode.RW, None)
    with pytest.raises(ValueError, match=r"argument 2 is an int: its dims entry must be ''"):
        tg.kernel(lambda y, k: None, modes="rw,int", dims="n,n")
    with pytest.raises(ValueError, match="unknown access mode 'number'"):
        tg.kernel(lambda y, k: None, modes="rw,number")


def test_a_scalar_is_a_constant_of_the_task_and_flops_see_only_dims():
    A = tiles()
    flops_seen.clear()
    with tg.Graph() as g:
        axpy(A[0, 0].r, A[1, 1].rw, 2.5)
        axpy(A[0, 1].r, A[1, 1].rw, 0.5)
    t = g.tasks[0]
    assert t.args[2] == 2.5 and t.args[2].__class__ is float
    assert [a.__class__ for a in t.args[:2]] == [Ref, Ref]
    assert g.tasks[1].args[2] == 0.5 and g.tasks[1].preds == [0]
    assert flops_seen == [{"m": 2, "n": 2}]  # once per signature: the value is not in it
    assert t.cost == 8.0
    assert "2.5" in g.label(0)


def test_the_type_is_checked_not_the_value():
    y = np.zeros(4)
    with tg.Graph() as g:
        shift(tg.rw(y), 1)
        shift(tg.rw(y), np.int64(2))
        shift(tg.rw(y), True)  # a bool is an int
        with pytest.raises(
            tg.GraphError, match=r"task shift\(.*argument 2 of shift must be an int"
        ):
            shift(tg.rw(y), 1.5)
        axpy(tg.r(np.ones((2, 2))), tg.rw(np.zeros((2, 2))), 3)  # an int is a fine float
        axpy(tg.r(np.ones((2, 2))), tg.rw(np.zeros((2, 2))), np.float32(3))
        affine(tg.rw(y), (2.0, 1))  # a tuple: only for "scalar"
        affine(tg.rw(y), 2.0)
    assert g.ntasks == 7
    with tg.Graph(), pytest.raises(tg.GraphError, match="must be an int, not a tuple of int"):
        shift(tg.rw(y), (1, 2))


def test_a_scalar_where_data_is_expected_names_the_task():
    A = tiles()
    with tg.Graph() as g:
        with pytest.raises(tg.GraphError, match=r"task axpy\(2\.0, .*argument 1 of axpy is data"):
            axpy(2.0, A[0, 0].rw, 1.0)
        with pytest.raises(tg.GraphError, match=r"tg\.rw\(x\), A\[i, j\]\.rw"):
            axpy(A[0, 0].r, 3, 1.0)
    assert g.ntasks == 0


def test_data_where_a_scalar_is_declared_names_the_task():
    A = tiles()
    with tg.Graph() as g:
        with pytest.raises(
            tg.GraphError,
            match=r"task axpy\(A\[0,0\], A\[1,1\], A\[0,1\]\): .*"
            r"argument 3 of axpy is a float, but a marked array",
        ):
            axpy(A[0, 0].r, A[1, 1].rw, A[0, 1].r)
        with pytest.raises(tg.GraphError, match=r"argument 2 of shift is an int, but a marked"):
            shift(tg.rw(np.zeros(3)), tg.r(np.zeros(3)))
        with pytest.raises(tg.GraphError, match=r"argument 2 must be a scalar \(int\), not 'a'"):
            shift(tg.rw(np.zeros(3)), "a")
    assert g.ntasks == 0


def test_kernel_check_takes_none_for_a_scalar():
    f8 = np.dtype(np.float64)
    assert axpy.check([tg.Mode.R, tg.Mode.RW, None], [(2, 3), (2, 3), ()], [f8, f8, float]) == ""
    wrong = axpy.check([tg.Mode.R, tg.Mode.RW, None], [(2, 3), (2, 3), ()], [f8, f8, complex])
    assert wrong == "argument 3 of axpy must be a float, not a complex"
    assert "takes 3 arguments, got 2" in axpy.check([tg.Mode.R, None], [(1, 1), ()], [f8, int])


def test_outside_a_graph_a_kernel_with_a_scalar_just_runs():
    y = np.ones(3)
    axpy(np.ones(3), y, 2.0)
    assert y.tolist() == [3.0, 3.0, 3.0]


def test_scalars_reach_the_kernel_when_the_graph_runs():
    A = tiles(dtype=np.float64)
    for t in A.tiles.values():
        t[:] = 1.0
    y = np.arange(5.0)
    with tg.Graph() as g:
        axpy(A[0, 0].r, A[1, 1].rw, 2.5)
        affine(A[0, 1].rw, (3.0, -1.0))
        shift(tg.rw(y), np.int64(2))
    tg.current_cluster().run(g).wait()
    assert np.all(A.tiles[1, 1] == 3.5) and np.all(A.tiles[0, 1] == 2.0)
    assert y.tolist() == [3.0, 4.0, 0.0, 1.0, 2.0]
