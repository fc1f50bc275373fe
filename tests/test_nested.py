"""Futures inside containers, and plain NumPy arrays, as task arguments (taskgraph.dsl.nested).

Futures in a list, tuple, named tuple, dict (values), set or frozenset are
dependencies and arrive as their values; a plain array arrives read-only, and a write
into it fails the task with an error that names it. Run on 1 rank in-process and on
2 ranks under mpiexec (this file is also the ranks' script).
"""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.plan import make_plan

pytestmark = pytest.mark.timeout(60)

Pair = collections.namedtuple("Pair", "a b")


@tg.task
def leaf(i):
    return i * 10


@tg.task
def echo(*args, **kwargs):
    return args, kwargs


@tg.task
def total(xs):
    return sum(xs)


def nested_graph():
    """::

    leaf0 leaf1 leaf2 leaf3 leaf4
       \\    |     |     |    /
        echo([0, 1], (2, 7), {x: 3, y: [4, 1]}, {0, 1}, Pair(0, 3), k={z: 1})
    """
    with tg.Graph("nested") as g:
        f = [leaf(i) for i in range(5)]
        out = echo(
            [f[0], f[1]],
            (f[2], 7),
            {"x": f[3], "y": [f[4], 1]},
            {f[0], f[1]},
            Pair(f[0], 3),
            k={"z": f[1]},
        )
    return g, out


EXPECTED = (
    ([0, 10], (20, 7), {"x": 30, "y": [40, 1]}, {0, 10}, Pair(0, 3)),
    {"k": {"z": 10}},
)


def test_futures_in_containers_are_edges_and_reads():
    g, out = nested_graph()
    t = g.tasks[out.id]
    assert t.preds == [0, 1, 2, 3, 4]
    assert sorted(prod for _, prod in t.reads) == [0, 1, 2, 3, 4]


def test_the_label_shows_the_containers():
    g, out = nested_graph()
    assert g.label(out.id) == (
        "echo#5([<task 0>, <task 1>], (<task 2>, 7), {'x': <task 3>, 'y': [<task 4>, 1]}, "
        "{<task 0>, <task 1>}, Pair(<task 0>, 3), k={'z': <task 1>})"
    )


def test_futures_in_containers_arrive_as_values_on_one_rank():
    g, out = nested_graph()
    tg.current_cluster().run(g).wait()
    assert out.result() == EXPECTED


def test_a_container_without_futures_stays_one_constant():
    with tg.Graph() as g:
        big = list(range(1000))
        f = total(big)
    assert g.tasks[f.id].args == (big,)
    assert g.tasks[f.id].fn is total


def test_the_quick_path_still_takes_plain_calls():
    with tg.Graph() as g:
        a = leaf(1)
        b = total(a)
    assert g.tasks[b.id].fn is total and g.tasks[b.id].preds == [a.id]


def test_a_future_as_a_dict_key_is_refused():
    with tg.Graph():
        f = leaf(1)
        with pytest.raises(tg.GraphError, match="key of a dict argument"):
            echo({f: 1})


def test_a_kernel_task_inside_a_container_is_refused():
    @tg.kernel(modes="rw")
    def scale(x):
        x *= 2.0

    A = tg.TiledMatrix(4, 2, cluster=tg.current_cluster())
    with tg.Graph():
        k = scale(A[0, 0].rw)
        with pytest.raises(tg.GraphError, match="kernel task"):
            echo([k])


def test_a_set_of_futures_is_recorded_in_task_order():
    """Sets iterate in an order that differs between processes: the leaves are sorted
    by task id, so every rank records the same task."""
    with tg.Graph() as g:
        f = [leaf(i) for i in range(20)]
        s = echo(set(reversed(f)))
    assert [g.data[a.data].producer for a in g.tasks[s.id].args] == list(range(20))


def test_the_plan_sends_futures_read_from_a_container_to_the_consumer():
    """On 2 ranks the leaves spread over both; the consumer's rank receives the
    others' values, one message per leaf on the other rank."""
    with tg.Graph() as g:
        f = [leaf(i) for i in range(4)]
        t = total(f)
    plan = make_plan(g, 2)
    here = plan.placement[t.id]
    remote = [x.id for x in f if plan.placement[x.id] != here]
    assert remote, "leaves on the other rank, or the test proves nothing"
    into = [m for m in plan.messages if m.dst == here and t.id in m.consumers]
    assert sorted(m.producer for m in into) == remote
    assert all(m.kind == "value" for m in into)


# -- plain NumPy arrays -----------------------------------------------------------------


@tg.task
def write_into(a):
    a[0, 0] = 5.0
    return 1


@tg.task
def write_nested(parts):
    parts[1] += 1.0
    return 1


@tg.task
def read_sum(a, parts):
    return float(a.sum() + sum(p.sum() for p in parts))


def test_a_task_that_writes_a_plain_array_fails_naming_the_task():
    a = np.zeros((300, 300))
    with tg.Graph() as g:
        write_into(a)
    with pytest.raises(tg.TaskError) as err:
        tg.current_cluster().run(g).wait()
    text = str(err.value)
    assert "write_into#0(<float64 array (300, 300)>)" in text
    assert "read-only constant" in text and "0., 0." not in text
    assert a[0, 0] == 0.0


def test_a_plain_array_inside_a_list_is_read_only_too():
    parts = [np.zeros(3), np.ones(2, np.float32)]
    with tg.Graph() as g:
        write_nested(parts)
    with pytest.raises(tg.TaskError, match=r"write_nested.*<float32 array \(2,\)>"):
        tg.current_cluster().run(g).wait()
    assert parts[1].sum() == 2.0


def test_a_task_reads_plain_arrays_and_the_next_run_works():
    a = np.ones((3, 3))
    with tg.Graph() as g:
        s = read_sum(a, [np.ones(2), np.ones(4)])
    tg.current_cluster().run(g).wait()
    assert s.result() == 15.0
    assert a.flags.writeable


def test_a_kernel_on_plain_arrays_inside_a_graph_is_refused_naming_the_call():
    from taskgraph.kernels import potrf

    a = np.eye(500, order="F")
    with tg.Graph() as g, pytest.raises(tg.GraphError) as err:
        potrf(a)
    text = str(err.value)
    assert "potrf(<float64 array (500, 500)>)" in text
    assert "1., 0." not in text and len(text) < 400
    assert g.ntasks == 0


def test_a_plain_array_beside_marked_tiles_is_named_by_shape_and_dtype():
    from taskgraph.kernels import trsm

    A = tg.TiledMatrix(4, 2, cluster=tg.current_cluster())
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"argument 2 \(<float64 array \(2, 2\)>\)"):
        trsm(A[0, 0].r, np.zeros((2, 2)))


# -- two ranks --------------------------------------------------------------------------


def ranks_main() -> None:
    """Every rank builds the graph, runs it, and checks the value; prints PASS."""
    g, out = nested_graph()
    c = tg.current_cluster()
    run = c.run(g).wait()
    assert out.result() == EXPECTED, out.result()
    if c.size > 1:
        assert run.plan.traffic().sum() > 0, "no value moved: the test proves nothing"
    print(f"PASS {c.rank}/{c.size}", flush=True)


@pytest.mark.mpi
def test_futures_in_containers_arrive_as_values_on_two_ranks(mpirun):
    proc = mpirun(2, [__file__, "ranks"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS 0/2" in proc.stdout and "PASS 1/2" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_packed_calls_travel_to_the_engines_and_arrays_stay_read_only_there():
    """A graph goes to the engines pickled: the packed call and the read-only view
    must survive it (a pickled array comes back writeable)."""
    from conftest import engines_marker

    with engines_marker(sys.modules[__name__]):
        with tg.Cluster(n=2) as c:
            with tg.Graph() as g:
                f = [leaf(i) for i in range(4)]
                out = echo([f[0], f[1]], {"x": f[2]}, {f[3]}, k=(f[0],))
            c.run(g).wait()
            assert out.result() == (([0, 10], {"x": 20}, {30}), {"k": (0,)})
            with tg.Graph() as g2:
                write_into(np.zeros((2, 2)))
            with pytest.raises(tg.TaskError, match=r"write_into#0.*read-only constant"):
                c.run(g2).wait()


if __name__ == "__main__" and sys.argv[1:] == ["ranks"]:
    ranks_main()
