"""Tests of the graph DSL (taskgraph.dsl.graph): edges, versions, futures, checks.

Every graph here is small and drawn in its test's docstring. No MPI: matrices are
built for a fake one-rank cluster, and nothing runs.
"""

from __future__ import annotations

import types

import networkx as nx
import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.tasks import INITIAL
from taskgraph.linalg import cholesky

pytestmark = pytest.mark.timeout(30)


# -- helpers --------------------------------------------------------------------------


def matrix(shape=4, tile=2, dtype=np.float64, name="A", **kw) -> tg.TiledMatrix:
    """A small matrix on one (fake) rank: shape 4, tile 2 gives 2 x 2 tiles."""
    return tg.TiledMatrix(
        shape, tile, dtype, name=name, cluster=types.SimpleNamespace(rank=0, size=1), **kw
    )


def reads(g: tg.Graph, tid: int) -> list[tuple[str, int]]:
    """The versions a task reads, as (data label, producer)."""
    return [(g.data[d].label(), prod) for d, prod in g.tasks[tid].reads]


def writes(g: tg.Graph, tid: int) -> list[tuple[str, int]]:
    """The versions a task overwrites, as (data label, previous producer)."""
    return [(g.data[d].label(), prev) for d, prev in g.tasks[tid].writes]


@tg.kernel(modes="r,rw", dims="mn,mn")
def axpy(x, y):
    y += 2.0 * x


@tg.kernel(modes="rw")
def scale(x):
    x *= 2.0


@tg.kernel(modes="r")
def show(x):
    pass


@tg.kernel(modes="w")
def fill(x):
    x[...] = 1.0


@tg.task
def load(x):
    return x


@tg.task
def add(x, y=0):
    return x + y


# -- edges from marks ------------------------------------------------------------------


def test_raw_war_waw_edges_and_versions():
    """One tile X, six tasks in program order::

    t0 scale(X.rw)                writes X v0
       |         \\         RAW
    t1 show(X.r)  t2 show(X.r)    both read v0: no edge between them
       |         /          WAR
    t3 fill(X.w)                  waits for both readers, not for t0 again
       |                    WAW
    t4 fill(X.w)
       |                    RAW
    t5 show(X.r)                  waits only for the last writer t4
    """
    A = matrix()
    X = A[0, 0]
    with tg.Graph() as g:
        scale(X.rw)
        show(X.r)
        show(X.r)
        fill(X.w)
        fill(X.w)
        show(X.r)
    assert [t.preds for t in g.tasks] == [[], [0], [0], [1, 2], [3], [4]]
    assert g.nedges == 6
    # versions: (data, producer) read, (data, previous producer) overwritten
    assert reads(g, 0) == [("A[0,0]", INITIAL)] and writes(g, 0) == [("A[0,0]", INITIAL)]
    assert reads(g, 1) == reads(g, 2) == [("A[0,0]", 0)]
    assert writes(g, 1) == writes(g, 2) == []
    assert reads(g, 3) == [] and writes(g, 3) == [("A[0,0]", 0)]  # .w reads nothing
    assert writes(g, 4) == [("A[0,0]", 3)]
    assert reads(g, 5) == [("A[0,0]", 4)]


def test_first_access_has_no_edge_and_tiles_are_independent():
    """Two tiles, never shared::

    t0 scale(A00)    t1 scale(A10)
       |                |
    t2 axpy(A00 -> A01) t3 fill(A11)
    """
    A = matrix()
    with tg.Graph() as g:
        scale(A[0, 0].rw)
        scale(A[1, 0].rw)
        axpy(A[0, 0].r, A[0, 1].rw)
        fill(A[1, 1].w)
    assert [t.preds for t in g.tasks] == [[], [], [0], []]
    assert reads(g, 2) == [("A[0,0]", 0), ("A[0,1]", INITIAL)]
    assert writes(g, 2) == [("A[0,1]", INITIAL)]


def test_many_concurrent_readers_then_one_writer():
    """Readers of one version fan out; the next writer fans in::

               t0 scale(X)
           /   |   |   |   \\
          t1  t2  t3  t4  t5     show(X.r)
           \\   |   |   |   /
               t6 scale(X)      .rw: also reads t0's version (RAW on t0)
    """
    A = matrix()
    X = A[1, 1]
    with tg.Graph() as g:
        scale(X.rw)
        for _ in range(5):
            show(X.r)
        scale(X.rw)
    assert [g.tasks[t].preds for t in range(1, 6)] == [[0]] * 5
    assert g.tasks[6].preds == [0, 1, 2, 3, 4, 5]
    assert reads(g, 6) == [("A[1,1]", 0)]  # rw reads the version the readers saw


def test_reading_one_tile_twice_is_one_read():
    """gemm(X.r, X.r, Y.rw) reads X once; X's writer is one edge."""
    from taskgraph.kernels import gemm

    A = matrix()
    with tg.Graph() as g:
        scale(A[1, 0].rw)
        gemm(A[1, 0].r, A[1, 0].r, A[1, 1].rw)
    assert g.tasks[1].preds == [0]
    assert reads(g, 1) == [("A[1,0]", 0), ("A[1,1]", INITIAL)]


# -- futures -----------------------------------------------------------------------------


def test_task_calls_inside_a_graph_return_futures_and_passing_them_adds_edges():
    """::

    a = load(1)   b = load(2)
          \\         /
        c = add(a, y=b)
    """
    with tg.Graph() as g:
        a = load(1)
        b = load(2)
        c = add(a, y=b)
    assert all(isinstance(f, tg.Future) for f in (a, b, c))
    assert (a.id, b.id, c.id) == (0, 1, 2)
    assert [t.preds for t in g.tasks] == [[], [], [0, 1]]
    assert g.tasks[0].args == (1,)  # constants are kept as they are
    assert reads(g, 2) == [("value of task 0", 0), ("value of task 1", 1)]
    # every call writes its own value, new data
    assert writes(g, 2) == [("value of task 2", INITIAL)]
    assert not c.done()


def test_positional_futures_and_constants_the_quick_way_record_the_same_edges():
    """Calls with only futures and constants take a quicker path; its edges and
    versions are those of the general path (keyword calls), duplicates included::

    a = load(1)   b = load(2)
       |  \\        /  |
       |   pair(b, a, a, 'x')     the same future twice is one read
       |   pair(a, y=b)           the general path, for comparison
    """

    @tg.task
    def pair(*xs, y=None):
        return xs

    with tg.Graph() as g:
        a = load(1)
        b = load(2)
        pair(b, a, a, "x", None, 2.5)
        pair(a, y=b)
    assert g.tasks[2].preds == g.tasks[3].preds == [0, 1]
    assert reads(g, 2) == [("value of task 1", 1), ("value of task 0", 0)]
    assert writes(g, 2) == [("value of task 2", INITIAL)]
    assert [type(x).__name__ for x in g.tasks[2].args] == ["Ref"] * 3 + [
        "str",
        "NoneType",
        "float",
    ]
    assert g.to_networkx().number_of_edges() == 4


def test_tiles_as_task_arguments_bare_tile_is_a_read():
    """A bare tile is read; a marked one is used as marked::

    t0 inspect(A00, A10.rw)     reads A00, reads and writes A10
         |   (WAR on A00)
    t1 scale(A00.rw)
    """

    @tg.task
    def inspect(x, y):
        return None

    A = matrix()
    with tg.Graph() as g:
        inspect(A[0, 0], A[1, 0].rw)
        scale(A[0, 0].rw)
    assert reads(g, 0) == [("A[0,0]", INITIAL), ("A[1,0]", INITIAL)]
    assert writes(g, 0) == [("A[1,0]", INITIAL), ("value of task 0", INITIAL)]
    assert g.tasks[1].preds == [0]


def test_a_task_called_outside_a_graph_just_calls_the_function():
    assert add(1, y=2) == 3
    assert load("x") == "x"


def test_result_before_the_run_raises_naming_the_task():
    with tg.Graph() as g:
        a = load(1)
        c = add(a, y=5)
    with pytest.raises(tg.GraphError, match=r"add#1\(<task 0>, y=5\) has not run"):
        c.result()
    assert g.label(c.id) == "add#1(<task 0>, y=5)"


def test_a_future_of_another_graph_is_rejected():
    with tg.Graph("first"):
        a = load(1)
    with tg.Graph("second") as g2:
        with pytest.raises(tg.GraphError, match="belongs to graph 'first'"):
            add(a)
    assert g2.ntasks == 0


# -- kernels: declared modes, dims and dtypes are checked --------------------------------


def test_wrong_mark_names_the_task_and_the_mark_to_use():
    A = matrix()
    with tg.Graph() as g:
        with pytest.raises(tg.GraphError) as err:
            axpy(A[0, 0].r, A[1, 0].r)
        assert "axpy(A[0,0], A[1,0])" in str(err.value)
        assert "argument 2" in str(err.value) and "mark it .rw" in str(err.value)
        with pytest.raises(tg.GraphError, match=r"argument 1 is marked \.rw .* mark it \.r$"):
            axpy(A[0, 0].rw, A[1, 0].rw)
    assert g.ntasks == 0  # a rejected call records nothing


def test_wrong_number_of_tiles():
    A = matrix()
    with tg.Graph(), pytest.raises(tg.GraphError, match="axpy takes 2 tiles, got 1"):
        axpy(A[0, 0].rw)


def test_shapes_that_do_not_fit_dims_name_the_task_and_dimension():
    """A 3 x 3 matrix in tiles of 2::

    A00 (2x2)  A01 (2x1)
    A10 (1x2)  A11 (1x1)
    """
    A = matrix(3)
    with tg.Graph() as g:
        with pytest.raises(tg.GraphError) as err:
            axpy(A[0, 0].r, A[1, 0].rw)
        assert "task axpy(A[0,0], A[1,0])" in str(err.value)
        assert "dimension 'm'" in str(err.value) and "(1, 2)" in str(err.value)
        with pytest.raises(tg.GraphError, match="dimension 'n'"):
            axpy(A[1, 0].r, A[1, 1].rw)  # (1, 2) then (1, 1)
    assert g.ntasks == 0


def test_mixed_dtypes_are_rejected():
    A, B = matrix(name="A"), matrix(dtype=np.float32, name="B")
    with (
        tg.Graph(),
        pytest.raises(
            tg.GraphError, match=r"axpy\(A\[0,0\], B\[0,0\]\): axpy needs tiles of one dtype"
        ),
    ):
        axpy(A[0, 0].r, B[0, 0].rw)


def test_a_dtype_the_kernel_does_not_allow_is_rejected():
    from taskgraph.kernels import potrf

    only64 = tg.kernel(lambda x: None, name="only64", modes="rw", dtypes=["float64"])
    B = matrix(dtype=np.float32, name="B")
    C = matrix(dtype=np.complex128, name="C")
    with tg.Graph():
        with pytest.raises(tg.GraphError, match=r"only64\(B\[0,0\]\).*float64, not float32"):
            only64(B[0, 0].rw)
        with pytest.raises(tg.GraphError, match=r"potrf\(C\[0,0\]\).*not complex128"):
            potrf(C[0, 0].rw)
        only64(matrix()[0, 0].rw)  # float64 is fine


def test_a_bare_tile_given_to_a_kernel_is_rejected():
    A = matrix()
    expected = r"argument 1 \(A\[0,0\]\) is not a marked tile; mark it: A\[0,0\]\.r"
    with tg.Graph(), pytest.raises(tg.GraphError, match=expected):
        axpy(A[0, 0], A[1, 0].rw)


def test_a_kernel_on_tiles_outside_a_graph_is_rejected():
    A = matrix()
    with pytest.raises(tg.GraphError, match="axpy.*outside `with tg.Graph"):
        axpy(A[0, 0].r, A[1, 0].rw)
    with pytest.raises(tg.GraphError, match="scale.*outside"):
        scale(A[0, 0])  # a bare tile too


def test_one_tile_written_and_used_again_by_the_same_task_is_rejected():
    from taskgraph.kernels import trsm

    A = matrix()
    with tg.Graph() as g:
        with pytest.raises(tg.GraphError, match=r"task trsm\(A\[1,1\], A\[1,1\]\): A\[1,1\] is bo"):
            trsm(A[1, 1].r, A[1, 1].rw)
        with pytest.raises(tg.GraphError, match=r"A\[0,0\] is both written and used again"):
            add(A[0, 0].rw, y=A[0, 0])  # through a task function and a keyword
    assert g.ntasks == 0


def test_errors_in_task_function_calls_name_the_call():
    A = matrix()
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"task add#0\(A\[0,0\], y=A\[0,0\]\)"):
        add(A[0, 0].rw, y=A[0, 0])


def test_a_kernel_on_numpy_arrays_outside_a_graph_runs():
    x, y = np.ones((2, 3)), np.zeros((2, 3))
    axpy(x, y)
    np.testing.assert_array_equal(y, 2.0)


# -- tiles out of range ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ij, message",
    [
        ((2, 0), r"tile A\[2,0\] is out of range: A has 2 x 2 tiles"),
        ((0, 2), r"tile A\[0,2\] is out of range"),
        ((-1, 0), r"tile A\[-1,0\] is out of range"),
        ((0, 1), r"tile A\[0,1\] is above the diagonal"),
    ],
)
def test_tiles_out_of_range_or_above_the_diagonal(ij, message):
    """A lower 2 x 2-tile matrix stores::

    A00  .
    A10 A11
    """
    A = matrix(lower=True)
    with pytest.raises(tg.GraphError, match=message):
        A[ij]


def test_a_full_matrix_has_tiles_above_the_diagonal():
    assert repr(matrix()[0, 1]) == "A[0,1]"


def test_indexing_a_tile_again_gives_the_same_handle_and_marks():
    """Recording reuses handles; numpy integers and a second index find the same tile."""
    A = matrix()
    assert A[1, 0] is A[1, 0] is A[np.int64(1), np.int32(0)]
    assert A[1, 0].rw is A[1, 0].rw and A[1, 0].r.mode is tg.Mode.R
    with pytest.raises(tg.GraphError, match="index tiles of A as A"):
        A[[1, 0, 0]]


def test_tasks_that_use_a_tile_alike_share_one_ref():
    """Two readers of A00 hold the same Ref: a big graph keeps one per (tile, mode)."""
    A = matrix()
    with tg.Graph() as g:
        show(A[0, 0].r)
        show(A[0, 0].r)
        scale(A[0, 0].rw)
    first, second, third = (t.args[0] for t in g.tasks)
    assert first is second and first.mode == 1
    assert third is not first and third.mode == 3 and third.data == first.data


def test_a_recorded_graph_lets_its_matrix_go_without_the_cycle_collector():
    """The tile handles cached while recording refer back to their matrix; the graph
    drops them when recording ends, so deleting graph and matrix frees the matrix
    by reference counting alone (its engines' tiles are freed when it goes)."""
    import gc
    import weakref

    A = matrix()
    gone = weakref.ref(A)
    was = gc.isenabled()
    gc.disable()
    try:
        with tg.Graph() as g:
            axpy(A[0, 0].r, A[1, 0].rw)
        assert A._handles == {}
        del g, A
        assert gone() is None
    finally:
        if was:
            gc.enable()


# -- explicit dependencies and cycles -----------------------------------------------------


def test_explicit_dependency_adds_one_edge():
    """Two independent tasks, then an explicit edge by ref and by id::

    t0 load(0)  t1 load(1)        t0 ----> t1  (once, however often it is added)
    """
    with tg.Graph() as g:
        a = load(0)
        b = load(1)
    assert g.nedges == 0
    g.add_dependency(a, b)
    g.add_dependency(0, 1)
    assert g.tasks[1].preds == [0]
    assert g.nedges == 1


def test_an_explicit_dependency_may_point_backwards_in_program_order():
    """t1 must run before t0::   t1 load(1) ----> t0 load(0)"""
    with tg.Graph() as g:
        load(0)
        load(1)
    g.add_dependency(1, 0)
    g.check()
    assert g.order() == [1, 0]
    assert g.critical_path() == (2.0, [1, 0])


def test_self_dependency_and_unknown_tasks_are_rejected():
    with tg.Graph() as g:
        a = load(0)
    with pytest.raises(tg.GraphError, match=r"load#0\(0\) cannot depend on itself"):
        g.add_dependency(a, a)
    with pytest.raises(tg.GraphError, match="has no task 5"):
        g.add_dependency(a, 5)
    assert g.nedges == 0


def test_a_task_of_another_graph_is_rejected_as_a_dependency():
    with tg.Graph("first"):
        a = load(0)
    with tg.Graph("second") as g:
        load(1)
        b = load(2)
    with pytest.raises(tg.GraphError, match="'first'"):
        g.add_dependency(a, b)
    assert g.nedges == 0


def test_a_cycle_through_explicit_dependencies_names_its_tasks():
    """A chain a -> b -> c, then c -> a by hand; d hangs below the cycle::

    a --> b --> c --> d
    ^           |
    +-----------+
    """
    with tg.Graph("loop") as g:
        a = load(1)
        b = add(a)
        c = add(b)
        add(c)
    g.add_dependency(c, a)
    with pytest.raises(tg.GraphError) as err:
        g.check()
    message = str(err.value)
    assert message.startswith("graph 'loop' has a cycle: ")
    cycle = message.split(": ", 1)[1].split(" -> ")
    assert len(cycle) == 4 and cycle[0] == cycle[-1]  # a closed path of three tasks
    assert set(cycle) == {"load#0(1)", "add#1(<task 0>)", "add#2(<task 1>)"}
    assert "add#3" not in message  # stuck below the cycle, but not on it


# -- the graph is data -------------------------------------------------------------------


@pytest.mark.parametrize("nt", [1, 2, 3, 4, 5])
def test_cholesky_task_counts(nt):
    A = matrix(2 * nt, lower=True)
    g = cholesky(A)
    names = [t.name for t in g.tasks]
    assert names.count("potrf") == nt
    assert names.count("trsm") == names.count("syrk") == nt * (nt - 1) // 2
    assert names.count("gemm") == nt * (nt - 1) * (nt - 2) // 6
    assert g.ntasks == len(g) == len(names)


def test_cholesky_edges_on_three_tiles():
    """The tiled Cholesky graph for 3 x 3 tiles (k = 0, 1, 2)::

        0 potrf00
        |       \\
        1 trsm10  2 trsm20
        |     \\   /     |
        3 syrk11  5 gemm21  4 syrk22
        |          |         |
        6 potrf11  |         |
              \\    |         |
              7 trsm21       |
                    \\        |
                    8 syrk22
                       |
                    9 potrf22
    """
    g = cholesky(matrix(6, lower=True))
    assert [t.preds for t in g.tasks] == [
        [],
        [0],
        [0],
        [1],
        [2],
        [1, 2],
        [3],
        [5, 6],
        [4, 7],
        [8],
    ]
    assert g.nedges == 12
    assert g.label(5) == "gemm(A[2,0], A[1,0], A[2,1])"


def test_to_networkx_is_the_same_dag_with_attributes():
    g = cholesky(matrix(8, lower=True))  # 4 x 4 tiles of 2
    d = g.to_networkx()
    assert isinstance(d, nx.DiGraph) and nx.is_directed_acyclic_graph(d)
    assert d.number_of_nodes() == g.ntasks
    assert d.number_of_edges() == g.nedges
    assert set(d.edges) == {(p, t.id) for t in g.tasks for p in t.preds}
    assert d.nodes[0] == {"name": "potrf", "label": "potrf(A[0,0])", "cost": 8 / 3}
    assert d.nodes[g.ntasks - 1]["label"] == "potrf(A[3,3])"
    gemm_costs = {d.nodes[t]["cost"] for t in d if d.nodes[t]["name"] == "gemm"}
    assert gemm_costs == {2 * 2 * 2 * 2}  # 2 m n k with m = n = k = 2


def weighted_graph() -> tg.Graph:
    """Five tasks with declared costs::

        a(1)       b(5)
        |   \\      |
        c(2)  \\    |
        |      d(1)
        |     /
        e(3)

    bottom levels: e 3, c 5, d 4, a 1 + max(5, 4) = 6, b 5 + 4 = 9.
    The heaviest path starts at b, not at the first task: b, d, e (9).
    """

    @tg.task(cost=1)
    def a():
        return 1

    @tg.task(cost=5)
    def b():
        return 2

    @tg.task(cost=2)
    def c(x):
        return x

    @tg.task(cost=1)
    def d(x, y):
        return x + y

    @tg.task(cost=3)
    def e(x, y):
        return x + y

    with tg.Graph("weighted") as g:
        fa, fb = a(), b()
        e(c(fa), d(fa, fb))
    return g


def test_critical_path_and_bottom_levels_on_a_weighted_graph():
    g = weighted_graph()
    names = [t.name for t in g.tasks]
    assert names == ["a", "b", "c", "d", "e"]
    assert g.costs() == [1, 5, 2, 1, 3]
    assert g.bottom_levels() == [6, 9, 5, 4, 3]
    assert g.critical_path() == (9, [1, 3, 4])
    assert g.critical_path_length == 9


def test_critical_path_of_an_empty_graph():
    assert tg.Graph().critical_path() == (0.0, [])


def test_labels():
    """Kernels show their tiles; task functions their id and arguments."""
    A = matrix()
    with tg.Graph() as g:
        scale(A[1, 1].rw)
        a = load("x" * 100)
        add(a, y=A[0, 1])
        load(A[1, 0])
    assert g.label(0) == "scale(A[1,1])"
    assert g.label(1) == "load#1('" + "x" * 36 + "...)"  # long constants are cut at 40
    assert g.label(2) == "add#2(<task 1>, y=A[0,1])"
    assert g.label(3) == "load(A[1,0])"
    assert repr(a) == "<task 1: " + g.label(1) + ">"
    assert repr(g) == "<Graph 'graph': 4 tasks, 1 edges>"


def test_a_kernel_task_passed_as_a_value_is_rejected():
    A = matrix()
    with tg.Graph() as g:
        ref = axpy(A[0, 0].r, A[1, 0].rw)
        with pytest.raises(tg.GraphError, match="kernel task: it has no value"):
            add(ref, y=1)
    assert g.ntasks == 1


# -- timeouts and docstrings --------------------------------------------------------------


def test_a_task_and_a_kernel_carry_their_timeout():
    @tg.task(timeout=2)
    def slow():
        pass

    @tg.kernel(modes="rw", timeout=0.5)
    def busy(x):
        pass

    assert slow.timeout == 2.0 and busy.timeout == 0.5
    assert tg.task(lambda: 1).timeout is None and scale.timeout is None
    with tg.Graph() as g:
        f = slow()
        busy(matrix()[0, 0].rw)
        with_list = (tg.task(timeout=3)(lambda xs: xs))([f])  # a packed call keeps it
    assert g.tasks[0].fn.timeout == 2.0 and g.tasks[1].fn.timeout == 0.5
    assert g.tasks[with_list.id].fn.timeout == 3.0


@pytest.mark.parametrize("bad", [0, -1, "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        tg.task(timeout=bad)(lambda: 1)
    with pytest.raises(ValueError, match="kernel k: timeout"):
        tg.kernel(lambda x: x, modes="rw", name="k", timeout=bad)


GRAPH_MODULES = {f"taskgraph.dsl.{m}" for m in "graph kernel access tiled tasks".split()}


@pytest.mark.parametrize(
    "name", [n for n in tg.__all__ if getattr(getattr(tg, n), "__module__", "") in GRAPH_MODULES]
)
def test_public_names_document_their_real_parameters(name):
    """``tg.task?``, ``tg.Graph?``...: a docstring that names every parameter."""
    import inspect

    obj = getattr(tg, name)
    doc = inspect.getdoc(obj) or ""
    assert doc and not doc.startswith(f"{name}("), f"{name} has no docstring of its own"
    if isinstance(obj, type) and "__init__" not in vars(obj):
        params = []  # Mode's and the plain errors' signatures are Python's own
    else:
        params = [
            p.name
            for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    missing = [p for p in params if p not in doc]
    assert not missing, f"{name}'s docstring does not mention {missing}"


def test_an_array_as_a_tile_index_is_named_by_shape_and_dtype():
    with pytest.raises(tg.GraphError, match=r"not <float64 array \(100, 100\)>$"):
        matrix()[np.zeros((100, 100))]


@pytest.mark.parametrize("cls", [tg.Graph, tg.Mode, tg.TiledMatrix, tg.Kernel, tg.Future])
def test_public_methods_of_the_dsl_have_docstrings(cls):
    """``g.order?``, ``A.tile_shape?``...: every public method and property says what it does."""
    import inspect

    from taskgraph.dsl.tiled import Tile

    for klass in (cls, Tile) if cls is tg.TiledMatrix else (cls,):
        missing = [
            name
            for name, member in vars(klass).items()
            if not name.startswith("_")
            and (
                inspect.isfunction(member)
                or isinstance(member, property | staticmethod | classmethod)
            )
            and not inspect.getdoc(member.fget if isinstance(member, property) else member)
        ]
        assert not missing, f"{klass.__name__}: no docstring on {missing}"


# -- the recorder and the pure ordering helpers ------------------------------------------


def test_ordering_helpers_are_pure_functions_of_a_task_list():
    """a -> b -> d, a -> c -> d (costs 1, 5, 2, 1): hand-made tasks, no graph."""
    from taskgraph.dsl import order
    from taskgraph.dsl.tasks import Task

    preds = [[], [0], [0], [1, 2]]
    tasks = [
        Task(i, None, (), None, (), (), p, c) for i, (p, c) in enumerate(zip(preds, [1, 5, 2, 1]))
    ]
    succ = order.successors(tasks)
    assert succ == [[1, 2], [3], [3], []]
    found, stuck = order.topological_order(tasks, succ)
    assert stuck == set() and sorted(found) == [0, 1, 2, 3] and found[0] == 0 and found[-1] == 3
    levels = order.bottom_levels(tasks, found, [t.cost for t in tasks])
    assert levels == [7, 6, 3, 1]
    assert order.critical_path(tasks, levels, succ) == (7, [0, 1, 3])
    tasks[0].preds = [3]  # d -> a closes a cycle through everything
    found, stuck = order.topological_order(tasks, order.successors(tasks))
    assert found == [] and stuck == {0, 1, 2, 3}
    cycle = order.find_cycle(tasks, stuck)
    assert set(cycle) in ({0, 1, 3}, {0, 2, 3})


def test_one_inference_serves_kernels_and_task_calls():
    """A kernel and a @tg.task call on the same tiles get the same edges and versions."""
    A = matrix()
    with tg.Graph() as k:
        scale(A[0, 0].rw)
        show(A[0, 0].r)
        axpy(A[0, 0].r, A[1, 0].rw)
        fill(A[0, 0].w)
    with tg.Graph() as t:
        tg.task(lambda x: None)(A[0, 0].rw)
        tg.task(lambda x: None)(A[0, 0].r)
        tg.task(lambda x, y: None)(A[0, 0].r, A[1, 0].rw)
        tg.task(lambda x: None)(A[0, 0].w)
    for tid in range(4):
        assert k.tasks[tid].preds == t.tasks[tid].preds, tid
        assert reads(k, tid) == reads(t, tid) and writes(k, tid) == writes(t, tid)[:-1], tid
    assert [k.tasks[i].preds for i in range(4)] == [[], [0], [0], [1, 2]]


def test_the_graph_caches_its_order_until_it_changes():
    A = matrix()
    with tg.Graph() as g:
        scale(A[0, 0].rw)
        scale(A[1, 1].rw)
    assert g.successors() == [[], []] and g.order() == [0, 1]
    with g:  # recording again, into the same graph
        axpy(A[0, 0].r, A[1, 1].rw)
    assert g.successors() == [[2], [2], []]
    g.add_dependency(2, 0)  # a cycle now: 0 -> 2 -> 0
    with pytest.raises(tg.GraphError, match="has a cycle"):
        g.order()


class _Run:
    """The part of a run handle a future uses: result(future) and done()."""

    def __init__(self, values: dict, over: bool):
        self.values, self.over = values, over

    def result(self, future=None):
        return self.values[future.id]

    def done(self) -> bool:
        return self.over


def test_a_future_asks_the_graphs_latest_run_for_its_value():
    with tg.Graph() as g:
        f = load(3)
    assert g.last_run is None and not f.done()
    with pytest.raises(tg.GraphError, match="has not run yet"):
        f.result()
    g.last_run = _Run({f.id: 42}, over=True)
    assert f.result() == 42 and f.done()
    g.last_run = _Run({f.id: 7}, over=False)  # a second run replaces the first
    assert f.result() == 7 and not f.done()


def test_a_pickled_graph_leaves_its_run_and_results_behind():
    import cloudpickle as pickle  # as a graph travels to engines

    with tg.Graph() as g:
        f = load(3)
        load(f)
    g.last_run = _Run({}, over=True)
    copy = pickle.loads(pickle.dumps(g))
    assert copy.last_run is None
    assert [t.preds for t in copy.tasks] == [[], [0]] and copy.order() == [0, 1]


def test_recording_through_the_graph_outside_a_with_block_leaves_it_closed():
    A = matrix()
    g = tg.Graph()
    f = g.add_call(load, (2,), {})
    g.add_kernel_task(scale, (A[0, 0].rw,))
    assert [t.name for t in g.tasks] == ["load", "scale"] and f.graph is g
    assert tg.Graph.active() is None and g._builder.graph is None  # no cycle holds g


def test_a_tile_index_must_be_a_whole_number():
    """``A[0.5, 0]`` was tile ``A[0, 0]``."""
    A = tg.TiledMatrix.zeros((4, 4), 2)
    assert A[np.int64(1), 0] is A[1, 0]
    for bad in [(0.5, 0), (0, 1.0), ("1", 0)]:
        with pytest.raises(tg.GraphError, match="index tiles of"):
            A[bad]


def test_cholesky_of_a_matrix_that_is_not_square_says_so():
    """A 300 x 200 matrix had its leading 200 x 200 block factored, and no error."""
    for shape in [(300, 200), (200, 300)]:
        with pytest.raises(ValueError, match="needs a square matrix"):
            cholesky(tg.TiledMatrix.zeros(shape, 100))
