"""The shared executor suite at 1 rank (in-process, no MPI) and 2 and 3 ranks (mpiexec)."""

from __future__ import annotations

import re
import time

import pytest
import scenarios

pytestmark = pytest.mark.timeout(180)


def passed_ranks(output: str, name: str) -> set[int]:
    """Ranks that printed PASS (rank output may interleave on one line)."""
    return {int(r) for r in re.findall(rf"PASS {name} (\d+)/\d+", output)}


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_one_rank_without_mpi(name):
    if name in scenarios.ENDS_THE_JOB:
        pytest.skip("kills its own process: there is no other rank to stop at 1 rank")
    scenarios.SCENARIOS[name]()


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_under_mpiexec(name, ranks, mpirun):
    t0 = time.monotonic()
    proc = mpirun(ranks, [str(scenarios.__file__), name], timeout=90)
    output = proc.stdout + proc.stderr
    if name in scenarios.ENDS_THE_JOB:
        # the launcher ends the job, well before a survivor's own bound
        assert proc.returncode != 0, output
        assert passed_ranks(proc.stdout, name) == set(), output
        assert "signal 9" in output, output
        assert time.monotonic() - t0 < scenarios.KILLED_BOUND, output
        return
    assert proc.returncode == 0, output
    assert passed_ranks(proc.stdout, name) == set(range(ranks)), output


def test_one_worker_always_runs_the_ready_task_of_highest_priority():
    """Whenever the worker starts a task, no task that was ready then (all its
    predecessors ended) has a higher priority: the ready queue is a priority queue."""
    import taskgraph as tg
    from taskgraph.linalg import cholesky

    A = tg.TiledMatrix.random_spd(800, 100)
    g = cholesky(A)
    run = tg.current_cluster().run(g, workers=1).wait()
    priority = run.rank_plan.priority
    rec = run.executor.trace
    order = rec.task_id[: rec.ntasks]
    start, end = rec.task_start, rec.task_end
    assert sorted(order) == list(range(g.ntasks))
    ended = {t: end[i] for i, t in enumerate(order)}
    assert len(set(priority.values())) > 5, "priorities that differ, or the test proves nothing"
    started: set[int] = set()
    for i, t in enumerate(order):
        ready = [
            u
            for u in range(g.ntasks)
            if u not in started and u != t and all(ended[p] <= start[i] for p in g.tasks[u].preds)
        ]
        better = [u for u in ready if priority[u] > priority[t]]
        assert not better, f"{g.label(t)} ran while {g.label(better[0])} was ready"
        started.add(t)


def test_a_run_freezes_the_collector_and_thaws_it_after():
    """During a run, collections skip the objects that existed before it (the graph and
    its plan); after it, nothing stays frozen, and a process that froze objects itself
    keeps its own freeze."""
    import gc

    import taskgraph as tg

    @tg.task
    def frozen_now():
        return gc.get_freeze_count()

    def run_once() -> int:
        with tg.Graph("gc") as g:
            f = frozen_now()
        tg.current_cluster().run(g).wait()
        return f.result()

    assert gc.get_freeze_count() == 0
    assert run_once() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        run_once()
        # still frozen (an unfreeze would give 0); a few frozen objects may be freed by
        # the run, such as the earlier run the cluster kept
        assert mine - 100 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("done", [[1], [0, 2], [3, 0], [0, 1, 2, 3]])
def test_completed_requests_leave_both_lists_in_step(done):
    from taskgraph.run.executor import _take

    handles, entries = ["h0", "h1", "h2", "h3"], ["e0", "e1", "e2", "e3"]
    same = (handles, entries)
    taken = _take(done, handles, entries)
    assert taken == [f"e{i}" for i in done]
    left = [i for i in range(4) if i not in done]
    assert handles == [f"h{i}" for i in left] and entries == [f"e{i}" for i in left]
    assert (handles, entries) == same and handles is same[0]  # in place: others hold them


def test_the_buffer_pool_hands_a_buffer_out_again_only_for_its_shape_and_dtype():
    import numpy as np

    from taskgraph.run.executor import BufferPool

    pool = BufferPool()
    a = pool.get((4, 4), "<f8")
    b = pool.get((4, 4), "<f4")
    assert a.shape == (4, 4) and a.dtype == np.float64 and a.flags.f_contiguous
    pool.put(b)
    pool.put(a)
    assert pool.get((4, 4), "<f8") is a and pool.get((4, 4), "<f4") is b
    assert pool.get((4, 4), "<f8") is not a  # a is out again: a new one
    pool.put(a)
    assert pool.get((2, 8), "<f8") is not a  # the same bytes, another shape
    # a buffer the pool did not make goes back by its own shape and dtype
    mine = np.empty((3, 3), np.float32, order="F")
    pool.put(mine)
    assert pool.get((3, 3), "<f4") is mine
    assert pool.allocated == 4 and pool.handed_out == 7


def worker_shares(run) -> list[float]:
    rec = run.executor.trace
    workers = rec.task_worker[: rec.ntasks]
    return [workers.count(w) / len(workers) for w in range(run.executor.nworkers)]


def test_two_workers_leave_tiny_tasks_to_one_of_them():
    """Python runs one thread at a time: two workers taking turns at tasks of a few
    microseconds only hand the lock and the GIL to each other. With short tasks, one
    worker runs (nearly) all of them while the other waits, looking again every
    ``PARK`` in case a task runs long."""
    import taskgraph as tg

    @tg.task
    def nop(i):
        return i

    with tg.Graph("tiny") as g:
        for i in range(20_000):
            nop(i)
    run = tg.current_cluster().run(g, workers=2).wait()
    assert run.executor.nworkers == 2
    assert max(worker_shares(run)) > 0.7, worker_shares(run)  # without parking: ~0.5


def test_two_workers_share_tasks_that_run_long():
    """Tasks that release the GIL for milliseconds run on both workers at once."""
    import time

    import taskgraph as tg

    @tg.task
    def nap(i):
        time.sleep(0.005)  # releases the GIL, as a numba kernel or BLAS call does
        return i

    with tg.Graph("long") as g:
        for i in range(40):
            nap(i)
    run = tg.current_cluster().run(g, workers=2).wait()
    assert min(worker_shares(run)) > 0.3, worker_shares(run)
    # and at the same time: the time both workers ran a task at once, from the trace
    # (parked for good, the second worker would run none; taking turns, none at once)
    rec = run.executor.trace
    n = rec.ntasks
    spans = {w: [] for w in range(2)}
    for w, a, b in zip(rec.task_worker[:n], rec.task_start[:n], rec.task_end[:n]):
        spans[int(w)].append((a, b))
    both = sum(max(0.0, min(b0, b1) - max(a0, a1)) for a0, b0 in spans[0] for a1, b1 in spans[1])
    assert both > 0.5 * 20 * 0.005, both  # ideal: 40 naps of 5 ms in pairs, 0.1 s


def spin_kernel(micros: float):
    """A numba kernel (GIL released) that adds to its tile for about ``micros`` us on
    this machine, calibrated now, and its loop count."""
    import time

    import numba
    import numpy as np

    @numba.njit(nogil=True)
    def spin(x, n):
        acc = 0.0
        for i in range(n):
            acc += (i % 7) * 1e-9
        x[0, 0] += acc

    x = np.zeros((1, 1), order="F")
    spin(x, 10)  # compile
    per_step = float("inf")
    for _ in range(7):  # the fastest: one timing slowed by a busy machine made tasks short
        t0 = time.perf_counter()
        spin(x, 200_000)
        per_step = min(per_step, (time.perf_counter() - t0) / 200_000)
    return spin, max(1, int(micros * 1e-6 / per_step))


@pytest.mark.parametrize("nogil", [True, False])
def test_two_workers_share_short_kernels_only_where_they_run_without_the_gil(nogil, monkeypatch):
    """Short kernels that release the GIL overlap on two workers (one's kernel beside
    the other's bookkeeping), so the workers share them; a function that may hold the
    GIL stays with one worker, as tiny tasks do (see above). Tasks of ~50 us, 2.5x the
    kernels' limit and a quarter of ``PARK`` (a task that old is helped with); the
    other limit raised to 5 ms, so that neither is near a task."""
    import taskgraph as tg
    from taskgraph.run import tuning

    monkeypatch.setattr(tuning, "SHORT_TASK", 5e-3)
    spin, steps = spin_kernel(2.5e6 * tuning.SHORT_KERNEL)
    kernel = tg.kernel(lambda x: spin(x, steps), modes="rw", name="spin", nogil=nogil)
    X = tg.TiledMatrix.zeros((2000, 1), 1, name="X")
    with tg.Graph("spin") as g:
        for _ in range(2):
            for i in range(2000):
                kernel(X[i, 0].rw)
    run = tg.current_cluster().run(g, workers=2).wait()
    shares = worker_shares(run)
    if nogil:
        assert min(shares) > 0.25, shares  # parked under the other limit: ~0.05
    else:
        assert max(shares) > 0.7, shares


def test_the_progress_thread_polls_while_workers_compute_only_where_it_helps():
    from taskgraph.run.tuning import poll_while_computing

    # one core per worker, single-copy transfers on one node, no stealing: it would
    # only take the workers' cores
    assert not poll_while_computing(False, True, False)
    assert poll_while_computing(True, True, False)  # a core to spare
    assert poll_while_computing(False, False, False)  # chunked, or another node
    assert poll_while_computing(False, True, True)  # a thief waits for an answer


def test_the_short_task_limit_is_lower_only_when_every_task_runs_without_the_gil():
    import functools

    import numba
    from taskgraph.kernels import CHOLESKY_KERNELS

    import taskgraph as tg
    from taskgraph.run.executor import SHORT_KERNEL, SHORT_TASK, short_task_limit

    jitted = tg.kernel(numba.njit(nogil=True)(lambda x: None), modes="rw")
    held = tg.kernel(numba.njit(lambda x: None), modes="rw")  # compiled, GIL kept
    plain = tg.kernel(lambda x: None, modes="rw")
    assert (jitted.nogil, held.nogil, plain.nogil) == (True, False, False)
    assert tg.kernel(lambda x: None, modes="rw", nogil=True).nogil
    assert all(k.nogil for k in CHOLESKY_KERNELS)
    assert short_task_limit({*CHOLESKY_KERNELS, jitted}) == SHORT_KERNEL
    assert short_task_limit({*CHOLESKY_KERNELS, plain}) == SHORT_TASK
    assert short_task_limit({jitted, tg.task(lambda: None)}) == SHORT_TASK
    # a Python wrapper of a nogil function holds the GIL itself, though functools.wraps
    # copies the jitted function's options onto it (unless it says otherwise)
    inner = numba.njit(nogil=True)(lambda x: None)
    wrapper = functools.wraps(inner)(lambda x: inner(x))
    assert not tg.kernel(wrapper, modes="rw").nogil
    assert not tg.kernel(numba.jit(nogil=True, forceobj=True)(lambda x: None), modes="rw").nogil
    assert SHORT_KERNEL < SHORT_TASK


def test_a_receive_hands_its_task_straight_to_the_polling_worker_only_when_it_is_the_last_wait():
    from taskgraph.plan import Message
    from taskgraph.run.executor import READY, WAITING, direct_task

    def msg(kind="tile", consumers=(7,)):
        return Message(src=1, dst=0, kind=kind, data=3, producer=2, consumers=list(consumers))

    waits, state = {7: 1, 8: 1}, {7: WAITING, 8: WAITING}
    assert direct_task(msg(), waits, state, set()) == 7
    assert direct_task(msg(), {7: 2}, state, set()) is None  # waits for something else too
    assert direct_task(msg(), waits, {7: READY}, set()) is None
    assert direct_task(msg(), waits, state, {7}) is None  # long: the network stays free
    assert direct_task(msg(consumers=(7, 8)), waits, state, set()) is None  # two readers
    assert direct_task(msg(kind="value"), waits, state, set()) is None  # unpickled first
    assert direct_task(msg(kind="signal"), waits, state, set()) is None
    # what else holds it back is a send of this rank still in flight: the worker
    # tests that send as it polls for the message
    out = Message(src=0, dst=1, kind="tile", data=5, producer=6, release=[7])
    other = Message(src=0, dst=1, kind="tile", data=9, producer=6, release=[8])
    assert direct_task(msg(), {7: 2}, state, set(), [out]) == 7
    assert direct_task(msg(), {7: 2}, state, set(), [other]) is None
    assert direct_task(msg(), {7: 3}, state, set(), [out]) is None  # and something else


BLAS_LOADED_IN_A_TASK = """
import sys
import taskgraph as tg
from threadpoolctl import threadpool_info

assert "scipy.linalg" not in sys.modules  # (else this script tests nothing)

@tg.task
def blas_threads_in_a_task():
    import scipy.linalg  # loads scipy's own BLAS, in the run, for the first time
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

with tg.Graph("lazy") as g:
    seen = blas_threads_in_a_task()
tg.JobCluster(workers=2).run(g).wait()
print(sorted(seen.result().values()))
"""


def test_a_blas_first_loaded_inside_a_task_is_held_to_one_thread_too():
    """threadpoolctl limits only the libraries loaded when the limit is set: scipy's
    BLAS, first imported by a task, ran on every core in each of the workers."""
    import subprocess
    import sys

    from conftest import _clean_env

    env = _clean_env(TASKGRAPH_MPI="0", OPENBLAS_NUM_THREADS="", OMP_NUM_THREADS="")
    proc = subprocess.run(
        [sys.executable, "-c", BLAS_LOADED_IN_A_TASK],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[1, 1]", proc.stdout


def _stuck_in_c(release):
    """A kernel whose task waits in C (a lock) until ``release`` is set: no exception
    can reach it meanwhile."""
    import taskgraph as tg

    @tg.kernel(modes="rw", dims="mn")
    def wait_in_c(t):
        release.wait()

    return wait_in_c


@pytest.mark.timeout(60)
def test_a_task_stuck_in_a_c_call_is_abandoned_and_the_next_run_works():
    """A task that never returns from C cannot be interrupted: past its timeout the run
    fails naming it, nothing waits for its thread (a daemon, holding neither the
    executor's lock nor the network token), and the next run works beside it."""
    import threading
    import time

    import taskgraph as tg
    from taskgraph.run.executor import STOP_GRACE

    release = threading.Event()
    kern = _stuck_in_c(release)
    kern.timeout = 0.3
    B = tg.TiledMatrix.zeros((2, 2), 2, name="A")
    with tg.Graph("stuck in C") as g:
        kern(B[0, 0].rw)
    run = tg.current_cluster().run(g)
    t0 = time.monotonic()
    try:
        with pytest.raises(tg.TaskError, match=r"timed out after 0\.3 s") as info:
            run.wait(timeout=30)
        assert time.monotonic() - t0 < 0.3 + STOP_GRACE + 5
        assert info.value.task == "wait_in_c(A[0,0])"
        ex = run.executor
        stuck = [t for t in threading.enumerate() if t.name.startswith("taskgraph-worker")]
        assert len(stuck) == 1 and stuck[0].daemon
        assert ex.lock.acquire(blocking=False) and ex.net_token.acquire(blocking=False)
        ex.lock.release()
        ex.net_token.release()
        C = tg.TiledMatrix.random_spd(200, 100)
        from taskgraph.linalg import cholesky

        tg.current_cluster().run(cholesky(C)).wait(timeout=30)
    finally:
        release.set()  # the C call returns, the pending exception ends the thread
    deadline = time.monotonic() + 5
    while stuck[0].is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not stuck[0].is_alive()


@pytest.mark.timeout(60)
def test_a_run_level_timeout_applies_to_tasks_without_their_own():
    """Executor(task_timeout=) limits every task whose function has no timeout; a
    function's own timeout wins over it."""
    import time

    import taskgraph as tg
    from taskgraph.run import comm
    from taskgraph.run.executor import Executor, timeouts_by_function

    @tg.task
    def slow():
        while True:
            time.sleep(0.01)

    @tg.task
    def patient():
        time.sleep(0.3)
        return 1

    patient.timeout = 5.0
    with tg.Graph("limits") as g:
        slow()
        p = patient()
    fns = {t.fn for t in g.tasks}
    assert timeouts_by_function(fns, 0.2) == {slow: 0.2, patient: 5.0}
    assert timeouts_by_function(fns, None) == {patient: 5.0}
    ex = Executor(g, tg.make_plan(g, 1).for_rank(0), comm.Network(), 2, task_timeout=0.2)
    with pytest.raises(tg.TaskError, match=r"slow#0\(\) on rank 0/1 .*timed out after 0\.2 s"):
        ex.run()
    assert ex.values.get(p.id) in (None, 1)  # (patient may finish: the run ends meanwhile)


@pytest.mark.timeout(60)
def test_cancel_any_number_of_times_from_any_thread_during_and_after_a_run():
    """cancel() before the run starts, many times from several threads while it runs
    and while it concludes, and after it ended: one RunError, with the first reason,
    and the next run works."""
    import threading
    import time

    import taskgraph as tg
    from taskgraph.run import comm
    from taskgraph.run.executor import Executor

    @tg.kernel(modes="rw", dims="mn")
    def nap(t):
        time.sleep(0.01)

    B = tg.TiledMatrix.zeros((2, 2), 2)
    with tg.Graph("naps") as g:
        for _ in range(500):
            nap(B[0, 0].rw)
    ex = Executor(g, tg.make_plan(g, 1).for_rank(0), comm.Network(), 2)
    ex.cancel("first")  # before it runs: it stops at once
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            ex.cancel("again")

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for th in threads:
        th.start()
    try:
        with pytest.raises(tg.RunError, match="RunError: first") as info:
            ex.run()
        assert "still running" not in str(info.value)
    finally:
        stop.set()
        for th in threads:
            th.join(5)
    ex.cancel("after")
    ex.cancel("after")
    run = tg.current_cluster().run(g)
    time.sleep(0.2)
    run.cancel()
    run.cancel()
    with pytest.raises(tg.RunError, match="cancelled by the user"):
        run.wait(timeout=20)
    run.cancel()  # after the end: nothing happens
    with tg.Graph("after") as g2:
        nap(B[0, 0].rw)
    tg.current_cluster().run(g2).wait(timeout=20)
