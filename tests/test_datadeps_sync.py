"""Plain data after a run: the values the caller holds are the truth at the start; when
a run ends well, each datum it wrote holds its final value on every rank of a job, on
every engine and in the notebook (taskgraph.dsl.datadeps, taskgraph.cluster.jobrun).

The job checks run in a real 3-rank job (this file is also the ranks' script), the
engine checks on 2 real ipyparallel engines.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.dsl.datadeps import settle, update_in_place, written_data

pytestmark = pytest.mark.timeout(60)


@tg.task
def fill(out, k):
    out[...] = k


@tg.task
def add_one(x):
    x += 1


@tg.task
def extend(log, item):
    log.append(item)


@tg.task
def note(box, key, value):
    box.items[key] = value


@tg.task
def fail(x):
    raise ValueError(f"deliberate failure after reading {x.tolist()}")


@tg.task
def snapshot(x):
    return x.copy()


class Box:
    """An object updated in place through its ``__dict__``."""

    def __init__(self):
        self.items = {}


# -- in place, in this process -------------------------------------------------------------


def test_update_in_place_keeps_the_object_and_says_when_it_cannot():
    a = np.zeros(3)
    assert update_in_place(a, np.arange(3.0)) and a.tolist() == [0.0, 1.0, 2.0]
    assert not update_in_place(a, np.zeros(4)) and a.tolist() == [0.0, 1.0, 2.0]
    log, d, s, ba = [1], {"a": 1}, {1}, bytearray(b"ab")
    assert update_in_place(log, [2, 3]) and log == [2, 3]
    assert update_in_place(d, {"b": 2}) and d == {"b": 2}
    assert update_in_place(s, {4}) and s == {4}
    assert update_in_place(ba, bytearray(b"xyz")) and ba == b"xyz"
    box, new = Box(), Box()
    new.items["k"] = 1
    assert update_in_place(box, new) and box.items == {"k": 1}
    assert not update_in_place((1, 2), (3, 4))
    assert not update_in_place([1], OrderedDict())


def test_settle_replaces_what_cannot_change_in_place():
    t = tg.Data((1, 2))
    settle(t, (3, 4))
    assert t.value == (3, 4) and tg.Data(t.value) is t


def test_a_graph_without_plain_data_has_nothing_to_share():
    a = np.zeros(2)
    with tg.Graph() as g:
        fill(tg.w(a), 1)
        snapshot(tg.r(a))
    assert written_data(g, {0: 0}) == [0]
    with tg.Graph() as g2:
        snapshot(np.zeros(2))
    assert written_data(g2, {}) == []


# -- a 3-rank job ------------------------------------------------------------------------


def ranks_main() -> None:
    """Every rank checks the data after each run; prints PASS."""
    c = tg.current_cluster()
    assert c.size == 3, c.size
    a, b = np.zeros(4), np.zeros((2, 3), dtype=np.int32)
    log, box = [], Box()
    ids = [id(a), id(b), id(log), id(box)]
    with tg.Graph("first") as g:
        fill(tg.w(tg.Data(a, rank=1)), 3)
        fill(tg.w(tg.Data(b, rank=2)), 5)
        extend(tg.rw(tg.Data(log, rank=2)), "x")
        note(tg.rw(tg.Data(box, rank=1)), "k", c.size)
    c.run(g).wait()
    where = f"rank {c.rank}"
    assert a.tolist() == [3.0] * 4, (where, a)
    assert b.tolist() == [[5] * 3] * 2, (where, b)
    assert log == ["x"] and box.items == {"k": 3}, (where, log, box.items)
    assert [id(a), id(b), id(log), id(box)] == ids, "not updated in place"
    del g
    tg.Data(a).rank = 2  # (another home for a: the next graph runs its writer there)
    with tg.Graph("second") as g2:
        add_one(tg.rw(a))
        extend(tg.rw(log), "y")
    c.run(g2).wait()
    assert a.tolist() == [4.0] * 4, (where, a)
    assert log == ["x", "y"], (where, log)
    with tg.Graph("failing") as g3:
        fill(tg.w(a), 9)
        fill(tg.w(b), 7)
        fail(tg.r(a))
    try:
        c.run(g3).wait()
    except tg.TaskError as e:
        assert "deliberate failure" in str(e), str(e)
    else:
        raise AssertionError("the failing graph did not fail")
    if c.rank != 2:  # (on its home the writer ran: what it wrote stays there)
        assert a.tolist() == [4.0] * 4, (where, a)
    if c.rank != 2:
        assert b.tolist() == [[5] * 3] * 2, (where, b)
    print(f"PASS {c.rank}/{c.size}", flush=True)


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_in_a_job_every_rank_sees_what_the_run_wrote(run_cli):
    proc = run_cli("run", "-n", "3", "--timeout", "100", __file__, "ranks", timeout=130)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert all(f"PASS {r}/3" in proc.stdout for r in range(3)), out


# -- 2 engines -------------------------------------------------------------------------------


ENGINE_VALUE = "__import__('taskgraph.dsl.datadeps').dsl.datadeps._by_uid[key].value.tolist()"


def engine_values(c, item) -> list:
    """The value of ``item``'s handle on each engine, as lists (by eval: the engines
    cannot import this file)."""
    return c.view.apply_sync(eval, ENGINE_VALUE, {"key": (item.origin, item.uid)})


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_on_engines_the_notebook_holds_the_result_and_its_changes_are_seen():
    from conftest import engines_marker

    with engines_marker(sys.modules[__name__]):
        with tg.Cluster(n=2) as c:
            check_engines(c)


def check_engines(c) -> None:
    x, log = np.zeros(3), []
    dx = tg.Data(x, rank=1)
    with tg.Graph() as g1:
        fill(tg.w(dx), 5)
        extend(tg.rw(tg.Data(log, rank=1)), "a")
    c.run(g1).wait()
    assert x.tolist() == [5.0] * 3 and log == ["a"]
    assert engine_values(c, dx) == [[5.0] * 3] * 2
    x[:] = 1  # a change in the notebook: the next run starts from it
    with tg.Graph() as g2:
        add_one(tg.rw(x))
        out = snapshot(tg.r(x))
    c.run(g2).wait()
    assert out.result().tolist() == [2.0] * 3
    assert x.tolist() == [2.0] * 3
    assert engine_values(c, dx) == [[2.0] * 3] * 2
    with tg.Graph() as g3:
        fill(tg.w(x), 9)
        fail(tg.r(x))
    with pytest.raises(tg.TaskError, match="deliberate failure"):
        c.run(g3).wait()
    assert x.tolist() == [2.0] * 3  # a failed run changes nothing here
    r4 = c.run(g2)  # (queued: a run still going writes x)
    r5 = c.run(g2)
    r5.wait()
    r4.wait()
    assert x.tolist() == [4.0] * 3, x


if __name__ == "__main__" and sys.argv[1:] == ["ranks"]:
    ranks_main()
