"""Several runs in flight on one cluster: in a batch job (2 and 3 real MPI ranks, every
rank running the same script) and on 2 real ipyparallel engines.

The runs are made to overlap for sure: a task of one run waits for a file that a task
of the other run (or the script, once it has seen both running) writes. Run one after
the other, the first would wait for ever (its task gives up after 30 s and fails).
"""

from __future__ import annotations

import textwrap
import threading

import pytest
from conftest import job_marker
from test_jobcluster import PRELUDE, said

import taskgraph as tg
from taskgraph.cluster.jobrun import blas_limit
from taskgraph.cluster.overlap import footprint, left_stale, must_wait

FLAGS = """
import os
import numpy as np

@tg.task
def after(path, x):  # waits for another run (or the script) to write ``path``
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared: the runs did not overlap")
        time.sleep(0.01)
    return x

@tg.task
def flag(path, x):
    open(path, "a").close()
    return x

@tg.task
def broken(x):
    raise ValueError("deliberate failure")

@tg.task
def add_into(y, x):
    y += x

def released(path):  # the script lets a run go on (every rank: the same file)
    open(path, "a").close()
"""


def run_job(mpirun, tmp_path, ranks: int, body: str) -> str:
    script = tmp_path / "script.py"
    flags = tmp_path / "flags"
    flags.mkdir()
    script.write_text(PRELUDE + FLAGS + f"F = {str(flags)!r} + '/'\n" + textwrap.dedent(body))
    proc = mpirun(ranks, [str(script)], timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_two_runs_in_flight_in_a_batch_job_and_one_that_fails(mpirun, tmp_path, ranks):
    out = run_job(
        mpirun,
        tmp_path,
        ranks,
        """
        c = tg.Cluster()
        x, y = np.zeros(3), np.zeros(3)
        with tg.Graph("first") as g1:  # ends once the second run got past its gate
            a = total(*[after(F + "a", i) for i in range(4)])
            add_into(tg.rw(x), a)
        with tg.Graph("second") as g2:  # waits for the script, then lets the first go
            b = flag(F + "a", total(*[square(after(F + "b", i)) for i in range(4)]))
            add_into(tg.rw(y), b)
        r1, r2 = c.run(g1), c.run(g2)
        say("states", r1.state(), r2.state())
        released(F + "b")
        say("results", r2.result(b), r1.result(a), r1.state(), r2.state())
        say("data", x.tolist(), y.tolist())
        # a run that fails leaves the other one running, and correct
        with tg.Graph("waits") as g3:
            w = total(*[square(after(F + "c", i)) for i in range(5)])
        with tg.Graph("fails") as g4:
            broken(square(2))
        r3, r4 = c.run(g3), c.run(g4)
        try:
            r4.wait(60)
        except TaskError as exc:
            say("failed", "deliberate failure" in str(exc), r3.state())
        released(F + "c")
        say("other", r3.result(), r3.state(), r4.state())
        say("third", c.run(squares()[0]).result())
        """,
    )
    for rank in range(ranks):
        assert said(out, rank, "states") == ["running running"], out
        assert said(out, rank, "results") == ["14 6 done done"], out
        assert said(out, rank, "data") == ["[6.0, 6.0, 6.0] [14.0, 14.0, 14.0]"], out
        assert said(out, rank, "failed") == ["True running"], out
        assert said(out, rank, "other") == ["30 done failed"], out
        assert said(out, rank, "third") == ["55"], out


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_cancel_one_run_while_another_completes_in_a_batch_job(mpirun, tmp_path, ranks):
    out = run_job(
        mpirun,
        tmp_path,
        ranks,
        """
        c = tg.Cluster()
        with tg.Graph("stuck") as g1:
            s = total(*[after(F + "never", i) for i in range(4)])
        g2, sq, t = squares("goes on", 5)
        r1, r2 = c.run(g1), c.run(g2)
        if c.rank == 0:
            r1.cancel("changed my mind")  # on one rank: stopped on every rank
        say("goes on", r2.result(), r2.state())
        released(F + "never")  # (a task that is in its loop ends)
        try:
            r1.wait(60)
        except RunError as exc:
            say("cancelled", "changed my mind" in str(exc), r1.state())
        say("third", c.run(squares()[0]).result())
        """,
    )
    for rank in range(ranks):
        assert said(out, rank, "goes on") == ["30 done"], out
        assert said(out, rank, "cancelled") == ["True failed"], out
        assert said(out, rank, "third") == ["55"], out


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_a_run_that_writes_what_a_running_run_uses_is_queued_behind_it(mpirun, tmp_path):
    out = run_job(
        mpirun,
        tmp_path,
        2,
        """
        c = tg.Cluster()
        x = np.zeros(3)
        with tg.Graph("writes x") as g1:
            add_into(tg.rw(x), after(F + "go", 1))
        with tg.Graph("reads x") as g2:
            add_into(tg.rw(x), 10)
        r1, r2 = c.run(g1), c.run(g2)
        say("states", r1.state(), r2.state())
        released(F + "go")
        r2.wait(60)
        say("x", x.tolist(), r1.state())
        """,
    )
    for rank in (0, 1):
        assert said(out, rank, "states") == ["running queued"], out
        assert said(out, rank, "x") == ["[11.0, 11.0, 11.0] done"], out


def test_a_run_queued_behind_one_that_fails_is_not_run_on_its_data(mpirun, tmp_path):
    """The run it waited for wrote x half-way and failed: the queued run read it with no
    word (a trial); it now fails on every rank, naming the run and the data."""
    out = run_job(
        mpirun,
        tmp_path,
        2,
        """
        c = tg.Cluster()
        x = tg.Data(np.zeros(3), name="x")
        with tg.Graph("writes x") as g1:
            add_into(tg.rw(x), broken(after(F + "go", 1)))
        with tg.Graph("reads x") as g2:
            add_into(tg.rw(x), 10)
        r1, r2 = c.run(g1), c.run(g2)
        released(F + "go")
        for r in (r1, r2):
            try:
                r.wait(60)
                say(r.graph.name, "ended well")
            except tg.TaskgraphError as exc:
                say(r.graph.name, type(exc).__name__, " ".join(str(exc).split()))
        say("next", c.run(g2).wait(60).state())
        """,
    )
    for rank in (0, 1):
        [first] = said(out, rank, "writes x")
        assert first.startswith("TaskError") and "deliberate failure" in first, out
        assert said(out, rank, "reads x") == [
            "RunError run 'reads x' not run: it was queued behind run 'writes x', which "
            "failed (TaskError) and writes data it uses (x); run it again once that data "
            "is right"
        ], out
        assert said(out, rank, "next") == ["done"], out


# -- pure decisions, no MPI -------------------------------------------------------------


@tg.task
def _scale(y, k):
    y *= k


@tg.task
def _read(y):
    return float(y.sum())


@tg.task
def _fill(y):
    y[:] = 0


def test_runs_overlap_only_through_data_one_of_them_writes():
    import numpy as np

    x, y = np.ones(2), np.ones(2)
    with tg.Graph() as writes_x:
        _scale(tg.rw(x), 2)
    with tg.Graph() as reads_x:
        _read(tg.r(x))
    with tg.Graph() as reads_x_too:
        _read(tg.r(x))
    with tg.Graph() as writes_y:
        _scale(tg.rw(y), 2)
    fx, rx, rx2, fy = (footprint(g) for g in (writes_x, reads_x, reads_x_too, writes_y))
    assert must_wait(fx, rx) and must_wait(rx, fx)
    assert not must_wait(rx, rx2), "two readers run at once"
    assert not must_wait(fx, fy) and not must_wait(fy, fx)
    assert left_stale(fx, rx) and not left_stale(rx, fx), "only what the failed run writes"
    with tg.Graph() as overwrites_x:
        _fill(tg.w(x))
    assert not left_stale(fx, footprint(overwrites_x)), "a run that only writes it may run"


def test_the_blas_limit_holds_until_the_last_run_in_flight_ends():
    from threadpoolctl import threadpool_info

    def blas() -> set[int]:
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    before = blas()
    if not before or max(before) < 2:
        pytest.skip("BLAS runs one thread here already")
    first, second = blas_limit(1), blas_limit(1)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first run ends: the second still runs
    assert blas() == {1}
    second.__exit__(None, None, None)
    assert blas() == before
    with blas_limit(2), blas_limit(1):
        assert blas() == {1}, "the smallest limit among the runs in flight holds"
    assert blas() == before and threading.active_count() >= 1


# -- on 2 real ipyparallel engines --------------------------------------------------------


@pytest.fixture(scope="module")
def engines():
    with job_marker(), tg.Cluster(n=2) as c:
        yield c


@tg.task
def _after(path, x):
    """Waits for another run (or the test) to write ``path``."""
    import os
    import time

    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared: the runs did not overlap")
        time.sleep(0.01)
    return x


@tg.task
def _flag(path, x):
    open(path, "a").close()
    return x


@tg.task
def _square(x):
    return x * x


@tg.task
def _total(*xs):
    return sum(xs)


@tg.task
def _broken(x):
    raise ValueError("deliberate failure")


@tg.task
def _add_into(y, x):
    y += x


def _release(path) -> None:
    open(path, "a").close()


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_two_runs_in_flight_on_engines_one_fails_one_is_cancelled(engines, tmp_path):
    import numpy as np

    f = str(tmp_path) + "/"
    x, y = np.zeros(3), np.zeros(3)
    with tg.Graph("first") as g1:
        a = _total(*[_after(f + "a", i) for i in range(4)])
        _add_into(tg.rw(x), a)
    with tg.Graph("second") as g2:
        b = _flag(f + "a", _total(*[_square(_after(f + "b", i)) for i in range(4)]))
        _add_into(tg.rw(y), b)
    r1, r2 = engines.run(g1), engines.run(g2)
    assert (r1.state(), r2.state()) == ("running", "running")
    _release(f + "b")
    assert (r2.result(b), r1.result(a)) == (14, 6)
    assert x.tolist() == [6.0] * 3 and y.tolist() == [14.0] * 3
    # one fails: the other goes on
    with tg.Graph("waits") as g3:
        w = _total(*[_square(_after(f + "c", i)) for i in range(5)])
    with tg.Graph("fails") as g4:
        _broken(_square(2))
    r3, r4 = engines.run(g3), engines.run(g4)
    with pytest.raises(tg.TaskError, match="deliberate failure"):
        r4.wait(60)
    assert r3.state() == "running"
    _release(f + "c")
    assert r3.result(w) == 30 and r3.state() == "done" and r4.state() == "failed"
    # one cancelled: the other completes
    with tg.Graph("stuck") as g5:
        _total(*[_after(f + "never", i) for i in range(4)])
    with tg.Graph("goes on") as g6:
        s = _total(*[_square(i) for i in range(5)])
    r5, r6 = engines.run(g5), engines.run(g6)
    r5.cancel("changed my mind")
    assert r6.result(s) == 30
    _release(f + "never")
    with pytest.raises(tg.RunError, match="changed my mind"):
        r5.wait(60)
    # and a third run works
    with tg.Graph("third") as g7:
        t = _total(*[_square(i) for i in range(6)])
    assert engines.run(g7).result(t) == 55
