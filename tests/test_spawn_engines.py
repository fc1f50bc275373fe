"""Spawned tasks on 2 real ipyparallel engines, run from the client: a recursive fib
exact with steals between the engines, a grandchild's error caught by its grandparent
(also when it ran on the other engine), an uncaught one that fails the run naming the
task and the rank, after which the next run works, and a failing run that leaves
another one in flight running."""

from __future__ import annotations

import os
import random
import re
import sys
import time

import pytest

import taskgraph as tg

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def engines():
    from conftest import assert_no_new_children, child_pids, engines_marker

    before = child_pids()
    with engines_marker(sys.modules[__name__]), tg.Cluster(n=2) as c:
        yield c
    assert_no_new_children(before)


def serial_fib(n: int) -> int:
    return n if n < 2 else serial_fib(n - 1) + serial_fib(n - 2)


@tg.task
def fib(n: int, cutoff: int, delay: float) -> int:
    """fib(n) by spawns down to ``cutoff``; each leaf naps up to ``delay`` s (seeded)."""
    if n < cutoff:
        time.sleep(random.Random(n).random() * delay)
        return serial_fib(n)
    a = tg.spawn(fib, n - 1, cutoff, delay)
    b = tg.spawn(fib, n - 2, cutoff, delay)
    return a.result() + b.result()


def nap(seconds: float) -> None:
    time.sleep(seconds)


def fail_at_bottom(x: int) -> int:
    raise ValueError(f"bad leaf {x}")


def middle(x: int, delay: float) -> int:
    below = tg.spawn(fail_at_bottom, x)
    tg.spawn(nap, delay).result()  # meanwhile the other engine may steal ``below``
    return below.result()  # not caught here


@tg.task
def grandparent(x: int, delay: float) -> str:
    try:
        tg.spawn(middle, x, delay).result()
    except ValueError as exc:  # (the grandchild's own class: a stolen one's too)
        assert isinstance(exc, tg.SpawnedTaskError) and isinstance(exc.original, ValueError)
        return "caught " + " ".join(str(exc).split())
    return "not raised"


@tg.task
def asks_child(x: int) -> int:
    return tg.spawn(middle, x, 0.0).result()


def test_a_recursive_fib_is_exact_and_the_engines_steal(engines):
    with tg.Graph("fib") as g:
        f = fib(18, 10, 0.003)
    run = engines.run(g, workers=1)
    assert run.result(f) == serial_fib(18) == 2584
    assert run.stats.spawned > 50
    assert run.calls_ended() == run.stats.spawned  # (every engine's, for the progress line)
    moved = run.stats.steals + run.stats.pushes
    assert moved > 0 and run.trace.steals, "the idle engine stole (or was pushed) nothing"
    for thief, victim, name, _req, _arr, _pushed in run.trace.steals:
        assert thief != victim and name.startswith("fib("), run.trace.steals


def test_a_grandchild_error_is_caught_by_its_grandparent_on_engines(engines):
    with tg.Graph("catch") as g:
        gp = grandparent(6, 0.3)  # alone: the other engine is idle, and steals
    run = engines.run(g, workers=1)
    text = run.result(gp)
    found = re.match(
        r"caught task middle\(6, 0.3\) on rank (\d)/2 .* "
        r"task fail_at_bottom\(6\) on rank (\d)/2 .*ValueError: bad leaf 6",
        text,
    )
    assert found, text
    assert found.group(1) != found.group(2), f"the grandchild was not stolen: {text}"
    assert "Traceback" in text and "in fail_at_bottom" in text, text


def test_an_uncaught_spawned_error_fails_the_run_and_the_next_run_works(engines):
    with tg.Graph("uncaught") as g:
        asks_child(4)
    run = engines.run(g, workers=1)
    with pytest.raises(tg.TaskError) as info:
        run.wait(60)
    text = str(info.value)
    assert re.search(r"asks_child#0\(4\) on rank \d/2", text), text
    assert re.search(r"fail_at_bottom\(4\) on rank \d/2", text), text
    assert "ValueError: bad leaf 4" in text, text
    with tg.Graph("next") as g2:
        f = fib(14, 8, 0.0)
    assert engines.run(g2).result(f) == 377


@tg.task
def holds(x) -> str:
    return type(x).__name__


def test_a_graph_argument_that_cannot_reach_the_engines_names_its_task(engines):
    """cloudpickle's bare "cannot pickle '_thread.lock' object" named no task."""
    import threading

    with tg.Graph("lock") as g:
        holds(1)
        holds(threading.Lock())
    with pytest.raises(tg.GraphError, match=r"task holds#1\(.*\): its arguments cannot be sent"):
        engines.run(g)
    with tg.Graph("next") as g2:
        f = holds(2.0)
    assert engines.run(g2).result(f) == "float"


def gate(path: str, n: int) -> int:
    """fib(n), once ``path`` exists (the test opens it): keeps a run in flight."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)
    return serial_fib(n)


@tg.task
def gated_sum(path: str, k: int) -> int:
    return sum(tg.wait([tg.spawn(gate, path, n) for n in range(k)]))


def test_a_failing_spawning_run_leaves_another_in_flight_running(engines, tmp_path):
    path = str(tmp_path / "gate")
    with tg.Graph("held") as g1:
        h = gated_sum(path, 12)
    with tg.Graph("fails") as g2:
        fib(16, 10, 0.002)
        asks_child(5)
    r1, r2 = engines.run(g1, workers=2), engines.run(g2, workers=1)
    with pytest.raises(tg.TaskError, match=r"bad leaf 5"):
        r2.wait(60)
    assert r1.state() == "running"
    open(path, "a").close()
    assert r1.result(h) == sum(serial_fib(n) for n in range(12))
    assert (r1.state(), r2.state()) == ("done", "failed")
