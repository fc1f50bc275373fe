"""Graph fingerprints (taskgraph.dsl.fingerprint): equal for equal graphs in any process,
different when a task, its function, data, edges or arguments differ, and the first
differing task named on every rank. The cross-rank check runs over threads (an
allgather made of a barrier) and over mpiexec with mpi4py's allgather (this file is
also the ranks' script)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.fingerprint import (
    BLOCK,
    compare_ranks,
    describe_task,
    fingerprint,
    first_difference,
    task_codes,
)

pytestmark = pytest.mark.timeout(60)

ONE_RANK = types.SimpleNamespace(rank=0, size=1)


@tg.task
def f(*args, **kwargs):
    return args


@tg.task
def g(*args, **kwargs):
    return args


def futures_graph(x=3, last=("a", "b"), fn=f, array=None, extra_edge=False) -> tg.Graph:
    """::

    f(1, 'one') -> f(<0>, x, 2.5) -> f([<0>, <1>], {'k': <1>}, last, s={..})
                                   \\-> fn(<1>, array)
    """
    with tg.Graph("fp") as gr:
        a = f(1, "one")
        b = f(a, x, 2.5)
        f([a, b], {"k": b}, last, s={"p", "q", "r"})
        c = fn(b, array if array is not None else np.arange(6.0).reshape(2, 3))
        if extra_edge:
            gr.add_dependency(a, c)
    return gr


def matrix_graph(dtype=np.float64, tile=(1, 0)) -> tg.Graph:
    """potrf(A[0,0]) -> trsm(A[0,0], A[1,0]);  f(A[tile]) reads a tile."""
    from taskgraph.kernels import potrf, trsm

    A = tg.TiledMatrix(6, 2, dtype, cluster=ONE_RANK)
    with tg.Graph("tiles") as gr:
        potrf(A[0, 0].rw)
        trsm(A[0, 0].r, A[1, 0].rw)
        f(A[tile])
    return gr


# -- what the fingerprint covers -------------------------------------------------------


def test_equal_graphs_have_equal_fingerprints():
    assert fingerprint(futures_graph()) == fingerprint(futures_graph())
    nan = futures_graph(x=float("nan"), last=(float("nan"),))
    assert fingerprint(nan) == fingerprint(futures_graph(x=float("nan"), last=(float("nan"),)))
    # matrices made again have new uids, and the same geometry
    assert fingerprint(matrix_graph()) == fingerprint(matrix_graph())


@pytest.mark.parametrize(
    "change",
    [
        {"x": 4},  # a constant
        {"x": 3.0},  # an int or a float
        {"last": ("a", "c")},  # a constant inside a container
        {"fn": g},  # the function (same signature, another name)
        {"array": np.arange(6.0).reshape(2, 3) + 1},  # an array's data
        {"array": np.arange(6.0).reshape(3, 2)},  # an array's shape
        {"array": np.arange(6).reshape(2, 3)},  # an array's dtype
        {"extra_edge": True},  # an edge
    ],
    ids=lambda c: next(iter(c)) + "=" + type(next(iter(c.values()))).__name__,
)
def test_a_difference_in_arguments_function_or_edges_changes_the_fingerprint(change):
    assert fingerprint(futures_graph(**change)).digest != fingerprint(futures_graph()).digest


@pytest.mark.parametrize("change", [{"dtype": np.float32}, {"tile": (2, 0)}])
def test_a_difference_in_data_changes_the_fingerprint(change):
    assert fingerprint(matrix_graph(**change)).digest != fingerprint(matrix_graph()).digest


def test_the_same_function_name_in_another_scope_differs():
    def make():
        @tg.task
        def f(*args):  # the point: the same name, another qualified name
            return args

        return f

    assert fingerprint(futures_graph(fn=make())).digest != fingerprint(futures_graph()).digest


def test_fingerprints_are_equal_in_processes_with_other_hash_seeds():
    """str hashes are salted per process: the fingerprint must not depend on them."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import test_fingerprint as t; "
        "print(t.fingerprint(t.futures_graph()).digest.hex(), "
        "t.fingerprint(t.matrix_graph()).digest.hex())"
    )
    outs = set()
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=os.path.dirname(os.path.dirname(__file__)),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout.strip())
    assert len(outs) == 1, outs


# -- naming the first difference --------------------------------------------------------


def chain(n: int, odd_at: int | None = None) -> tg.Graph:
    """f(0) -> f(<0>, 1) -> f(<1>, 2) -> ...; task ``odd_at`` gets -1 instead."""
    with tg.Graph("chain") as gr:
        prev = f(0)
        for i in range(1, n):
            prev = f(prev, -1 if i == odd_at else i)
    return gr


def test_block_digests_find_the_block_and_codes_the_task():
    n, odd = 3 * BLOCK + 10, 2 * BLOCK + 7
    a, b = chain(n), chain(n, odd_at=odd)
    fa, fb = fingerprint(a), fingerprint(b)
    assert len(fa.blocks) == 4 and fa.ntasks == n
    block = first_difference([fa.blocks, fb.blocks])
    assert block == 2
    start = block * BLOCK
    codes = [task_codes(x, start, start + BLOCK) for x in (a, b)]
    assert start + first_difference(codes) == odd


def test_first_difference_counts_a_missing_item_as_different():
    assert first_difference([[1, 2], [1, 2]]) is None
    assert first_difference([[1, 2], [1, 2, 3]]) == 2
    assert first_difference([[1, 2], [1, 5], [1, 2]]) == 1


def threads_allgather(n: int):
    """n allgather functions, one per thread, that meet at a barrier."""
    barrier = threading.Barrier(n, timeout=10)
    slots: list = [None] * n

    def make(rank):
        def allgather(obj):
            slots[rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        return allgather

    return [make(r) for r in range(n)]


def compare_on_threads(graphs: list) -> list:
    """compare_ranks on one thread per graph, as ranks would call it."""
    gathers = threads_allgather(len(graphs))
    out: list = [None] * len(graphs)

    def rank(r):
        out[r] = compare_ranks(graphs[r], gathers[r])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(graphs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    return out


def test_equal_graphs_on_every_rank_pass():
    assert compare_on_threads([chain(50), chain(50), chain(50)]) == [None, None, None]


def test_a_mismatch_names_the_first_differing_task_on_both_ranks():
    n = BLOCK + 20
    msgs = compare_on_threads([chain(n), chain(n, odd_at=BLOCK + 3), chain(n)])
    assert msgs[0] == msgs[1] == msgs[2]  # every rank gets the same message
    text = msgs[0]
    assert f"task {BLOCK + 3} is the first that differs" in text
    assert f"ranks 0, 2: f#{BLOCK + 3}(<task {BLOCK + 2}>, {BLOCK + 3})" in text
    assert f"rank 1: f#{BLOCK + 3}(<task {BLOCK + 2}>, -1)" in text


def test_a_graph_with_more_tasks_is_named_with_the_counts():
    text = compare_on_threads([chain(10), chain(12)])[0]
    assert "task 10 is the first that differs" in text
    assert "task counts by rank: [10, 12]" in text
    assert "rank 0: no task 10 (the graph has 10 tasks)" in text


def test_a_difference_the_label_does_not_show_is_said_so():
    a = futures_graph()
    b = futures_graph(array=np.arange(6.0).reshape(2, 3) + 1)
    text = compare_on_threads([a, b])[0]
    assert "task 3 is the first that differs" in text
    assert "the description does not show" in text
    assert "<float64 array (2, 3)>" in text


def test_describe_task_names_the_function_by_module_and_qualified_name():
    text = describe_task(futures_graph(), 1)
    assert text.startswith("f#1(<task 0>, 3, 2.5) [test_fingerprint.f]")


# -- two ranks ----------------------------------------------------------------------------


def ranks_main() -> None:
    """Every rank checks an equal graph, then one that differs on rank 1; prints PASS."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert compare_ranks(chain(2000), comm.allgather) is None
    text = compare_ranks(chain(2000, odd_at=1500 if comm.rank == 1 else None), comm.allgather)
    assert text is not None and "task 1500 is the first that differs" in text, text
    assert "rank 1: f#1500(<task 1499>, -1)" in text, text
    print(f"PASS {comm.rank}/{comm.size}", flush=True)


@pytest.mark.mpi
def test_two_ranks_name_the_first_differing_task(mpirun):
    proc = mpirun(2, [__file__, "ranks"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS 0/2" in proc.stdout and "PASS 1/2" in proc.stdout, proc.stdout + proc.stderr


if __name__ == "__main__" and sys.argv[1:] == ["ranks"]:
    ranks_main()
