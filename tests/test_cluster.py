"""Notebook clusters: real ipyparallel controllers and engines under mpiexec.

Every cluster here is started through a fixture that closes it, with the engines'
environment marked so that the test fails (and kills them) if any process is left.
"""

from __future__ import annotations

import _thread
import gc
import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest
from conftest import ROOT, job_marker, processes_with

import taskgraph as tg
from taskgraph.dsl.tiled import spd_dense
from taskgraph.linalg import cholesky, cholesky_residual

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def marker():
    """A value in the environment of every process the clusters here start."""
    with job_marker() as value:
        yield value


@pytest.fixture(scope="module")
def cluster(marker):
    with tg.Cluster(n=2) as c:
        yield c


@pytest.fixture
def fresh_cluster(marker):
    """A cluster of its own, for tests that break it."""
    c = tg.Cluster(n=2)
    try:
        yield c
    finally:
        c.close()


@tg.kernel(modes="rw", dims="mn")
def nap(t):
    time.sleep(0.1)
    t += 1.0


def naps(cluster, rounds: int) -> tuple[tg.Graph, tg.TiledMatrix]:
    """``rounds`` naps of 0.1 s on every rank."""
    B = tg.TiledMatrix.zeros((2 * cluster.size, 2), 2, grid=(cluster.size, 1), cluster=cluster)
    with tg.Graph("naps") as g:
        for _ in range(rounds):
            for i in range(cluster.size):
                nap(B[i, 0].rw)
    return g, B


def test_engines_are_the_ranks_of_one_mpi_world(cluster):
    assert cluster.size == 2
    assert [info["rank"] for info in cluster.infos] == [0, 1]
    assert [info["size"] for info in cluster.infos] == [2, 2]
    assert len(set(cluster.engine_ids)) == 2 and cluster.alive()
    assert "2 engines" in repr(cluster)


def test_engines_move_large_messages_in_one_copy_where_allowed(cluster):
    """Engines start MPI themselves (under ipyparallel's mpiexec launcher): each turns on
    MPICH's single-copy transfers before it does, as a batch rank does."""
    from taskgraph.run.singlecopy import can_read_memory, yama_scope

    allowed = yama_scope() in (None, "0") and can_read_memory()
    assert [info["single_copy"] for info in cluster.infos] == [allowed, allowed]


def test_the_controller_listens_on_loopback_only(cluster, marker):
    """ipyparallel's controller (and its engines' nannies) bind 127.0.0.1 only. MPI's
    own launcher and transport sockets are MPI's business, not checked here."""
    import psutil

    listening = []
    for pid in processes_with(marker):
        try:
            proc = psutil.Process(pid)
            if not any(part.startswith("ipyparallel.") for part in proc.cmdline()):
                continue
            if "ipyparallel.engine" in proc.cmdline():
                continue  # an MPI rank: its MPI sockets are MPI's
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        listening += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening, "the controller listens somewhere"
    assert set(listening) <= {"127.0.0.1", "::1"}, listening


def test_cholesky_from_the_notebook(cluster):
    A = tg.TiledMatrix.random_spd(1024, 128, cluster=cluster)
    assert A.tiles == {}, "the notebook holds no tiles; the engines do"
    run = cluster.run(cholesky(A))
    assert run.wait() is run
    L = A.gather()
    assert isinstance(L, np.ndarray) and L.shape == (1024, 1024)
    assert cholesky_residual(spd_dense(1024, 128), L) < 1e-14
    assert run.seconds > 0 and run.wall_seconds >= run.seconds


def test_from_numpy_scatters_and_gather_collects(cluster):
    rng = np.random.default_rng(1)
    x = rng.random((300, 200))
    X = tg.TiledMatrix.from_numpy(cluster, x, tile=64)
    assert np.array_equal(X.gather(), x)


def test_a_freed_matrix_is_dropped_by_the_engines_with_the_next_run(cluster):
    """Freeing a matrix in the notebook only notes it (its finalizer may run in the
    middle of anything, a Ctrl-C included); the next run's message tells the engines."""

    def held() -> list[int]:
        view = cluster.client[cluster.engine_ids[0]]
        view.execute("from taskgraph.cluster import engine_side; held = list(engine_side.MATRICES)")
        return view.pull("held", block=True)

    A = tg.TiledMatrix.zeros((4, 4), 2, cluster=cluster)
    uid = A.uid
    assert uid in held()
    del A
    gc.collect()
    assert uid in held()  # noted, nothing sent yet
    g, _ = naps(cluster, 1)
    before = len(cluster.client.history)
    cluster.run(g).wait()
    assert len(cluster.client.history) - before == cluster.size  # no message of its own
    assert uid not in held()


def test_a_run_is_one_message_per_engine_however_many_tasks(cluster):
    A = tg.TiledMatrix.random_spd(1024, 64, cluster=cluster)
    g = cholesky(A)
    assert g.ntasks > 500
    gc.collect()  # matrices of earlier tests, when collected, tell the engines to forget them
    before = len(cluster.client.history)
    cluster.run(g).wait()
    assert len(cluster.client.history) - before == cluster.size


def test_futures_are_fetched_only_when_asked(cluster):
    @tg.task
    def square(x):
        return x * x

    @tg.task
    def total(*xs):
        return sum(xs)

    with tg.Graph("futures") as g:
        parts = [square(i) for i in range(20)]
        s = total(*parts)
    run = cluster.run(g).wait()
    assert run.values == {}, "nothing comes back until asked for"
    assert s.result() == sum(i * i for i in range(20))
    assert parts[3].result() == 9
    assert set(run.values) == {s.id, parts[3].id}
    assert run.result() == s.result()
    assert run.stats.tasks == 21 and run.state() == "done"


def test_two_runs_of_one_graph_keep_their_own_values(cluster):
    @tg.task
    def summed(x, k):
        return float(x.sum()) + k

    @tg.task
    def total(*xs):
        return sum(xs)

    x = np.ones(4)
    with tg.Graph("twice") as g:
        parts = [summed(x, k) for k in range(2)]
        s = total(*parts)
    first = cluster.run(g).wait()
    x[:] = 2  # the second run's input (the graph goes to the engines with each run)
    second = cluster.run(g).wait()
    assert (first.result(parts[1]), first.result(s), first.result()) == (5.0, 9.0, 9.0)
    assert (second.result(parts[1]), second.result(s)) == (9.0, 17.0)
    assert s.result() == 17.0 and parts[0].result() == 8.0


def test_progress_and_events_arrive_while_the_run_goes_on(cluster):
    g, _ = naps(cluster, 20)  # 2 s on each rank
    run = cluster.run(g)
    early = []
    while not run.done():
        early += run.batches()
        time.sleep(0.05)
    late = run.batches()
    run.wait()
    assert early, "no batch arrived before the run ended"
    assert any(b["done"] > 0 for b in early)
    ranks = {b["rank"] for b in early + late}
    assert ranks == {0, 1}
    events = [t for b in early + late for t in b["events"]["tasks"]["id"]]
    assert sorted(events) == list(range(g.ntasks)), "every task event arrives exactly once"
    assert len(early + late) <= 2 * (run.wall_seconds / 0.25 + 3), "the rate is bounded"
    assert run.progress() == (g.ntasks, g.ntasks)


def test_a_task_that_raises_names_task_rank_and_traceback(cluster):
    @tg.kernel(modes="rw", dims="mn")
    def explode(t):
        raise ValueError("bad tile on purpose")

    B = tg.TiledMatrix.zeros((4, 2), 2, grid=(2, 1), cluster=cluster)
    with tg.Graph("explode") as g:
        nap(B[0, 0].rw)
        explode(B[1, 0].rw)
    with pytest.raises(tg.TaskError) as info:
        cluster.run(g).wait()
    err = info.value
    assert err.task == f"explode({B.name}[1,0])" and err.rank == 1 and err.size == 2
    assert "ValueError: bad tile on purpose" in str(err)
    assert isinstance(err.__cause__, tg.RemoteTraceback)
    assert "bad tile on purpose" in str(err.__cause__) and "Traceback" in str(err.__cause__)
    g2, B2 = naps(cluster, 1)
    cluster.run(g2).wait()
    assert np.all(B2.gather() == 1.0)


def test_a_wait_that_times_out_leaves_the_run_going(cluster):
    g, B = naps(cluster, 10)  # 1 s on each rank
    run = cluster.run(g)
    with pytest.raises(TimeoutError, match="still going after 0.2 s"):
        run.wait(timeout=0.2)
    assert not run.done()
    run.wait(timeout=60)
    assert run.done() and np.all(B.gather() == 10.0)


def test_cancel_stops_every_engine_quickly(cluster):
    g, _ = naps(cluster, 200)  # 20 s
    run = cluster.run(g)
    time.sleep(1.0)
    t0 = time.monotonic()
    run.cancel("changed my mind")
    with pytest.raises(tg.RunError, match=r"stopped on rank .*changed my mind"):
        run.wait(timeout=30)
    assert time.monotonic() - t0 < 5
    assert run.state() == "failed" and "failed" in repr(run)
    with pytest.raises(tg.RunError, match="changed my mind"):
        run.wait()  # the error stays with the run
    g2, B2 = naps(cluster, 1)
    cluster.run(g2).wait()
    assert np.all(B2.gather() == 1.0)


def test_ctrl_c_while_waiting_stops_the_run(cluster):
    # Ctrl-C raises KeyboardInterrupt, as in any notebook or interactive Python; a test
    # run started in the background (`cmd &` in a script) inherits SIGINT ignored, and
    # interrupt_main() then does nothing
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    g, _ = naps(cluster, 200)
    run = cluster.run(g)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.wait(timeout=30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert run.done() and time.monotonic() - t0 < 1.0 + 5  # stopped within 5 s of Ctrl-C
    with pytest.raises(tg.RunError):
        run.wait()
    g2, B2 = naps(cluster, 1)
    cluster.run(g2).wait()
    assert np.all(B2.gather() == 1.0)


def test_kernels_compile_once_per_engine(cluster):
    A = tg.TiledMatrix.random_spd(256, 64, "float32", cluster=cluster)
    first = cluster.run(cholesky(A)).wait()
    B = tg.TiledMatrix.random_spd(256, 64, "float32", cluster=cluster)
    second = cluster.run(cholesky(B)).wait()
    assert second.compile_seconds < 0.05 <= first.compile_seconds + 0.05
    assert cluster.compile() < 0.05  # already compiled: a no-op, reported


def test_a_killed_engine_is_reported_then_restart_works(fresh_cluster):
    c = fresh_cluster
    g, _ = naps(c, 300)
    run = c.run(g)
    time.sleep(1.0)
    old = c.infos[1]["pid"]
    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(tg.RunError, match="rank 1 .*MPI world is broken"):
        run.wait(timeout=60)
    assert time.monotonic() - t0 < 30
    assert not c.alive()
    # (then a run, or a matrix, named what is lost: ipyparallel raised KeyError, a trial)
    with pytest.raises(tg.RunError, match="rank 1 .*cluster.restart"):
        c.run(open=True)
    with pytest.raises(tg.RunError, match="MPI world is broken"):
        tg.TiledMatrix.zeros(4, 2, cluster=c)
    c.restart()
    assert c.alive() and c.infos[1]["pid"] != old
    A = tg.TiledMatrix.random_spd(512, 128, cluster=c)
    c.run(cholesky(A)).wait()
    assert cholesky_residual(spd_dense(512, 128), A.gather()) < 1e-14


def test_restart_a_healthy_cluster_and_stale_matrices(fresh_cluster):
    c = fresh_cluster
    A = tg.TiledMatrix.zeros(4, 2, cluster=c)
    c.restart()
    with pytest.raises(tg.RunError, match="before the cluster restarted"):
        A.gather()
    with pytest.raises(tg.RunError, match="before the cluster restarted"):
        c.run(naps_on(A))
    g, B = naps(c, 1)
    c.run(g).wait()
    assert np.all(B.gather() == 1.0)


def naps_on(A) -> tg.Graph:
    with tg.Graph("stale") as g:
        nap(A[0, 0].rw)
    return g


def test_zero_engines_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one engine"):
        tg.Cluster(n=0)


def test_attach_to_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(tg.RunError, match="cannot attach"):
        tg.Cluster.attach(connection_file=str(tmp_path / "no-such-client.json"))
    with pytest.raises(tg.RunError, match="cannot attach"):
        tg.Cluster.attach(cluster_id="no-such-cluster", profile="taskgraph-test-none")


def _ipp_cluster(engines: str, n: int = 2):
    import ipyparallel as ipp

    from taskgraph.core import config

    c = ipp.Cluster(
        n=n,
        engines=engines,
        controller_ip="127.0.0.1",
        log_level=40,
        cluster_id=f"tgtest-{uuid.uuid4().hex[:8]}",
    )
    if engines == "mpi":
        c.config.MPILauncher.mpi_cmd = [config.mpiexec()]
    c.start_cluster_sync()
    return c


def test_attach_to_engines_started_elsewhere(marker):
    outside = _ipp_cluster("mpi")
    try:
        with tg.Cluster.attach(outside.cluster_id, profile=outside.profile, n=2) as c:
            A = tg.TiledMatrix.random_spd(512, 128, cluster=c)
            c.run(cholesky(A)).wait()
            assert cholesky_residual(spd_dense(512, 128), A.gather()) < 1e-14
        assert outside.engines, "attaching and closing must not stop someone else's engines"
        # the way a SLURM job's engines are reached: the controller's client file
        client_file = os.path.join(
            outside.profile_dir, "security", f"ipcontroller-{outside.cluster_id}-client.json"
        )
        with tg.Cluster.attach(connection_file=client_file, n=2) as c:
            B = tg.TiledMatrix.random_spd(256, 128, cluster=c)
            c.run(cholesky(B)).wait()
            assert cholesky_residual(spd_dense(256, 128), B.gather()) < 1e-14
    finally:
        outside.stop_cluster_sync()


def test_engines_that_are_not_one_mpi_world_are_refused(marker):
    outside = _ipp_cluster("local")  # two engines, each a world of its own
    try:
        with pytest.raises(tg.RunError, match="not one MPI world"):
            tg.Cluster.attach(outside.cluster_id, profile=outside.profile, n=2)
    finally:
        outside.stop_cluster_sync()


def test_the_notebook_code_runs_in_batch(mpirun, tmp_path):
    script = tmp_path / "notebook_code.py"
    script.write_text(
        "import taskgraph as tg\n"
        "from taskgraph.linalg import cholesky, cholesky_residual\n"
        "from taskgraph.dsl.tiled import spd_dense\n"
        "cluster = tg.Cluster(n=2)  # in batch: the job's own ranks\n"
        "A = tg.TiledMatrix.random_spd(512, 128, cluster=cluster)\n"
        "run = cluster.run(cholesky(A))\n"
        "run.wait()\n"
        "L = A.gather()\n"
        "if cluster.rank == 0:\n"
        "    print('BATCH', type(cluster).__name__, cluster.size,\n"
        "          cholesky_residual(spd_dense(512, 128), L) < 1e-14)\n"
    )
    proc = mpirun(2, [str(script)], timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "BATCH JobCluster 2 True" in proc.stdout
    assert "ipyparallel" not in proc.stderr


__all__ = ["ROOT"]
