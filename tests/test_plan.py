"""Tests of the planner (taskgraph.plan.make_plan): placement, priorities, messages, tags.

No MPI: matrices for N ranks are built with a fake cluster (``rank=0, size=N``),
which is all a TiledMatrix reads, and the plan is a pure function of the graph.
Small graphs are drawn in the docstrings; the Cholesky graphs are checked against
properties every plan must have.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.tasks import INITIAL
from taskgraph.linalg import cholesky
from taskgraph.plan import CONTROL_TAG, Message, Plan, make_plan

pytestmark = pytest.mark.timeout(30)


# -- helpers --------------------------------------------------------------------------


def matrix(shape, tile=2, nranks=1, dtype=np.float64, name="A", **kw) -> tg.TiledMatrix:
    """A matrix distributed over ``nranks`` ranks, built without MPI."""
    cluster = types.SimpleNamespace(rank=0, size=nranks)
    return tg.TiledMatrix(shape, tile, dtype, name=name, cluster=cluster, **kw)


def cholesky_plan(n: int, nranks: int, tile: int = 2, dtype=np.float64) -> Plan:
    A = matrix(n, tile, nranks, dtype, lower=True)
    return make_plan(cholesky(A), nranks)


def written_tiles(plan: Plan, t: int) -> list:
    g = plan.graph
    return [g.data[d].tile for d, _ in g.tasks[t].writes if g.data[d].is_tile]


def holder(plan: Plan, d: int, prod: int) -> int:
    g = plan.graph
    return plan.placement[prod] if prod != INITIAL else g.data[d].tile.owner


def expected_waits(plan: Plan, rank: int) -> dict[int, int]:
    """#local preds + #incoming messages consumed + #sends waited for, per local task."""
    g, where = plan.graph, plan.placement
    return {
        t.id: sum(where[p] == rank for p in t.preds)
        + sum(m.dst == rank and t.id in m.consumers for m in plan.messages)
        + sum(m.src == rank and t.id in m.release for m in plan.messages)
        for t in g.tasks
        if where[t.id] == rank
    }


def check_plan(plan: Plan) -> None:
    """What every plan must satisfy, whatever the graph."""
    g, where, n = plan.graph, plan.placement, plan.nranks
    # owner computes (on one of the owners, for a task writing tiles of several)
    for t in g.tasks:
        owners = {tile.owner for tile in written_tiles(plan, t.id)}
        assert not owners or where[t.id] in owners, g.label(t.id)
    # one message per (version, destination), consumed by exactly the readers there
    data_msgs = [m for m in plan.messages if m.kind != "signal"]
    keys = [(m.data, m.producer, m.dst) for m in data_msgs]
    assert len(keys) == len(set(keys))
    by_key = dict(zip(keys, data_msgs))
    for t in g.tasks:
        for d, prod in t.reads:
            src = holder(plan, d, prod)
            if src == where[t.id]:
                assert (d, prod, where[t.id]) not in by_key
            else:
                m = by_key[d, prod, where[t.id]]
                assert m.src == src and t.id in m.consumers
    for m in data_msgs:
        assert m.src != m.dst and (m.consumers or m.home)  # (a last version goes home)
        assert len(set(m.consumers)) == len(m.consumers)  # the executor counts them
        # readers, and on the owner the next writer of a version made elsewhere
        assert all(
            (m.data, m.producer) in g.tasks[c].reads
            or (m.home and (m.data, m.producer) in g.tasks[c].writes)
            for c in m.consumers
        )
        assert all(where[c] == m.dst for c in m.consumers)
        assert all(where[r] == m.src for r in m.release)
        item = g.data[m.data]
        if item.is_tile:
            assert m.kind == "tile"
            assert m.shape == item.tile.shape
            assert np.dtype(m.dtype) == item.tile.dtype
            assert m.nbytes == np.prod(m.shape) * item.tile.dtype.itemsize
        else:
            assert m.kind == "value" and m.shape is None
    # no edge between ranks is lost: it is a data message, a release, or a signal
    for t in g.tasks:
        for p in t.preds:
            if where[p] == where[t.id]:
                continue
            assert any(
                (m.producer == p and m.dst == where[t.id] and t.id in m.consumers)
                or (m.src == where[t.id] and t.id in m.release and p in m.consumers)
                for m in plan.messages
            ), f"edge {g.label(p)} -> {g.label(t.id)} has no message"
    # tags: 1, 2, 3, ... per (src, dst), in plan order; 0 is the control tag
    seen: dict[tuple[int, int], list[int]] = {}
    for m in plan.messages:
        seen.setdefault((m.src, m.dst), []).append(m.tag)
    for tags in seen.values():
        assert tags == list(range(1, len(tags) + 1))
    assert all(m.tag != CONTROL_TAG for m in plan.messages)
    # rank plans: counters, a partition of the tasks, local topological order
    ranks = [plan.for_rank(r) for r in range(n)]
    assert sum(len(rp.tasks) for rp in ranks) == g.ntasks
    assert [len(rp.tasks) for rp in ranks] == plan.tasks_per_rank()
    for rp in ranks:
        assert rp.waits == expected_waits(plan, rp.rank)
        position = {t: i for i, t in enumerate(rp.tasks)}
        for t in rp.tasks:
            assert all(position[p] < position[t] for p in g.tasks[t].preds if p in position)
        assert all(m.producer == prod for prod, ms in rp.sends.items() for m in ms)
        assert sorted(id(m) for ms in rp.sends.values() for m in ms) == sorted(
            id(m) for m in plan.messages if m.src == rp.rank
        )
        assert rp.recvs == [m for m in plan.messages if m.dst == rp.rank]
    # traffic
    traffic = plan.traffic()
    assert traffic.shape == (n, n)
    assert traffic.sum() == sum(m.nbytes for m in plan.messages)
    assert np.trace(traffic) == 0


def message_keys(plan: Plan) -> list[tuple]:
    return [(m.src, m.dst, m.tag, m.data, m.producer) for m in plan.messages]


@tg.kernel(modes="r,rw", dims="mn,mn")
def axpy(x, y):
    y += 2.0 * x


@tg.kernel(modes="rw")
def scale(x):
    x *= 2.0


@tg.kernel(modes="r")
def show(x):
    pass


@tg.kernel(modes="rw,rw", dims="mn,mn")
def swap(x, y):
    x[...], y[...] = y.copy(), x.copy()


@tg.task
def load(x):
    return x


@tg.task
def add(x, y=0):
    return x + y


# -- Cholesky ----------------------------------------------------------------------------


def test_cholesky_on_one_rank_sends_nothing():
    plan = cholesky_plan(8, nranks=1)
    g = plan.graph
    assert plan.messages == []
    assert plan.placement == [0] * g.ntasks
    rp = plan.for_rank(0)
    assert rp.tasks == list(range(g.ntasks))
    assert rp.waits == {t.id: len(t.preds) for t in g.tasks}
    assert rp.sends == {} and rp.recvs == []
    assert plan.traffic().tolist() == [[0]]
    check_plan(plan)


def test_cholesky_on_two_ranks_by_hand():
    """5 x 5 in tiles of 2 (3 x 3 tiles, the last row and column 1 wide), grid 1 x 2,
    so tiles belong to ranks by column::

        A00 r0                       0 potrf00   r0
        A10 r0  A11 r1               1 trsm10    r0 --A10 (2x2)--> 3 syrk11, 5 gemm21 (tag 1)
        A20 r0  A21 r1  A22 r0       2 trsm20    r0 --A20 (1x2)--> 5 gemm21           (tag 2)
                                     4 syrk22    r0
        rank 1: 3 syrk11, 5 gemm21, 6 potrf11, 7 trsm21 --A21 (1x2)--> 8 syrk22 (tag 1)
        rank 0: 8 syrk22, 9 potrf22
    """
    plan = cholesky_plan(5, nranks=2)
    assert plan.placement == [0, 0, 0, 1, 0, 1, 1, 1, 0, 0]
    g = plan.graph
    got = [
        (
            m.src,
            m.dst,
            m.kind,
            g.data[m.data].label(),
            m.producer,
            m.shape,
            m.dtype,
            m.nbytes,
            m.tag,
            m.consumers,
            m.release,
        )
        for m in plan.messages
    ]
    assert got == [
        (0, 1, "tile", "A[1,0]", 1, (2, 2), "<f8", 32, 1, [3, 5], []),
        (0, 1, "tile", "A[2,0]", 2, (1, 2), "<f8", 16, 2, [5], []),
        (1, 0, "tile", "A[2,1]", 7, (1, 2), "<f8", 16, 1, [8], []),
    ]
    assert plan.for_rank(1).waits == {3: 1, 5: 2, 6: 1, 7: 2}
    assert plan.for_rank(0).waits == {0: 0, 1: 1, 2: 1, 4: 1, 8: 2, 9: 1}
    assert plan.traffic().tolist() == [[0, 48], [16, 0]]
    assert sorted(plan.for_rank(0).sends) == [1, 2] and sorted(plan.for_rank(1).sends) == [7]
    check_plan(plan)


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cholesky_plan_properties(nranks, dtype):
    """5 x 5 tiles (9 x 9 in tiles of 2, the last ones 1 wide) on 2 or 4 ranks."""
    plan = cholesky_plan(9, nranks, dtype=dtype)
    check_plan(plan)
    assert plan.messages and {m.kind for m in plan.messages} == {"tile"}
    # Cholesky never overwrites a tile another rank reads, and needs no signals
    assert all(m.release == [] for m in plan.messages)
    assert {m.dtype for m in plan.messages} == {np.dtype(dtype).str}
    assert sorted({m.nbytes for m in plan.messages}) == [
        s * np.dtype(dtype).itemsize for s in (2, 4)
    ]
    assert all(n > 0 for n in plan.tasks_per_rank())


def test_one_message_per_version_and_rank_however_many_readers():
    """On 4 ranks (grid 2 x 2), A[4,0] (rank 0) is read by gemm(A[4,0], A[n,0], A[4,n])
    for n = 1, 2, 3, and by syrk; the ones on rank 1 share one message."""
    plan = cholesky_plan(10, nranks=4)  # 5 x 5 tiles
    g = plan.graph
    msgs = [m for m in plan.messages if g.data[m.data].label() == "A[4,0]"]
    readers_elsewhere: dict[int, list[int]] = {}
    for t in g.tasks:
        if any(g.data[d].label() == "A[4,0]" for d, _ in t.reads) and plan.placement[t.id]:
            readers_elsewhere.setdefault(plan.placement[t.id], []).append(t.id)
    assert sorted(m.dst for m in msgs) == sorted(readers_elsewhere)
    assert {m.dst: m.consumers for m in msgs} == readers_elsewhere
    assert max(len(c) for c in readers_elsewhere.values()) > 1  # the sharing is tested


def test_plans_are_deterministic():
    a = cholesky_plan(11, nranks=4)
    b = cholesky_plan(11, nranks=4)
    assert a.graph is not b.graph
    assert a.placement == b.placement
    assert a.priority == b.priority
    assert message_keys(a) == message_keys(b)
    assert [m.consumers for m in a.messages] == [m.consumers for m in b.messages]


def test_priorities_put_the_critical_path_first():
    plan = cholesky_plan(10, nranks=2)
    g = plan.graph
    top = max(range(g.ntasks), key=lambda t: plan.priority[t])
    assert top == 0 and g.label(0) == "potrf(A[0,0])"
    assert sorted(plan.priority).count(plan.priority[0]) == 1
    for t in g.tasks:
        for p in t.preds:
            assert plan.priority[p] > plan.priority[t.id], (g.label(p), g.label(t.id))
    assert plan.priority == g.bottom_levels()
    assert plan.priority[0] == g.critical_path_length
    rp = plan.for_rank(1)
    assert rp.priority == {t: plan.priority[t] for t in rp.tasks}


# -- write after read across ranks -------------------------------------------------------


def test_war_across_ranks_releases_the_overwriter_after_the_send():
    """B is 1 x 2 tiles on ranks 0 | 1::

    t0 axpy(B00.r, B01.rw)   rank 1: reads the initial B00, sent 0 -> 1
              :  WAR
    t1 scale(B00.rw)         rank 0: must not overwrite B00 before it is sent
    """
    B = matrix((2, 4), nranks=2, name="B")
    with tg.Graph() as g:
        axpy(B[0, 0].r, B[0, 1].rw)
        scale(B[0, 0].rw)
    assert g.tasks[1].preds == [0]
    plan = make_plan(g, 2)
    assert plan.placement == [1, 0]
    [m] = plan.messages
    assert (m.src, m.dst, m.kind, m.producer, m.consumers, m.release) == (
        0,
        1,
        "tile",
        INITIAL,
        [0],
        [1],
    )
    assert plan.for_rank(0).waits == {1: 1}  # the send, not the remote reader
    assert plan.for_rank(0).sends == {INITIAL: [m]}
    assert plan.for_rank(1).waits == {0: 1}
    check_plan(plan)


def test_war_with_readers_on_three_ranks():
    """B is 1 x 3 tiles on ranks 0 | 1 | 2; B00 is made by t0, then read everywhere::

    t0 scale(B00)               rank 0
     |--> t1 axpy(B00, B01)     rank 1  (message 0 -> 1)
     |--> t2 axpy(B00, B02)     rank 2  (message 0 -> 2)
     |--> t3 show(B00)          rank 0
    t4 scale(B00)               rank 0: waits for t0 and t3 (local) and both sends
    """
    B = matrix((2, 6), nranks=3, name="B")
    with tg.Graph() as g:
        scale(B[0, 0].rw)
        axpy(B[0, 0].r, B[0, 1].rw)
        axpy(B[0, 0].r, B[0, 2].rw)
        show(B[0, 0].r)
        scale(B[0, 0].rw)
    plan = make_plan(g, 3)
    assert plan.placement == [0, 1, 2, 0, 0]
    assert [(m.src, m.dst, m.producer, m.consumers, m.release) for m in plan.messages] == [
        (0, 1, 0, [1], [4]),
        (0, 2, 0, [2], [4]),
    ]
    assert plan.for_rank(0).waits == {0: 0, 3: 1, 4: 4}
    assert [m.dst for m in plan.for_rank(0).sends[0]] == [1, 2]
    check_plan(plan)


# -- explicit dependencies, errors -------------------------------------------------------


def test_explicit_dependency_across_ranks_is_a_signal():
    """Two tasks that share no data, on ranks 0 and 1, ordered by hand::

    t0 scale(B00)  rank 0 ==signal, 0 bytes==> t1 scale(B01)  rank 1
    t2 show(B01)   rank 1  (a local explicit edge t1 -> t2: no message)
    """
    B = matrix((2, 4), nranks=2, name="B")
    with tg.Graph() as g:
        a = scale(B[0, 0].rw)
        b = scale(B[0, 1].rw)
        c = scale(B[0, 1].rw)
    g.add_dependency(a, b)
    g.add_dependency(b, c)  # already there (WAW): nothing new
    plan = make_plan(g, 2)
    assert plan.messages == [
        Message(src=0, dst=1, kind="signal", data=0, producer=0, nbytes=0, tag=1, consumers=[1])
    ]
    assert plan.for_rank(0).sends == {0: plan.messages}
    assert plan.for_rank(1).waits == {1: 1, 2: 1}
    check_plan(plan)


def test_a_task_writing_tiles_of_two_ranks_runs_on_one_and_sends_the_other_home():
    """swap(B00.rw, B01.rw) with B00 on rank 0 and B01 on rank 1: runs on rank 0, B01
    comes over and its new version goes home (tests/test_multiowner.py has more)."""
    B = matrix((2, 4), nranks=2, name="B")
    with tg.Graph() as g:
        swap(B[0, 0].rw, B[0, 1].rw)
    plan = make_plan(g, 2)
    assert plan.placement == [0]
    assert [(m.src, m.dst, m.home) for m in plan.messages] == [(1, 0, False), (0, 1, True)]
    check_plan(plan)


def test_a_matrix_for_four_ranks_planned_on_two_is_rejected():
    A = matrix(4, nranks=4, lower=True)
    g = cholesky(A)
    with pytest.raises(tg.PlanError, match=r"A is distributed over 4 ranks, but the run has 2"):
        make_plan(g, 2)
    check_plan(make_plan(g, 4))


def test_a_cycle_is_rejected_before_planning():
    with tg.Graph("loop") as g:
        a = load(1)
        b = add(a)
    g.add_dependency(b, a)
    with pytest.raises(tg.GraphError, match="graph 'loop' has a cycle"):
        make_plan(g, 2)


# -- futures ----------------------------------------------------------------------------


def test_futures_follow_their_inputs():
    """Two chains on two ranks, joined at the end::

    a = load(1)  r0      b = load(2)  r1      (independent: round robin)
        |                    |
    c = add(a)   r0      d = add(b)   r1      (follow the input)
          \\                 /
           e = add(c, y=d)  r0                (64 B on each rank, loads 2 and 2:
                                                the lowest rank; d's value is sent)
    """
    with tg.Graph() as g:
        a, b = load(1), load(2)
        c, d = add(a), add(b)
        e = add(c, y=d)
    plan = make_plan(g, 2)
    assert plan.placement == [0, 1, 0, 1, 0]
    [m] = plan.messages
    assert (m.src, m.dst, m.kind, m.producer, m.consumers, m.tag) == (1, 0, "value", 3, [4], 1)
    assert m.nbytes > 0 and m.shape is None and m.dtype is None
    assert g.data[m.data].label() == "value of task 3"
    assert plan.for_rank(0).waits == {0: 0, 2: 1, 4: 2}
    assert plan.for_rank(0).results == plan.for_rank(1).results == [e.id]
    check_plan(plan)


def test_a_chain_of_futures_stays_on_one_rank():
    """x0 -> x1 -> ... -> x5 on three ranks: one rank, no messages."""
    with tg.Graph() as g:
        x = load(0)
        for _ in range(5):
            x = add(x, y=1)
    plan = make_plan(g, 3)
    assert plan.placement == [0] * 6
    assert plan.messages == []
    assert plan.tasks_per_rank() == [6, 0, 0]
    check_plan(plan)


def test_a_task_on_a_tile_runs_where_the_tile_is():
    """B is 1 x 2 tiles of 4 x 4 (128 B) on ranks 0 | 1::

    t0 norm(B01)           rank 1: its only input is there
         |  value, 1 -> 0
    t1 add(t0, y=B00)      rank 0: B00 (128 B) outweighs t0's value (64 B)
    """

    @tg.task
    def norm(x):
        return float(np.linalg.norm(x))

    B = matrix((4, 8), tile=4, nranks=2, name="B")
    with tg.Graph() as g:
        n = norm(B[0, 1])
        add(n, y=B[0, 0])
    plan = make_plan(g, 2)
    assert plan.placement == [1, 0]
    assert [(m.src, m.dst, m.kind, m.producer) for m in plan.messages] == [(1, 0, "value", 0)]
    check_plan(plan)


# -- plain data (tg.Data, tg.r/w/rw) ------------------------------------------------------


@tg.kernel(modes="r,rw", dims="n,n")
def vaxpy(x, y):
    y += 2 * x


@tg.kernel(modes="rw,rw", dims="n,n")
def vswap(x, y):
    x[...], y[...] = y.copy(), x.copy()


@tg.task
def bump(d):
    d["n"] += 1


@tg.task
def peek(d, x):
    return d["n"], x.sum()


@tg.task
def both(d, y):
    d["n"] = y.sum()


def plain_id(g, value) -> int:
    """The data id of the plain datum holding ``value``."""
    return next(i for i, d in enumerate(g.data) if d.item is not None and d.item.value is value)


def test_plain_data_get_homes_and_move_as_tiles_or_values():
    """x (rank 0) is read by vaxpy on y's home (rank 1); the object's writer runs at its
    home (rank 1) and a reader on rank 0 gets it as a value message.

        rank 0: x --tile (4,) int64--> rank 1: vaxpy(x, y), add_one(obj)
                                               \\--value obj--> rank 0: peek(obj)
    """
    x, y, obj = np.arange(4), np.zeros(4, np.int64), {"n": 0}
    with tg.Graph() as g:
        vaxpy(tg.r(tg.Data(x, rank=0)), tg.rw(tg.Data(y, rank=1)))
        bump(tg.rw(tg.Data(obj, rank=1)))
        peek(tg.Data(obj).r, tg.Data(x).r)
    plan = make_plan(g, 2)
    dx, dy, dobj = (plain_id(g, v) for v in (x, y, obj))
    assert [plan.owner_of[d] for d in (dx, dy, dobj)] == [0, 1, 1]
    assert plan.placement[:2] == [1, 1]
    tile = next(m for m in plan.messages if m.data == dx)
    assert (tile.kind, tile.shape, tile.dtype, tile.nbytes) == ("tile", (4,), x.dtype.str, 32)
    value = next(m for m in plan.messages if m.data == dobj)
    assert (value.kind, value.src, value.dst, value.shape) == ("value", 1, 0, None)
    assert plan.for_rank(0).homes == {dx: 0, dy: 1, dobj: 1}
    assert not any(m.home for m in plan.messages)


def test_unpinned_plain_data_get_homes_by_size():
    big, small = np.zeros(1000), np.zeros(10)
    with tg.Graph() as g:
        peek(tg.r({"n": 1}), tg.r(small))
        bump(tg.rw(big))
    plan = make_plan(g, 2)
    assert plan.owner_of[plain_id(g, big)] == 0  # largest first, on the least loaded
    assert plan.owner_of[plain_id(g, small)] == 1


def test_a_kernel_writing_arrays_of_two_homes_sends_one_home():
    x, y = np.zeros(8), np.ones(8)
    with tg.Graph() as g:
        vswap(tg.rw(tg.Data(x, rank=0)), tg.rw(tg.Data(y, rank=1)))
    plan = make_plan(g, 2)
    assert plan.placement == [0]
    assert [(m.src, m.dst, m.kind, m.home) for m in plan.messages] == [
        (1, 0, "tile", False),
        (0, 1, "tile", True),
    ]


def test_a_task_writing_an_object_and_data_of_another_rank_is_refused():
    obj, y = {"n": 0}, np.ones(8)
    with tg.Graph() as g:
        both(tg.rw(tg.Data(obj, rank=0)), tg.rw(tg.Data(y, rank=1)))
    with pytest.raises(tg.PlanError, match=r"task both.* writes the object .*home rank 0"):
        make_plan(g, 2)
