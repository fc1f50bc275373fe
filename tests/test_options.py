"""Task and run options (issue 23): checked when made, the failure policy filled in
from the run's where the task left its own at the default."""

import pytest

import taskgraph as tg
from taskgraph.core.errors import GraphError
from taskgraph.dsl.options import (
    DEFAULT,
    RunOptions,
    TaskOptions,
    effective,
    options_of,
    parse_memory,
)


def test_task_options_are_set_and_checked_naming_the_task():
    @tg.task(retries=2, on_failure="skip", cores=2, memory="1.5GiB", gpus=0)
    def sim(x):
        return x

    assert sim.options == TaskOptions(
        retries=2, on_failure="skip", cores=2, memory=int(1.5 * 2**30)
    )
    assert sim(3) == 3  # outside a graph: a plain call
    for bad, text in [
        ({"retries": -1}, "retries"),
        ({"on_failure": "retry"}, "on_failure"),
        ({"cores": 0}, "cores"),
        ({"memory": "lots"}, "memory"),
        ({"gpus": 1.5}, "gpus"),
        ({"colour": "red"}, "no such task option colour"),
    ]:
        with pytest.raises(GraphError, match=f"task sim: .*{text}|task sim: {text}"):
            sim.with_options(**bad)


def test_with_options_copies_and_keeps_the_rest():
    @tg.task(retries=1, timeout=5)
    def f(x):
        return x

    g = f.with_options(cores=3)
    assert (g.options.retries, g.options.cores, g.options.timeout, g.timeout) == (1, 3, 5.0, 5.0)
    assert f.options.cores == 1  # the original is unchanged
    with tg.Graph() as graph:
        g(1)
    assert graph.tasks[0].fn.options.cores == 3
    assert options_of(print) is DEFAULT and options_of(g) is g.options


def test_run_options_fill_in_the_task_defaults_only():
    run = RunOptions.make(retries=3, on_failure="ignore")
    assert effective(DEFAULT, run) == TaskOptions(retries=3, on_failure="ignore")
    own = TaskOptions(retries=1, on_failure="skip")
    assert effective(own, run) == own
    assert not RunOptions().active and run.active
    with pytest.raises(GraphError, match="cluster.run: launch_rate"):
        RunOptions.make(launch_rate=0)
    with pytest.raises(GraphError, match="cluster.run: on_failure"):
        RunOptions.make(on_failure="explode")


def test_memory_sizes():
    assert parse_memory("512MB", "t") == 512_000_000
    assert parse_memory("2 GiB", "t") == 2 * 2**30
    assert parse_memory(1024, "t") == 1024
