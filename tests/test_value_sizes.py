"""Values have sizes: the planner's estimate (``@tg.task(nbytes=...)``, else 64 bytes)
and the real size in the trace, the communication matrix and the run's stats.

The graph here, on 2 ranks::

    make (rank 0: 20 MB)   small(1) (rank 1)   small(2) (rank 0)
             \\                 /
              total(x, s)        rank 1 if make's value counts 64 bytes (ties go to
                                 the least loaded rank), rank 0 if its size is declared
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest
from conftest import HERE, job_marker

import taskgraph as tg
from taskgraph.core.errors import GraphError
from taskgraph.plan.planner import make_plan

SIZE = 20_000_000  # bytes of make's array


def big_graph(nbytes=None) -> tuple[tg.Graph, list]:
    """The graph of the module docstring; ``nbytes``: make's declared size."""

    @tg.task(nbytes=nbytes)
    def make(n):
        return np.ones(n // 8)

    @tg.task
    def small(i):
        return i

    @tg.task
    def total(x, s):
        return float(x.sum()) + s

    with tg.Graph("big") as g:
        a = make(SIZE)
        s = small(1)
        small(2)
        b = total(a, s)
    return g, [a, s, b]


def test_an_undeclared_value_is_planned_at_64_bytes_and_follows_the_load():
    g, (a, s, b) = big_graph()
    plan = make_plan(g, 2)
    assert plan.placement == [0, 1, 0, 1]
    assert plan.traffic().tolist() == [[0, 64], [0, 0]]


@pytest.mark.parametrize("nbytes", [SIZE, lambda n: n], ids=["int", "callable"])
def test_a_declared_size_keeps_the_reader_where_the_large_value_is(nbytes):
    g, (a, s, b) = big_graph(nbytes)
    assert g.data[g._values[a.id]].nbytes == SIZE
    plan = make_plan(g, 2)
    assert plan.placement == [0, 1, 0, 0]  # total follows the 20 MB, not the load
    assert plan.traffic().tolist() == [[0, 0], [64, 0]]  # only small(1)'s value moves


def test_plan_traffic_and_preview_show_a_declared_size():
    @tg.task(nbytes=lambda x, scale=1: 1000 * scale)
    def grow(x, scale=1):
        return x

    @tg.task
    def use(x):
        return x

    with tg.Graph("traffic") as g:
        a = grow(1, scale=7)
        grow(2)  # rank 1
        use(grow(a))  # grow(a) reads a future: the callable gets the future itself
    plan = make_plan(g, 2)
    assert plan.traffic().sum() == 0  # everything follows a
    with tg.Graph("apart") as h:
        x, y = grow(1, scale=5), grow(2, scale=3)
        use2 = tg.task(lambda p, q: p, nbytes=8)
        use2(x, y)
    plan = make_plan(h, 2)
    assert plan.placement == [0, 1, 0]
    assert plan.traffic().tolist() == [[0, 0], [3000, 0]]
    assert h.preview(2).bytes.tolist() == [[0, 0], [3000, 0]]


def test_the_size_callable_gets_the_call_arguments_futures_included():
    seen = []

    @tg.task(nbytes=lambda *args, **kw: seen.append((args, kw)) or 10)
    def f(*args, **kw):
        return 0

    with tg.Graph() as g:
        a = f(1)
        b = f(a, [a], k=2)
    assert seen[0] == ((1,), {})
    (first, box), kw = seen[1]
    assert first is a and box == [a] and kw == {"k": 2}
    assert [g.data[g._values[t.id]].nbytes for t in (a, b)] == [10, 10]


def test_graph_add_call_declares_the_size_too():
    f = tg.task(lambda n: n, nbytes=lambda n: 3 * n)
    g = tg.Graph("explicit")
    fut = g.add_call(f, (5,), {})
    assert g.data[g._values[fut.id]].nbytes == 15


def test_outside_a_graph_the_size_is_not_asked():
    f = tg.task(lambda n: n + 1, nbytes=lambda n: 1 / 0)
    assert f(1) == 2


def test_a_size_that_is_not_a_number_of_bytes_is_an_error_naming_the_task():
    with pytest.raises(GraphError, match="task make: nbytes must be .* not -1"):

        @tg.task(nbytes=-1)
        def make(n):
            return n

    @tg.task(nbytes=lambda n: "big")
    def load(n):
        return n

    @tg.task(nbytes=lambda n: n // 0)
    def crash(n):
        return n

    with tg.Graph() as g:
        with pytest.raises(GraphError, match=r"task load#0\(3\): nbytes .* not 'big'"):
            load(3)
        with pytest.raises(GraphError, match=r"task crash#1\(3\): its nbytes function raised"):
            crash(3)
    assert g.ntasks == 2  # (recorded before the size was asked; the error stops the build)


SCRIPT = """
import numpy as np
import taskgraph as tg
from test_value_sizes import SIZE, big_graph

c = tg.Cluster()
for declared in (None, SIZE):
    g, (a, s, b) = big_graph(declared)
    run = c.run(g).wait()
    assert b.result() == SIZE // 8 + 1
    if c.rank == 0:
        trace = run.trace
        print("declared", declared, "placement", run.plan.placement)
        print("declared", declared, "planned", run.plan.traffic().tolist())
        print("declared", declared, "matrix", trace.sent.tolist())
        print("declared", declared, "summary", trace.summary()["bytes"])
        print("declared", declared, "rows", [m[2] for m in trace.messages])
        print("declared", declared, "stats", run.stats.bytes_sent)
"""


def lines(out: str, declared) -> dict[str, str]:
    prefix = f"declared {declared} "
    found = {}
    for line in out.splitlines():
        if line.startswith(prefix):
            key, _, rest = line[len(prefix) :].partition(" ")
            found[key] = rest
    return found


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_job_traces_the_real_size_of_a_value_it_sends(mpirun, tmp_path):
    script = tmp_path / "sizes.py"
    script.write_text(textwrap.dedent(SCRIPT))
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    proc = mpirun(2, [str(script)], timeout=100, env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = lines(proc.stdout, None)
    assert seen["placement"] == "[0, 1, 0, 1]", proc.stdout
    assert seen["planned"] == "[[0, 64], [0, 0]]"  # the planner's guess
    matrix = eval(seen["matrix"])
    assert matrix[0][1] >= SIZE and matrix[1][0] == 0  # the real size: a pickled 20 MB array
    assert eval(seen["summary"]) == matrix
    [row] = eval(seen["rows"])
    assert row == matrix[0][1] and int(seen["stats"]) == row
    declared = lines(proc.stdout, SIZE)
    assert declared["placement"] == "[0, 1, 0, 0]", proc.stdout
    assert declared["planned"] == "[[0, 0], [64, 0]]"
    matrix = eval(declared["matrix"])
    assert matrix[0][1] == 0 and 0 < matrix[1][0] < 1000  # only small(1)'s int moved


@pytest.fixture(scope="module")
def engines():
    with job_marker(), tg.Cluster(n=2) as c:
        yield c


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_engines_trace_the_real_size_of_a_value_they_send(engines):
    g, (a, s, b) = big_graph()
    run = engines.run(g).wait(timeout=60)
    assert b.result() == SIZE // 8 + 1
    trace = run.trace
    assert trace.sent[0, 1] >= SIZE and trace.sent[1, 0] == 0
    assert [m[2] for m in trace.messages] == [trace.sent[0, 1]]
    assert trace.state()["matrix"]["bytes"] == trace.sent.tolist()  # the widget's matrix
    assert trace.to_dict()["sent"] == trace.sent.tolist()  # the HTML report's
    assert run.stats.bytes_sent == run.stats.bytes_received == trace.sent[0, 1]
    assert run.plan.traffic()[0, 1] == 64  # the planner's guess, for an undeclared size


def test_ranks_that_declare_other_sizes_build_other_graphs():
    """A size decides placement: ranks whose sizes differ would plan differently, so
    the fingerprint every rank compares before a run covers it."""
    from taskgraph.dsl.fingerprint import fingerprint

    prints = [fingerprint(big_graph(n)[0]).digest for n in (None, SIZE, SIZE, SIZE + 1)]
    assert prints[1] == prints[2]
    assert len({prints[0], prints[1], prints[3]}) == 3
