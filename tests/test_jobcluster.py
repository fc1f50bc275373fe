"""The job cluster in batch: what a notebook's code meets when every rank runs it.

Each test runs a small script on 2 real MPI ranks; every rank prints what it saw.
"""

from __future__ import annotations

import re
import textwrap

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

PRELUDE = """
import math, sys, time
import taskgraph as tg
from taskgraph.core.errors import GraphError, RunError, TaskError, TaskgraphError

@tg.task
def square(x):
    return x * x

@tg.task
def total(*xs):
    return sum(xs)

@tg.task
def nap(x, seconds=0.3):
    time.sleep(seconds)
    return x

def squares(name="squares", n=6):
    with tg.Graph(name) as g:
        sq = [square(i) for i in range(n)]
        s = total(*sq)
    return g, sq, s

def say(*words):  # one write per line: the ranks' lines do not mix
    line = " ".join(str(w) for w in (f"rank {tg.current_cluster().rank}:", *words))
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()
"""


def script_job(mpirun, tmp_path, body: str, ranks: int = 2, timeout: float = 120):
    """The finished job of ``body`` after PRELUDE on ``ranks`` ranks, which ended well."""
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    proc = mpirun(ranks, [str(script)], timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_script(mpirun, tmp_path, body: str, ranks: int = 2, timeout: float = 120):
    return script_job(mpirun, tmp_path, body, ranks, timeout).stdout


def said(out: str, rank: int, what: str) -> list[str]:
    prefix = f"rank {rank}: {what}"
    return [line[len(prefix) :].strip() for line in out.splitlines() if line.startswith(prefix)]


def test_future_result_fetches_the_value_from_its_rank_on_every_rank(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        """
        c = tg.Cluster(fetch_timeout=3)
        g, sq, s = squares()
        run = c.run(g)
        say("values", [f.result() for f in sq], s.result(), run.result(sq[3]))
        h, cu, t = squares("again", 4)
        c.run(h).wait()
        say("two runs", run.result(sq[5]), [f.result() for f in cu])
        run = c.run(g).wait()  # values fetched per run: fetched again
        if c.rank == 0:  # rank 1 never asks: rank 0 waits 3 s, then fails clearly
            try:
                sq[1].result()
            except RunError as exc:
                say("alone", exc)
        """,
    )
    for rank in (0, 1):
        assert said(out, rank, "values") == ["[0, 1, 4, 9, 16, 25] 55 9"], out
        assert said(out, rank, "two runs") == ["25 [0, 1, 4, 9]"], out
    [alone] = said(out, 0, "alone")
    assert "square#1(1)" in alone and "lives on rank 1" in alone, alone
    assert "did not send it to rank 0 within 3 s" in alone and "every rank must call" in alone


def test_a_second_run_runs_beside_the_first_and_a_cancel_stops_only_it(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        """
        c = tg.Cluster()
        with tg.Graph("slow") as g1:
            a = total(*[nap(i) for i in range(4)])
        g2, sq, s = squares()
        r1, r2 = c.run(g1), c.run(g2)
        say("states", repr(r2))
        say("results", r2.result(), r1.result())
        r3, r4 = c.run(g1), c.run(g2)
        if c.rank == 0:
            r4.cancel("changed my mind")  # on one rank: stopped on every rank, r3 goes on
        r3.wait()
        try:
            r4.wait()
        except RunError as exc:
            say("cancelled", exc)
        say("after", c.run(g2).result())
        """,
    )
    for rank in (0, 1):
        assert said(out, rank, "states") == ["<Run 'squares' on 2 ranks: running>"], out
        assert said(out, rank, "results") == ["55 6"], out
        [cancelled] = said(out, rank, "cancelled")
        assert "changed my mind" in cancelled and "rank 0/2" in cancelled
        assert said(out, rank, "after") == ["55"]


def test_a_cluster_of_fewer_ranks_runs_on_them_only_and_more_is_an_error(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        """
        one = tg.Cluster(n=1)
        say("cluster", one.size, one.member)
        g, sq, s = squares()
        run = one.run(g)
        run.wait()
        if one.member:
            say("member", run.stats.tasks, s.result(), sq[1].result(), run.plan.nranks)
        else:
            say("idle", run.state(), math.isnan(run.seconds))
            try:
                s.result()
            except RunError as exc:
                say("no values", exc)
        one.close()
        try:
            tg.Cluster(n=3)
        except ValueError as exc:
            say("too many", exc)
        run = tg.Cluster().run(g)
        say("whole job", s.result(), sq[1].result())
        """,
    )
    assert said(out, 0, "cluster") == ["1 True"] and said(out, 1, "cluster") == ["1 False"]
    assert said(out, 0, "member") == ["7 55 1 1"], out  # all 7 tasks on the one rank
    assert said(out, 1, "idle") == ["done True"], out
    [no_values] = said(out, 1, "no values")
    assert "rank 1 is not one of the 1 rank(s) of this cluster" in no_values
    for rank in (0, 1):
        [too_many] = said(out, rank, "too many")
        assert "Cluster(n=3) inside an MPI job of 2 rank(s)" in too_many
        assert said(out, rank, "whole job") == ["55 1"]


def test_ranks_that_build_different_graphs_fail_naming_the_first_task(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        """
        c = tg.Cluster()
        rank = c.rank
        with tg.Graph("differs") as g:  # like a random number drawn without a seed
            sq = [square(i + (rank if i == 3 else 0)) for i in range(6)]
            s = total(*sq)
        try:
            c.run(g).wait()
        except GraphError as exc:
            say("differs", str(exc).replace("\\n", " | "))
        g, sq, s = squares()
        say("after", c.run(g).result())
        """,
    )
    for rank in (0, 1):
        [differs] = said(out, rank, "differs")
        assert "task 3 is the first that differs" in differs, differs
        assert "square#3(3)" in differs and "square#3(4)" in differs, differs
        assert said(out, rank, "after") == ["55"]


def test_task_timeout_ends_a_stuck_run_on_every_rank(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        """
        c = tg.Cluster()
        with tg.Graph("stuck") as g:
            s = total(*[nap(i, 60) for i in range(2)])
        t0 = time.monotonic()
        try:
            c.run(g, task_timeout=1).wait()
        except TaskgraphError as exc:
            say("stopped", round(time.monotonic() - t0), type(exc).__name__, exc)
        g, sq, s = squares()
        say("after", c.run(g).result())
        """,
    )
    for rank in (0, 1):
        [stopped] = said(out, rank, "stopped")
        seconds = int(stopped.split()[0])
        assert seconds < 30 and "timed out after 1 s" in stopped, stopped
        assert re.search(r"nap#\d", stopped), stopped
        assert said(out, rank, "after") == ["55"]


TWO_RUNS = """
import numpy as np

@tg.task
def summed(x, k):
    return float(x.sum()) + k

x = np.ones(4)
with tg.Graph("twice") as g:
    parts = [summed(x, k) for k in range(2)]
    s = total(*parts)
"""


def test_two_runs_of_one_graph_keep_their_own_values(mpirun, tmp_path):
    out = run_script(
        mpirun,
        tmp_path,
        TWO_RUNS
        + """
c = tg.Cluster()
first = c.run(g).wait()
x[:] = 2  # the second run's input
second = c.run(g).wait()
say("first", first.result(parts[1]), first.result(s), first.result())
say("second", second.result(parts[1]), second.result(s), s.result(), parts[0].result())
""",
    )
    for rank in (0, 1):
        assert said(out, rank, "first") == ["5.0 9.0 9.0"], out
        assert said(out, rank, "second") == ["9.0 17.0 17.0 8.0"], out


def test_two_runs_of_one_graph_keep_their_own_values_in_process():
    space: dict = {}
    exec(PRELUDE + TWO_RUNS, space)
    g, x, parts, s = (space[k] for k in ("g", "x", "parts", "s"))
    c = space["tg"].Cluster()
    first = c.run(g).wait()
    x[:] = 2
    second = c.run(g).wait()
    assert (first.result(parts[1]), first.result(s)) == (5.0, 9.0)
    assert (second.result(parts[1]), second.result(s)) == (9.0, 17.0)
    assert s.result() == 17.0 and g.last_run is second


def test_a_rank_whose_script_ends_during_a_run_waits_for_it_and_the_job_ends(mpirun, tmp_path):
    """rank 1 leaves ``wait()`` to rank 0, and rank 0 never closes its open run: the
    job hung in MPI_Finalize with no word (a trial, 5 of 5). Each rank now waits for
    its runs at the script's end, and says so."""
    body = """
        c = tg.Cluster()
        with tg.Graph("slow") as g:
            a = total(*[nap(i, 0.2) for i in range(6)])
        run = c.run(g)
        ens = c.run(open=True)
        if c.rank == 0:
            run.wait()
            say("total", run.result(a), [f.result() for f in [ens.submit(abs, -3)]])
        say("ends")
        """
    proc = script_job(mpirun, tmp_path, body, timeout=60)
    assert said(proc.stdout, 0, "total") == ["15 [3]"], proc.stdout
    assert said(proc.stdout, 1, "ends") == [""], proc.stdout
    for rank in (0, 1):  # (rank 1's part of 'slow' may have ended by then)
        note = f"rank {rank}/2: the script ended while run 'ensemble' was running: waiting"
        assert note in proc.stderr, proc.stderr


def test_a_run_whose_wait_ran_out_is_cancelled_when_the_script_ends(mpirun, tmp_path):
    """The script gave up on a stuck run (its wait(timeout) raised, caught) and ended:
    the exit hook waited for it for ever (a review); it now cancels it."""
    body = """
        c = tg.Cluster()
        with tg.Graph("stuck") as g:
            nap(0, 600)
        run = c.run(g)
        try:
            run.wait(timeout=1)
        except TimeoutError as exc:
            say("gave up", exc)
        """
    proc = script_job(mpirun, tmp_path, body, timeout=40)
    assert said(proc.stdout, 0, "gave up") == ["run of 'stuck' still running after 1 s"]
    assert "the script ended after giving up on run 'stuck': cancelled" in proc.stderr
