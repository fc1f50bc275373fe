"""The shared executor suite on ipyparallel engines: 2 engines, one MPI world.

Each scenario of ``tests/scenarios.py`` runs on every engine at once, with the
engine's own cluster (``tg.current_cluster()`` there is its MPI world), as the ranks of
a batch job run it. One cluster serves the module; it is restarted only after a
scenario that broke it (a failure leaves the other engine in a collective). The
killed-rank scenario runs from the notebook instead: the run must report the lost
engine within seconds.
"""

from __future__ import annotations

import time

import pytest
import scenarios
from conftest import HERE, job_marker

import taskgraph as tg

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

SCENARIO_TIMEOUT = 90.0  # seconds one scenario may take on the engines
NOT_ON_ENGINES = {
    "a_killed_rank_ends_the_job": "run from the notebook: test_a_killed_engine_is_reported",
}


@pytest.fixture(scope="module")
def marker():
    """A value in the environment of every process the cluster here starts."""
    with job_marker() as value:
        yield value


class Engines:
    """The module's cluster, started again after a scenario broke it."""

    def __init__(self):
        self.cluster: tg.Cluster | None = None

    def ready(self) -> tg.Cluster:
        if self.cluster is None:
            self.cluster = tg.Cluster(n=2)
        elif not self.cluster.alive():
            self.cluster.restart()
        # engines import the suite by name (functions travel as references)
        setup = f"import sys; sys.path.insert(0, {str(HERE)!r}); import scenarios"
        self.cluster.view.execute(setup, block=True)
        return self.cluster

    def broken(self) -> None:
        """Fresh engines for the next test (the failed scenario may still hold these)."""
        if self.cluster is not None:
            self.cluster.restart()

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()


@pytest.fixture(scope="module")
def engines(marker):
    e = Engines()
    try:
        yield e
    finally:
        e.close()


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_on_engines(name, engines):
    if name in NOT_ON_ENGINES:
        pytest.skip(NOT_ON_ENGINES[name])
    c = engines.ready()
    ar = c.view.apply_async(scenarios.run_here, name)
    try:
        said = c._wait(ar, timeout=SCENARIO_TIMEOUT)
    except BaseException:
        engines.broken()
        raise
    assert sorted(said) == [f"PASS {name} {r}/2" for r in range(2)]


def test_a_killed_engine_is_reported(engines):
    """The last engine kills itself in a task the other waits on: the notebook's wait
    ends within seconds with a RunError naming the lost rank, then fresh engines work."""
    c = engines.ready()
    run = c.run(scenarios.killed_rank_graph(c))
    t0 = time.monotonic()
    try:
        with pytest.raises(tg.RunError, match=r"lost .*rank 1 \(engine .*MPI world is broken"):
            run.wait(timeout=scenarios.KILLED_BOUND)
        assert time.monotonic() - t0 < scenarios.KILLED_BOUND
        assert not c.alive()
    finally:
        engines.broken()
    c.run(tg.Graph("empty")).wait()
