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


@pytest.mark.parametrize(
    "option,value,words",
    [
        ("task_timeout", -1, "task_timeout must be a positive number"),
        ("task_timeout", 0, "task_timeout must be a positive number"),
        ("task_timeout", "5", "task_timeout must be a positive number"),
        ("workers", 0, "workers must be an int >= 1"),
        ("workers", 2.5, "workers must be an int >= 1"),
        ("blas_threads", -1, "blas_threads must be an int >= 1"),
    ],
)
def test_a_runs_sizes_are_checked_before_it_starts(option, value, words):
    """They were taken as given: every task then "timed out after -1 s", workers=0 ran
    nothing and workers=2.5 raised deep inside the trace recorder."""
    with tg.Graph("g") as g:
        pass
    with pytest.raises(tg.GraphError, match=words):
        tg.current_cluster().run(g, **{option: value})


def test_a_run_of_something_else_than_a_graph_says_so():
    with pytest.raises(TypeError, match="takes a tg.Graph, not str"):
        tg.current_cluster().run("notagraph")


def test_a_checkpoint_directory_that_cannot_be_made_is_named():
    with tg.Graph("g") as g:
        pass
    with pytest.raises(tg.RunError, match="checkpoint='/proc/nope/x'"):
        tg.current_cluster().run(g, checkpoint="/proc/nope/x").wait()


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"n": "2"}, "at least one engine"),
        ({"n": 2.5}, "at least one engine"),
        ({"workers": 0}, "workers must be an int >= 1"),
        ({"blas_threads": 1.5}, "blas_threads must be an int >= 1"),
        ({"timeout": -1}, "timeout must be a positive number"),
    ],
)
def test_a_clusters_sizes_are_checked_before_it_starts(kwargs, words):
    """``Cluster(n="2")`` raised a bare TypeError from a comparison; workers=0 passed."""
    with pytest.raises((ValueError, tg.GraphError), match=words):
        tg.Cluster(**kwargs)
