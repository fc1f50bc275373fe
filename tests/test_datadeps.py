"""Access marks on plain data: NumPy arrays of any shape and dtype, and objects.

``tg.r(x)``, ``tg.w(x)``, ``tg.rw(x)`` (and ``tg.Data``) give plain data the RAW/WAR/WAW
inference that tiles have (taskgraph.dsl.datadeps); ``choose_homes`` gives them a home
rank (taskgraph.plan.homes). The end-to-end checks run on 1 rank in-process and in
real 2- and 3-rank jobs (this file is also the ranks' script).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.plan import make_plan
from taskgraph.plan.homes import choose_homes

pytestmark = pytest.mark.timeout(60)


@tg.task
def fill(out, k):
    out[...] = k


@tg.task
def add_into(src, dst):
    dst += src


@tg.task
def scale(x, k):
    x *= k


@tg.task
def append(log, item):
    log.append(item)


@tg.task
def snapshot(x):
    return x.copy() if isinstance(x, np.ndarray) else list(x)


@tg.task
def write_into(a):
    a[0] = 7


@tg.task
def read_all(*xs):
    return len(xs)


@tg.kernel(modes="r,rw,scalar")
def axpy(x, y, a):
    y += a * x


def preds(g):
    return [sorted(t.preds) for t in g.tasks]


# -- the inference -----------------------------------------------------------------


def test_marks_on_arrays_give_raw_war_and_waw_edges():
    x, y = np.zeros(3), np.zeros((2, 2), np.int32)
    with tg.Graph() as g:
        fill(tg.w(x), 1)  # 0
        add_into(tg.r(x), tg.rw(y))  # 1: reads x
        scale(tg.rw(y), 2)  # 2: WAW/RAW on y after 1
        fill(tg.w(x), 3)  # 3: WAR after 1 (x was read)
        read_all(tg.r(x), tg.r(y))  # 4: RAW on x (3) and y (2)
        read_all(tg.r(x))  # 5: a second reader: no edge to 4
        fill(tg.w(y), 0)  # 6: WAR after 4
    assert preds(g)[:7] == [[], [0], [1], [1], [2, 3], [3], [4]]
    plain = [d for d in g.data if d.item is not None]
    assert [d.item.value is v for d, v in zip(plain, (x, y))] == [True, True]
    assert all(d.tile is None and d.key == ("data", d.item.uid) for d in plain)


def test_one_handle_per_object_and_marks_are_shared():
    x = np.arange(4)
    d = tg.Data(x, name="x")
    assert tg.Data(x) is d and tg.r(x).tile is d and tg.rw(d).tile is d
    assert d.r is d.r and d.rw.mode is tg.Mode.RW and tg.w(x) is d.w
    assert (d.key, d.name, d.rank, d.is_array, d.shape, d.dtype) == (
        ("data", d.uid),
        "x",
        None,
        True,
        (4,),
        np.dtype(np.int64),
    )
    assert d.nbytes == 32
    assert tg.Data(x, rank=1).rank == 1  # pins the handle made before
    with pytest.raises(ValueError, match="pinned to rank 1, not 2"):
        tg.Data(x, rank=2)
    with pytest.raises(ValueError, match="rank number"):
        tg.Data(np.zeros(1), rank=-1)


def test_objects_are_data_too_sized_by_their_pickle():
    log: list = []
    with tg.Graph() as g:
        append(tg.rw(log), 1)
        append(tg.rw(log), 2)
        out = snapshot(tg.r(log))
    assert preds(g)[:3] == [[], [0], [1]] and out.id == 2
    item = tg.Data(log)
    assert not item.is_array and item.shape is None and item.dtype is None
    assert g.data[0].nbytes == item.nbytes == len(pickle.dumps(log, protocol=5))


def test_kernel_calls_take_marked_arrays_and_record_the_same_edges():
    x, y = np.ones(5), np.zeros(5)
    with tg.Graph() as g:
        axpy(tg.r(x), tg.rw(y), 2.0)
        axpy(tg.r(y), tg.rw(x), 1.0)
        scale(tg.rw(y), 3)
    assert preds(g) == [[], [0], [0, 1]]  # y: RAW on 0, WAR on 1
    assert g.tasks[0].args[2] == 2.0  # a scalar: a constant of the task


def test_labels_show_names_dtypes_and_shapes_never_values():
    secret = np.full((2, 3), 123456.0)
    named = np.arange(4, dtype=np.int16)
    with tg.Graph() as g:
        add_into(tg.r(tg.Data(named, name="x")), tg.rw(secret))
        axpy(tg.r(secret), tg.rw(secret.copy()), 2)
    text = g.label(0) + g.label(1)
    assert "x<int16 (4,)>" in g.label(0), g.label(0)
    assert "Data#" in g.label(0) and "<float64 (2, 3)>" in g.label(0)
    assert "123456" not in text
    assert g.data[0].label() == "x<int16 (4,)>"


def test_a_datum_twice_in_one_call_where_it_is_written_is_refused():
    x = np.zeros(2)
    with tg.Graph() as g, pytest.raises(tg.GraphError, match=r"add_into#0.*both written"):
        add_into(tg.r(x), tg.rw(x))
    assert g.ntasks == 0


def test_a_bare_handle_is_read_at_any_depth_and_the_task_gets_the_value():
    x = np.arange(3)
    d = tg.Data(x)
    with tg.Graph() as g:
        fill(d.w, 1)
        read_all(d)  # 1: reads it, as a bare tile is read
        out = snapshot([d][0])
        total = read_all([d, {"k": d}])  # 3: inside containers too
        fill(d.w, 2)  # 4: WAR after 1, 2 and 3
    assert preds(g) == [[], [0], [0], [0], [1, 2, 3]]
    assert out.id == 2 and total.id == 3
    tg.current_cluster().run(g).wait()
    assert out.result().tolist() == [1, 1, 1] and x.tolist() == [2, 2, 2]


# -- errors before anything runs ------------------------------------------------------


def test_a_mark_on_something_that_cannot_be_sent_names_the_task():
    lock = threading.Lock()
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"task append#0.*cannot be sent"):
        append(tg.rw(lock), 1)
    view = np.zeros((4, 4))[:, 1]
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"task axpy.*strided view"):
        axpy(tg.r(np.ones(4)), tg.rw(view), 1.0)


def test_a_read_only_array_marked_as_written_names_the_task():
    x = np.zeros(3)
    x.flags.writeable = False
    with tg.Graph():
        read_all(tg.r(x))  # reading it is fine
        with pytest.raises(tg.GraphError, match=r"task fill#1.*read-only array"):
            fill(tg.w(x), 1)


def test_a_mark_on_a_future_or_a_tile_says_what_to_do():
    A = tg.TiledMatrix((4, 4), tile=2, grid=(1, 1), name="A")
    with tg.Graph():
        f = snapshot(np.zeros(1))
        with pytest.raises(tg.GraphError, match=r"future .* pass it as it is"):
            tg.rw(f)
        with pytest.raises(tg.GraphError, match=r"mark a tile with A\[0,0\]\.r"):
            tg.r(A[0, 0])
        with pytest.raises(tg.GraphError, match="marked already"):
            tg.r(tg.r(np.zeros(1)))


def test_kernels_take_arrays_not_objects_and_unmarked_arrays_are_refused():
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"axpy.*not a NumPy array"):
        axpy(tg.r([1.0]), tg.rw(np.zeros(1)), 1.0)
    with tg.Graph(), pytest.raises(tg.GraphError, match=r"tg\.r\(x\), tg\.w\(x\) or tg\.rw\(x\)"):
        axpy(np.zeros(1), tg.rw(np.zeros(1)), 1.0)


# -- pickling: one handle per uid, in every process ------------------------------------


def test_a_handle_comes_back_from_pickling_as_itself():
    x = np.arange(3.0)
    d = tg.Data(x)
    assert pickle.loads(pickle.dumps(d)) is d
    with tg.Graph() as g:
        scale(tg.rw(x), 2)
    assert pickle.loads(pickle.dumps(g.data[0])).item is d


def test_in_another_process_a_handle_sent_twice_is_one_handle():
    # (what an engine gets when a notebook sends two graphs on the same array)
    x = np.arange(3.0)
    blob = pickle.dumps((tg.Data(x, name="x"), tg.Data(x)))
    code = (
        "import pickle, sys\n"
        "blob = sys.stdin.buffer.read()\n"
        "a, b = pickle.loads(blob)\n"
        "c, _ = pickle.loads(pickle.dumps((a, b)))\n"
        "assert a is b is c and a.name == 'x' and list(a.value) == [0.0, 1.0, 2.0]\n"
        "import taskgraph as tg\n"
        "assert tg.Data(a.value) is a\n"
        "a.value[0] = 9.0\n"
        "del a, b, c, _\n"
        "import gc; gc.collect()\n"
        "again, _ = pickle.loads(blob)\n"  # (the engine dropped the first graph)
        # (the handle is found again, and takes the value sent: the sender's is the truth)
        "assert again.value[0] == 0.0, again.value\n"
        "print('OK')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60)
    assert proc.stdout.strip() == b"OK", proc.stderr.decode()


# -- homes ----------------------------------------------------------------------------------


def test_choose_homes_balances_bytes_largest_first():
    # 40 -> 0, 30 -> 1, 20 -> 1 (30 < 40), 10 -> 0 (40 < 50)
    assert choose_homes([10, 40, 30, 20], [None] * 4, 2) == [0, 0, 1, 1]
    assert choose_homes([5] * 6, [None] * 6, 3) == [0, 1, 2, 0, 1, 2]
    assert choose_homes([], [], 4) == []


def test_choose_homes_keeps_pinned_data_and_counts_their_bytes():
    assert choose_homes([100, 10, 10], [0, None, None], 2) == [0, 1, 1]
    assert choose_homes([1, 1], [1, 1], 2) == [1, 1]


def test_choose_homes_is_deterministic():
    sizes = [7, 7, 3, 9, 9, 1]
    pinned = [None, 2, None, None, None, None]
    assert len({tuple(choose_homes(sizes, pinned, 3)) for _ in range(5)}) == 1


def test_a_pinned_rank_out_of_range_is_a_plan_error_naming_the_datum():
    with pytest.raises(tg.PlanError, match=r"y is pinned to rank 3, but the run has ranks 0\.\.1"):
        choose_homes([8, 8], [None, 3], 2, names=["x", "y"])
    with pytest.raises(tg.PlanError, match="datum 0 is pinned"):
        choose_homes([8], [5], 2)


# -- the same loop, run: the sequential result exactly -------------------------------------


def make_arrays() -> list[np.ndarray]:
    """Pairs (a, b) of 1-D and 2-D int and float arrays."""
    shapes = [((6,), np.int64), ((3, 4), np.float64), ((6,), np.int32), ((2, 3), np.float32)]
    return [np.zeros(s, dt) for s, dt in shapes for _ in range(2)]


def loop(arrays: list[np.ndarray], log: list, mark) -> None:
    """In/Out/InOut calls on the pairs; ``mark(x, m)`` marks x (or, run plainly, is x)."""
    pairs = list(zip(arrays[0::2], arrays[1::2]))
    for step in range(3):
        for i, (a, b) in enumerate(pairs):
            fill(mark(b, "w"), step + i)  # Out
            add_into(mark(b, "r"), mark(a, "rw"))  # In, InOut
            axpy(mark(b, "r"), mark(a, "rw"), 2)  # a kernel with a scalar
            scale(mark(a, "rw"), 2)
        append(mark(log, "rw"), step)
    add_into(mark(arrays[5], "r"), mark(arrays[0], "rw"))  # across chains


def sequential() -> tuple[list[np.ndarray], list]:
    arrays, log = make_arrays(), []
    pairs = list(zip(arrays[0::2], arrays[1::2]))
    for step in range(3):
        for i, (a, b) in enumerate(pairs):
            fill.fn(b, step + i)  # (the plain functions, called now)
            add_into.fn(b, a)
            axpy(b, a, 2)
            scale.fn(a, 2)
        append.fn(log, step)
    add_into.fn(arrays[5], arrays[0])
    return arrays, log


def graph_of_the_loop():
    arrays, log = make_arrays(), []
    marks = {"r": tg.r, "w": tg.w, "rw": tg.rw}
    with tg.Graph("datadeps") as g:
        loop(arrays, log, lambda x, m: marks[m](x))
        outs = [snapshot(tg.r(a)) for a in arrays] + [snapshot(tg.r(log))]
    return g, outs


def check_results(outs) -> None:
    want, want_log = sequential()
    got = [o.result() for o in outs]
    for w, v in zip(want, got[:-1]):
        assert v.dtype == w.dtype and v.shape == w.shape and np.array_equal(v, w), (v, w)
    assert got[-1] == want_log, got[-1]


def test_the_loop_records_a_chain_per_pair():
    g, _ = graph_of_the_loop()
    assert g.ntasks == 3 * (4 * 4 + 1) + 1 + 9
    assert len([d for d in g.data if d.item is not None]) == 9


def independent_chains(n: int = 6):
    arrays = [np.zeros(1000) for _ in range(n)]
    with tg.Graph("chains") as g:
        for a in arrays:
            for step in range(4):
                scale(tg.rw(a), 2)
                fill(tg.w(a), step)
    return g


def test_independent_chains_spread_over_three_ranks():
    g = independent_chains()
    counts = make_plan(g, 3).tasks_per_rank()
    assert max(counts) <= g.ntasks / 2, counts


def test_the_loop_gives_the_sequential_result_on_one_rank():
    g, outs = graph_of_the_loop()
    tg.current_cluster().run(g).wait()
    check_results(outs)


def test_a_task_that_writes_an_unmarked_array_fails_naming_it_on_one_rank():
    a = np.zeros(4)
    with tg.Graph() as g:
        write_into(a)
    with pytest.raises(tg.TaskError, match=r"write_into#0.*read-only constant"):
        tg.current_cluster().run(g).wait()
    assert a[0] == 0


def ranks_main() -> None:
    """Every rank runs the loop, checks every array and the log; then a write into an
    unmarked array fails naming the task. Prints PASS."""
    c = tg.current_cluster()
    g, outs = graph_of_the_loop()
    run = c.run(g).wait()
    check_results(outs)
    if c.size > 1:
        assert run.plan.traffic().sum() > 0, "nothing moved: the test proves nothing"
        assert min(run.plan.tasks_per_rank()) > 0, run.plan.tasks_per_rank()
    with tg.Graph() as g2:
        write_into(np.zeros(4))
    try:
        c.run(g2).wait()
    except tg.TaskError as e:
        assert "write_into#0" in str(e) and "read-only constant" in str(e), str(e)
    else:
        raise AssertionError("a write into an unmarked array did not fail")
    print(f"PASS {c.rank}/{c.size}", flush=True)


@pytest.mark.mpi
@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_the_loop_gives_the_sequential_result_in_a_job(run_cli, n):
    proc = run_cli("run", "-n", str(n), "--timeout", "150", __file__, "ranks", timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"PASS {r}/{n}" in proc.stdout for r in range(n)), out


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_on_engines_the_loop_is_right_and_a_later_graph_sees_earlier_writes():
    """A graph goes to the engines pickled, with its data: each handle comes back
    there as one handle, which the next graph on the same array finds again."""
    from conftest import engines_marker

    with engines_marker(sys.modules[__name__]):
        with tg.Cluster(n=2) as c:
            g, outs = graph_of_the_loop()
            c.run(g).wait()
            check_results(outs)
            x = np.zeros(3)
            with tg.Graph() as g1:
                fill(tg.w(x), 5)
            c.run(g1).wait()
            del g1
            with tg.Graph() as g2:
                scale(tg.rw(x), 2)
                out = snapshot(tg.r(x))
            c.run(g2).wait()
            assert out.result().tolist() == [10.0, 10.0, 10.0]


if __name__ == "__main__" and sys.argv[1:] == ["ranks"]:
    ranks_main()
