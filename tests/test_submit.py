"""Calls added to a running run (``run.submit``) and ``tg.as_completed``: in a batch job
on 1, 2 and 3 real MPI ranks (every rank runs the script; rank 0 submits) and from the
notebook's side on 2 real ipyparallel engines.

An adaptive ensemble: a first batch, then a second batch made from the first's results
as they arrive; a failing call fails its future only; a run that has ended refuses
calls; a cancelled run fails its pending futures, and the next run works.
"""

from __future__ import annotations

import re
import sys
import textwrap
import time

import pytest
from conftest import engines_marker

import taskgraph as tg

BATCH = """
import os, time
import taskgraph as tg

def square(x):
    time.sleep(0.002)
    return x * x

def inc(x):
    return x + 1

def bad(x):
    raise ValueError(f"deliberate {x}")

@tg.task
def gate(path, x):  # the graph's task: goes on until the script lets it end
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)
    return x

def say(*words):
    line = " ".join(str(w) for w in (f"rank {c.rank}:", *words))  # (c: the script's cluster)
    print(line, flush=True)  # (one write: the ranks' lines do not mix)
"""


def run_job(mpirun, tmp_path, ranks: int, body: str) -> str:
    script = tmp_path / "script.py"
    script.write_text(BATCH + f"F = {str(tmp_path)!r} + '/'\n" + textwrap.dedent(body))
    proc = mpirun(ranks, [str(script)], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_an_adaptive_ensemble_submits_to_an_open_run_in_a_batch_job(mpirun, tmp_path, ranks):
    out = run_job(
        mpirun,
        tmp_path,
        ranks,
        """
        c = tg.Cluster()
        run = c.run(open=True)  # no graph: submitted calls only
        if c.rank == 0:
            first = [run.submit(square, i) for i in range(12)]
            second = [run.submit(inc, f.result()) for f in tg.as_completed(first, timeout=30)]
            failing = run.submit(bad, 7)
            values = sorted(f.result() for f in tg.as_completed(second, timeout=30))
            say("values", values)
            try:
                failing.result()
            except tg.TaskError as exc:
                say("failed", str(exc).splitlines()[0])
            say("after", run.submit(square, 5).result(), run.state())
        run.wait(30)
        try:
            run.submit(square, 1)
        except tg.RunError as exc:
            say("refused", exc)
        say("submitted", run.stats.spawned)
        """,
    )
    assert f"rank 0: values {sorted(i * i + 1 for i in range(12))}" in out
    assert re.search(rf"rank 0: failed task bad\(7\) on rank \d/{ranks} .*deliberate 7", out)
    assert "rank 0: after 25 running" in out
    for r in range(ranks):
        assert f"rank {r}: refused run 'ensemble' has ended on rank {r}/{ranks}" in out
    assert "rank 0: submitted 26" in out


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_submit_works_while_a_run_of_a_graph_goes_on_in_a_batch_job(mpirun, tmp_path, ranks):
    out = run_job(
        mpirun,
        tmp_path,
        ranks,
        """
        c = tg.Cluster()
        with tg.Graph("gated") as g:
            s = [gate(F + "go", i) for i in range(c.size)]  # (one a rank)
        run = c.run(g, workers=2)  # not open: takes calls while it goes (a worker free)
        if c.rank == 0:
            futs = [run.submit(square, i) for i in range(6)]
            say("values", sorted(f.result() for f in tg.as_completed(futs, timeout=30)))
            open(F + "go", "a").close()
        run.wait(30)
        say("gates", [f.result() for f in s])
        try:
            run.submit(square, 1)
        except tg.RunError as exc:
            say("refused", exc)
        """,
    )
    assert "rank 0: values [0, 1, 4, 9, 16, 25]" in out
    for r in range(ranks):
        assert f"rank {r}: gates {list(range(ranks))}" in out
        assert f"rank {r}: refused run 'gated' has ended on rank {r}/{ranks}" in out


def test_as_completed_yields_in_finishing_order_and_times_out():
    c = tg.Cluster()
    run = c.run(open=True)
    slow, fast = run.submit(time.sleep, 0.5), run.submit(abs, -3)
    assert list(tg.as_completed([slow, fast], timeout=10)) == [fast, slow]
    stuck = run.submit(time.sleep, 1.5)
    with pytest.raises(TimeoutError, match="1 of the futures have not ended after 0.1 s"):
        list(tg.as_completed([fast, stuck], timeout=0.1))
    run.wait(10)
    with pytest.raises(tg.RunError, match="has ended"):
        run.submit(abs, 1)
    with pytest.raises(tg.RunError, match="needs a graph, unless open=True"):
        c.run()


# -- on 2 real ipyparallel engines --------------------------------------------------------


@pytest.fixture(scope="module")
def engines():
    with engines_marker(sys.modules[__name__]), tg.Cluster(n=2) as c:
        yield c


def _square(x):
    time.sleep(0.002)
    return x * x


def _inc(x):
    return x + 1


def _bad(x):
    raise ValueError(f"deliberate {x}")


def _stuck(x):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return x


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_an_adaptive_ensemble_submits_from_the_notebook_to_engines(engines):
    run = engines.run(open=True)
    first = [run.submit(_square, i) for i in range(12)]
    assert {f.rank for f in first} == {0, 1}  # round-robin
    second = [run.submit(_inc, f.result()) for f in tg.as_completed(first, timeout=30)]
    failing = run.submit(_bad, 7)
    values = sorted(f.result(timeout=30) for f in tg.as_completed(second, timeout=30))
    assert values == sorted(i * i + 1 for i in range(12))
    with pytest.raises(tg.TaskError, match=r"_bad\(7\) on rank \d/2 .*deliberate 7") as info:
        failing.result(timeout=30)
    assert "_bad" in info.value.traceback and isinstance(failing.exception(), tg.TaskError)
    # (this module's function went by value: its file and line, not "<dynamic-code>")
    assert 'test_submit.py", line' in info.value.traceback, info.value.traceback
    assert 'raise ValueError(f"deliberate {x}")' in info.value.traceback
    assert isinstance(failing.exception(), ValueError)  # (its own class, in the notebook too)
    assert run.submit(_square, 5).result(timeout=30) == 25 and run.state() == "running"
    run.wait(30)
    assert run.stats.spawned == 26
    with pytest.raises(tg.RunError, match="has ended"):
        run.submit(_square, 1)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_cancelled_run_fails_its_pending_submitted_calls_and_the_next_run_works(engines):
    run = engines.run(open=True)
    done = run.submit(_square, 3)
    assert done.result(timeout=30) == 9
    pending = [run.submit(_stuck, i) for i in range(4)]
    time.sleep(0.2)
    run.cancel("enough")
    t0 = time.monotonic()
    for f in pending:
        with pytest.raises(tg.RunError, match="enough"):
            f.result(timeout=20)
    assert time.monotonic() - t0 < 15
    with pytest.raises(tg.RunError, match="enough"):
        run.wait(30)
    assert done.result() == 9
    with pytest.raises(tg.RunError):
        run.submit(_square, 1)
    again = engines.run(open=True)
    assert [f.result(timeout=30) for f in [again.submit(_square, i) for i in range(4)]] == [
        0,
        1,
        4,
        9,
    ]
    again.wait(30)
