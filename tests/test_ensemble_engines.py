"""Ensembles from a notebook, on 2 real ipyparallel engines (one cluster for the file,
made with ``cores=1`` and 2 workers an engine): a flaky task retried, a skipped task and
its dependent, a shell command feeding a Python task, a process task; ``run.summary()``
counts and errors merged from the engines, the retried attempt in ``run.trace``, a run
resumed from its checkpoint, a task asking more cores than ``Cluster(cores=1)`` gives
refused before anything runs, and no engine or pool process left after ``close()``.
A job's ``close()`` ends its process pool too."""

from __future__ import annotations

import html
import os
import sys
import time
from multiprocessing import resource_tracker
from pathlib import Path

import psutil
import pytest

import taskgraph as tg
from taskgraph.cluster.job import JobCluster
from taskgraph.run import procpool
from taskgraph.run.attempts import HANDLED

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def engines():
    from conftest import assert_no_new_children, child_pids, engines_marker

    # (the session's resource tracker, which a pool in this process starts, is not ours)
    resource_tracker.ensure_running()
    before = child_pids()
    with engines_marker(sys.modules[__name__]), tg.Cluster(n=2, workers=2, cores=1) as c:
        yield c
    assert_no_new_children(before)


@tg.task(retries=2)
def flaky(marker: str, x: int) -> int:
    """Fails on its first attempt (no ``marker`` file yet), then gives ``10 x``."""
    path = Path(marker)
    if not path.exists():
        path.write_text("tried")
        raise ValueError(f"first attempt of {x}")
    return 10 * x


@tg.task(on_failure="skip")
def bad(x: int) -> int:
    raise RuntimeError(f"bad {x}")


@tg.task
def plus_one(v) -> int:
    return v + 1


@tg.task
def count_lines(result) -> int:
    return len(result.stdout.split())


@tg.task(process=True)
def where(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@tg.task
def square(x: int) -> int:
    return x * x


@tg.task(cores=2)
def wide(x: int) -> int:
    return x


@tg.task
def touch(path: str) -> str:
    Path(path).write_text("ran")
    return path


def ensemble(tmp: Path) -> tuple[tg.Graph, dict]:
    with tg.Graph("ensemble") as g:
        futs = {
            "flaky": flaky(str(tmp / "flaky.marker"), 4),
            "bad": bad(2),
            "lines": count_lines(tg.shell("seq {n}", n=5)),
            "proc": where(3),
        }
        futs["after_bad"] = plus_one(futs["bad"])
        futs["after_flaky"] = plus_one(futs["flaky"])
    return g, futs


def test_an_ensemble_on_engines_retries_skips_and_sums_up(engines, tmp_path):
    g, f = ensemble(tmp_path)
    run = engines.run(g)
    with pytest.raises(tg.TaskError, match="was skipped"):
        run.result(f["after_bad"])
    assert run.result(f["after_flaky"]) == 41
    assert run.result(f["lines"]) == 5
    value, pid = run.result(f["proc"])
    assert value == 9 and pid not in {info["pid"] for info in engines.infos}
    s = run.summary()
    # (as a batch job's: every task that ran well, the skip's failure and its dependent)
    assert (s.succeeded, len(s.failed), len(s.skipped), s.retries) == (5, 1, 1, 1), str(s)
    ((label, rank, error),) = s.failed
    assert label.startswith("bad#") and rank in (0, 1) and error == "RuntimeError: bad 2"
    assert s.skipped[0].startswith("plus_one#")
    shown = run._repr_html_()  # (what a notebook shows for a cell ending in run.wait())
    assert html.escape(s.headline()) in shown and "RuntimeError: bad 2" in shown
    assert s.ended_well and html.escape(HANDLED.strip()) in shown  # (bad's on_failure)


def test_the_retried_attempt_reaches_the_notebooks_trace(engines, tmp_path):
    g, f = ensemble(tmp_path)
    run = engines.run(g).wait(60)
    rows = [r for r in run.trace.attempts() if r["label"].startswith("flaky#")]
    assert [(r["attempt"], r["state"]) for r in rows] == [(1, "retried"), (2, "done")], rows


def test_a_run_made_again_reads_every_value_from_its_checkpoint(engines, tmp_path):
    def make() -> tuple[tg.Graph, list]:
        with tg.Graph("resumed") as g:
            futs = [square(i) for i in range(6)]
        return g, futs

    g, futs = make()
    first = engines.run(g, checkpoint=str(tmp_path / "ck"))
    assert [first.result(x) for x in futs] == [i * i for i in range(6)]
    assert first.summary().from_checkpoint == 0
    g, futs = make()
    again = engines.run(g, checkpoint=str(tmp_path / "ck"))
    assert [again.result(x) for x in futs] == [i * i for i in range(6)]
    s = again.summary()
    assert (s.succeeded, s.from_checkpoint) == (6, 6), str(s)
    assert "6 from the checkpoint" in str(s)


def test_a_task_asking_more_cores_than_the_cluster_gives_fails_before_running(engines, tmp_path):
    ran = tmp_path / "ran"
    with tg.Graph("too wide") as g:
        touch(str(ran))
        wide(1)
    with pytest.raises(tg.TaskgraphError, match=r"wide#1\(1\)") as caught:
        engines.run(g).wait(60)
    assert "cores" in str(caught.value)
    time.sleep(0.2)  # (a task that did start would have written by now)
    assert not ran.exists()


@tg.task
def broken(x: int) -> int:
    raise OSError(f"broken {x}")


def test_a_failed_runs_summary_names_the_task_its_rank_and_error(engines):
    with tg.Graph("fails") as g:
        square(2)
        broken(7)
    run = engines.run(g)
    s = run.summary()  # (does not raise the run's error: it says what failed)
    assert [(label, error) for label, _, error in s.failed] == [
        ("broken#1(7)", "OSError: broken 7")
    ]
    assert s.failed[0][1] == run.plan.placement[1]
    assert not s.ended_well and HANDLED not in str(s)
    with pytest.raises(tg.TaskError, match="broken 7"):
        run.wait()


def _gone(pids: set[int], seconds: float = 10) -> set[int]:
    """Those of ``pids`` still alive (zombies aside) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_closing_leaves_no_engine_or_pool_process(engines):
    # (the last test of the engines: it closes them)
    with tg.Graph("pool") as g:
        futs = [where(i) for i in range(4)]
    run = engines.run(g)
    pool = {run.result(x)[1] for x in futs}
    engine_pids = {info["pid"] for info in engines.infos}
    assert pool and not pool & engine_pids
    engines.close()
    assert _gone(pool | engine_pids) == set()


def test_a_jobs_close_ends_its_process_pool():
    cluster = JobCluster(workers=2)
    with tg.Graph("job pool") as g:
        futs = [where(i) for i in range(2)]
    run = cluster.run(g)
    pids = {run.result(x)[1] for x in futs}
    assert pids and pids <= set(procpool.processes())
    cluster.close()
    assert procpool.processes() == []
    assert _gone(pids, 5) == set()
