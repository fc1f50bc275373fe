"""A graph running on the ranks of a batch job (or an engine's ranks): :class:`Run`.

Made by :meth:`taskgraph.cluster.JobCluster.run`; see :mod:`taskgraph.cluster` for the
picture. Several runs may be in flight at once. The thread that makes a run queues its
communicators there (:class:`~taskgraph.run.comm.RunComms`: every rank makes runs in
the same order, so every rank pairs up the same ones; they are made one at a time).
The run's own thread waits only for the earlier runs still going that write data it
uses, or use data it writes (:mod:`taskgraph.cluster.overlap`), compiles the graph's
kernels, checks that every rank built the same graph (:func:`check_same_graph`), then
runs this rank's share with an :class:`~taskgraph.run.executor.Executor` of its own
(its own worker threads and receive buffers)::

    queued ──(the earlier runs it overlaps ended)──► running ──► done | failed
      (only while such a run goes on: otherwise it is running at once)

A failure or a cancel stays in its run. BLAS's thread count is process-wide: the runs
in flight share one hold on it (:func:`blas_limit`).

Its values (:class:`RunValues`) are its own (:class:`~taskgraph.cluster.handle.RunHandle`);
a value one rank holds is fetched collectively (:func:`taskgraph.run.comm.share_value`).
When the run ends well, the plain data it wrote go from their home rank to every rank,
into the user's own arrays and objects (:func:`share_data`; see
:mod:`taskgraph.dsl.datadeps`), before ``wait()`` returns; a graph without plain data
costs nothing more.
:class:`IdleRun` is the handle a rank outside a smaller cluster gets: nothing runs there.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import GraphError, RunError
from ..dsl.datadeps import Data, settle, written_data
from ..dsl.fingerprint import compare_ranks
from ..dsl.graph import Graph
from ..dsl.options import NO_RUN_OPTIONS, RunOptions
from ..dsl.tilecheck import check_tiles
from ..plan.planner import Plan
from ..run.comm import (
    RunComms,
    World,
    dumps,
    loads,
    share_value,
    tell_written,
    wait_sleeping,
    wait_written,
    wire,
)
from ..run.dynamic import SpawnFuture, check_values, running_here
from ..run.executor import Executor, gc_frozen
from ..trace.events import Trace
from .handle import RunHandle
from .overlap import data_names, footprint, left_stale, must_wait

if TYPE_CHECKING:
    from .job import JobCluster

_compiled: set[tuple[int, str]] = set()
_compile_lock = threading.Lock()


def compile_kernels(graph: Graph) -> float:
    """Compile every kernel the graph uses for its dtypes, once per process; seconds."""
    dtypes = sorted(graph.dtypes_used(), key=str) or [np.dtype(np.float64)]
    seconds = 0.0
    with _compile_lock:
        for fn in graph.kernels_used():
            if not hasattr(fn, "compile"):
                continue
            todo = [dt for dt in dtypes if (id(fn), dt.str) not in _compiled]
            if todo:
                seconds += fn.compile(todo)
                _compiled.update((id(fn), dt.str) for dt in todo)
    return seconds


def share_data(world: World | RunComms, items: list[tuple[Data, int]], what: str) -> None:
    """Each ``(item, home)``'s value from rank ``home`` to every rank of ``world``, into
    the value each rank holds (:func:`taskgraph.dsl.datadeps.settle`). Collective over
    ``world.values`` (a run's own :class:`RunComms`, so that two runs ending at once
    never mix their broadcasts): every rank calls it with the same list (the plan's),
    after a run that ended well everywhere. ``what`` names the run in errors."""
    comm = world.values
    if comm is None or world.size == 1:
        return
    for item, home in items:
        if item.is_array:
            _share_array(comm, item, home)
        else:
            _share_object(comm, world.rank, item, home, what)


def _share_array(comm, item: Data, home: int) -> None:
    """An array as its buffer (no pickle): into the rank's own array where it is one C
    buffer, else through a C-ordered copy."""
    mine = item.value
    if comm.Get_rank() == home:
        wait_sleeping(comm.Ibcast(wire(np.ascontiguousarray(mine)), home))
        return
    direct = mine.flags.c_contiguous and mine.flags.writeable
    buf = mine if direct else np.empty(mine.shape, mine.dtype)
    wait_sleeping(comm.Ibcast(wire(buf), home))
    if not direct:
        settle(item, buf)


def _share_object(comm, rank: int, item: Data, home: int, what: str) -> None:
    """An object pickled (protocol 5): its size first (-1: it cannot be pickled, an
    error on every rank), then the bytes."""
    payload, problem = b"", ""
    if rank == home:
        try:
            payload = dumps(item.value)
        except Exception as exc:  # noqa: BLE001 - told to every rank, then raised
            problem = f"{type(exc).__name__}: {exc}"
    size = np.array([len(payload) if not problem else -1], dtype=np.int64)
    wait_sleeping(comm.Ibcast(size, home))
    if size[0] < 0:
        raise RunError(
            f"run {what}: {item.describe()} on rank {home} cannot be sent to the other "
            f"ranks after the run{': ' + problem if problem else ''}"
        )
    buf = bytearray(payload) if rank == home else bytearray(int(size[0]))
    wait_sleeping(comm.Ibcast(buf, home))
    if rank != home:
        settle(item, loads(buf))


def check_same_graph(graph: Graph, net) -> None:
    """Raise GraphError on every rank if the ranks of ``net`` built different graphs,
    naming the first task that differs (:func:`taskgraph.dsl.fingerprint.compare_ranks`:
    one allgather of 24 bytes when they agree). Collective over ``net``."""
    if net.size == 1:
        return
    message = compare_ranks(graph, net.allgather)
    if message is not None:
        raise GraphError(f"run {graph.name!r}, rank {net.rank}/{net.size}: {message}")


class RunValues(dict):
    """A batch run's values on this rank.

    A value that only one rank holds (the task has successors, so it is not shared at
    the end) reads as absent (``in`` is False) on every rank until it has been
    shared, so that :meth:`RunHandle.result` fetches it on every rank alike.
    Indexing still returns what this rank holds.

    ``held``: the task ids whose values one rank holds, not yet shared.
    """

    def __init__(self, held: set[int]):
        super().__init__()
        self.held = held  # task ids whose values one rank holds, not yet shared

    def __contains__(self, tid) -> bool:
        return dict.__contains__(self, tid) and tid not in self.held

    def __setitem__(self, tid, value) -> None:
        self.held.discard(tid)
        dict.__setitem__(self, tid, value)

    def __getstate__(self):
        return dict(self)


_blas_lock = threading.Lock()
_blas_holds: list[int] = []  # the BLAS limit of each run in flight
_blas_first = None  # the limiter of the first hold: it restores the original


@contextmanager
def blas_limit(threads: int):
    """BLAS held to ``threads`` threads for the duration. The limit is process-wide, so
    the runs in flight share it: the smallest limit among them holds, and the last one
    to end restores what was there before (two plain ``threadpool_limits`` blocks would
    let the first run to end lift the limit under the other)."""
    global _blas_first
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        _blas_holds.append(threads)
        if _blas_first is None:
            _blas_first = threadpool_limits(limits=threads, user_api="blas")
        elif threads < min(_blas_holds[:-1]):
            threadpool_limits(limits=threads, user_api="blas")
    try:
        yield
    finally:
        with _blas_lock:
            _blas_holds.remove(threads)
            if not _blas_holds:
                _blas_first.restore_original_limits()
                _blas_first = None
            elif threads < min(_blas_holds):
                threadpool_limits(limits=min(_blas_holds), user_api="blas")


THREAD_END = 2.0  # seconds wait() gives a run's thread, ended, to return
_flight_lock = threading.Lock()
_in_flight: list[Run] = []  # the runs of this process not ended yet, in the order made


class Run(RunHandle):
    """A graph executing on a job's ranks; returned at once by :meth:`JobCluster.run`.

    States: queued (only while an earlier run still going writes data this one uses,
    or uses data this one writes: :mod:`taskgraph.cluster.overlap`), running, done or
    failed; other runs in flight run at once. ``wait()`` raises the run's error;
    ``result(future)`` or ``future.result()`` gives a value (collective in batch: see
    the module doc). Make runs from one thread (every rank in the same order).

    Parameters
    ----------
    cluster : the job cluster (this rank is one of its members).
    graph : the graph to run.
    workers : worker threads on this rank.
    blas_threads : BLAS threads per worker.
    plan : a plan made already (None: planned here).
    trace : record events.
    task_timeout : seconds any task may run unless it has a ``timeout`` of its own.
    open : the run takes :meth:`submit` calls until :meth:`close` (or ``wait()``).
    options : the run's failure policy, checkpoint and launch throttle.
    """

    def __init__(
        self,
        cluster: JobCluster,
        graph: Graph,
        workers: int,
        blas_threads: int,
        plan: Plan | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
        open: bool = False,
        options: RunOptions = NO_RUN_OPTIONS,
    ):
        assert cluster.world is not None and cluster.rank is not None  # (a member's)
        super().__init__(cluster, graph, plan)
        self.world: World = cluster.world
        self.tracing = trace
        self.workers = workers
        self.blas_threads = blas_threads
        self.task_timeout = task_timeout
        self.options = options
        self.open = open
        self._closed = not open  # (under _lock) no more submitted calls
        self.rank_plan = self.plan.for_rank(cluster.rank)
        self.world.runs += 1
        self.id = self.world.runs  # (the same on every rank of the world: SPMD)
        self.values = RunValues(set(self._valued) - set(self.rank_plan.results))
        self._own_graph()
        self._error: BaseException | None = None
        self._executor: Executor | None = None
        self._lock = threading.Lock()
        self._cancel_reason: str | None = None
        self._given_up = False  # a wait(timeout) ran out: see finish_runs_at_exit
        self._begun = threading.Event()  # no earlier run to wait for any more
        self._started = threading.Event()
        self._finished = threading.Event()  # waited on, not join(): see join()
        self._cursor = (0, 0)
        self._trace: Trace | None = None
        # the plain data the run wrote -> their final values, once it ended well
        self.data_values: dict[int, object] = {}
        self._waits_for = self._overlapping()
        if not self._waits_for:
            self._begun.set()  # running from the start: nothing to wait for
        self._comms = self.world.run_comms()  # (queued here: in the order runs are made)
        self._pool = cluster.take_pool()
        self._thread = threading.Thread(target=self._main, name="taskgraph-run", daemon=True)
        self._thread.start()

    def _overlapping(self) -> list[Run]:
        """The runs still going that this one must wait for (and count this one in)."""
        self.footprint = footprint(self.graph)
        with _flight_lock:
            earlier = [r for r in _in_flight if must_wait(r.footprint, self.footprint)]
            _in_flight.append(self)
        return earlier

    def _main(self) -> None:
        for earlier in self._waits_for:
            earlier.join()  # it writes what this run uses (or the other way round)
        waited, self._waits_for = self._waits_for, []
        self._begun.set()
        try:
            self._execute(waited)
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc
        finally:
            self._comms.close(retire=self._error is not None)
            self.cluster.give_pool(self._pool)
            with _flight_lock:
                _in_flight.remove(self)
            self._started.set()
            self._finished.set()

    def _execute(self, waited: list[Run]) -> None:
        self._comms.ready()
        self._check_not_stale(waited)
        self.compile_seconds = compile_kernels(self.graph)
        # (scipy's BLAS is loaded already, by JobCluster: the limit covers only the
        # libraries loaded when it is set)
        with blas_limit(self.blas_threads), gc_frozen():
            net = self._comms.network()
            try:
                check_same_graph(self.graph, net)
                check_tiles(self.graph, net)  # a replaced tile fails here, named
                self._check_not_cancelled(net)
            except BaseException:
                net.close()
                raise
            ex = self._executor_for(net)
            with self._lock:
                self._executor, reason = ex, self._cancel_reason
                if self.open and self._closed:  # closed before it started
                    ex.close_submissions()
            self._started.set()
            if reason is not None:
                ex.cancel(reason)
            t0 = time.perf_counter()
            try:
                ex.run()
            finally:
                self.seconds = time.perf_counter() - t0
                self._stats = ex.stats
                self._claim_values(ex)
            self._share_data()

    def _check_not_stale(self, waited: list[Run]) -> None:
        """RunError (on every rank: a run fails on all) if a run this one was queued
        behind failed, and writes data this one uses: it would read half-written or old
        values with no word (a trial)."""
        for earlier in waited:
            stale = earlier._error is not None and left_stale(earlier.footprint, self.footprint)
            if stale:
                what = ", ".join(data_names(self.graph, stale))
                raise RunError(
                    f"run {self.graph.name!r} not run: it was queued behind run "
                    f"{earlier.graph.name!r}, which failed ({type(earlier._error).__name__}) "
                    f"and writes data it uses ({what}); run it again once that data is right"
                )

    def _check_not_cancelled(self, net) -> None:
        """RunError on every rank, before any task runs, if the run was cancelled on any
        rank while it was queued (a cancel made on one rank only counts too)."""
        with self._lock:
            mine = self._cancel_reason
        reasons = net.allgather(mine) if net.size > 1 else [mine]
        for rank, reason in enumerate(reasons):
            if reason is not None:
                raise RunError(
                    f"run {self.graph.name!r} was cancelled before it started, on rank "
                    f"{rank}/{net.size}: {reason}"
                )

    def _share_data(self) -> None:
        """The run ended well on every rank: each plain datum it wrote, from its home to
        every rank (nothing at all for a graph without plain data)."""
        written = written_data(self.graph, self.rank_plan.homes)
        if not written:
            return
        items: dict[int, Data] = {}
        for d in written:
            item = self.graph.data[d].item
            assert item is not None  # (written_data gives plain data only)
            items[d] = item
        homes = self.rank_plan.homes
        share_data(
            self._comms, [(item, homes[d]) for d, item in items.items()], repr(self.graph.name)
        )
        self.data_values = {d: item.value for d, item in items.items()}

    def _executor_for(self, net) -> Executor:
        extra: dict = {} if self.task_timeout is None else {"task_timeout": self.task_timeout}
        return Executor(
            self.graph,
            self.rank_plan,
            net,
            self.workers,
            self._pool,
            self.tracing,
            compile_seconds=self.compile_seconds,  # (traced apart from the run's time)
            open=self.open,
            options=self.options,
            **extra,
        )

    def _claim_values(self, ex: Executor) -> None:
        """Keep the values the executor made (this rank's and every sink's) as they
        are: a value one rank holds stays absent (``held``) until fetched."""
        dict.update(self.values, ex.results)

    def done(self) -> bool:
        """Whether the run has ended (done or failed) on this rank."""
        return self._finished.is_set()

    def state(self) -> str:
        """``"queued"`` (waiting for an earlier run it overlaps: see the class doc),
        ``"running"``, ``"done"`` or ``"failed"``."""
        if self._finished.is_set():
            return "failed" if self._error is not None else "done"
        return "running" if self._begun.is_set() else "queued"

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks) on this rank."""
        ex = self._executor
        if ex is not None:
            return ex.progress()
        return (0, 0) if self.graph.internal else (0, len(self.rank_plan.tasks))

    def calls_ended(self) -> int:
        """Spawned and submitted calls of this rank (wherever they ran) ended so far."""
        ex = self._executor
        return ex.calls_finished if ex is not None else 0

    def batches(self) -> list[dict]:
        """This rank's events since the last call (the notebook view polls these)."""
        ex = self._executor
        if ex is None:
            return []
        batch, self._cursor = ex.trace.batch(self._cursor)
        batch.update(ex.counts(), elapsed=ex.trace.now(), final=self.done())
        return [batch]

    @property
    def trace(self) -> Trace:
        """The run's events, merged over every rank on rank 0 (this rank's elsewhere);
        waits for the run to end (an open run is closed first, with a warning)."""
        self._close_to_read("trace")
        self.join()
        if self._trace is None:
            trace = Trace.for_graph(self.graph, self.cluster.size)
            ex = self._executor
            parts = ex.trace_parts if ex is not None else None
            if parts is None and ex is not None:
                parts = [ex.trace.batch()[0]]
            for part in parts or []:
                trace.ingest(part)
            trace.finish(str(self._error) if self._error is not None else None)
            trace.file_sync = self._file_sync
            self._trace = trace
        return self._trace

    def _file_sync(self, path: str) -> None:
        """Rank 0 wrote the trace file ``path`` (the others write nothing): the other
        ranks wait for it, so that code after ``to_chrome`` may read it on any rank."""
        if self.world.rank == 0:
            tell_written(self.world, path)
        elif not wait_written(self.world, path, self.cluster.fetch_timeout):
            print(
                f"taskgraph: rank {self.world.rank}: rank 0 did not write {path} within "
                f"{self.cluster.fetch_timeout:g} s (does every rank write the trace?)",
                file=sys.stderr,
            )

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end, without raising its error.

        An Event, not ``Thread.join``: a KeyboardInterrupt that lands in
        ``Thread.join`` can leave the thread looking finished while it still runs.
        """
        return self._finished.wait(timeout)

    @property
    def executor(self) -> Executor | None:
        """This rank's executor once the run has started (None before)."""
        return self._executor

    def submit(self, fn, /, *args, **kwargs) -> SpawnFuture:
        """Add the call ``fn(*args, **kwargs)`` to the running run; its future, at once.

        The call goes to this rank's pool of spawned work as a call of no task: an idle
        rank may steal it (where the graph has plain ``@tg.task`` functions), and its
        value comes back here: ``fut.result()`` on this rank only (see
        :func:`taskgraph.as_completed`). A failed call fails its future, not the run.
        A queued run: waits until it starts. RunError once the run has ended, or was
        closed (:meth:`close`); a run made with ``open=True`` goes on until closed."""
        self._started.wait()
        with self._lock:
            ex, closed = self._executor, self._closed and self.open
        if ex is None or self._finished.is_set() or closed:
            what = "was closed" if closed and not self._finished.is_set() else "has ended"
            raise RunError(
                f"run {self.graph.name!r} {what} on rank {self.world.rank}/"
                f"{self.world.size}: {getattr(fn, '__name__', repr(fn))} not submitted"
            )
        check_values(fn, args, kwargs, "run.submit")
        fut = ex.submit(fn, args, kwargs)
        self._submitted += 1  # (a look that closes the run then says so)
        return fut

    def close(self) -> None:
        """No more :meth:`submit` calls: an open run ends once its tasks and the calls
        submitted have ended. Any thread, any number of times; ``wait()`` closes too."""
        with self._lock:
            self._closed = True
            ex = self._executor
        if ex is not None:
            ex.close_submissions()

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run ends (a queued run: starts and ends); raise its error if
        it failed on any rank; TimeoutError if it is still going after ``timeout`` s.
        An open run is closed first (:meth:`close`). GraphError inside one of
        its own tasks (it would wait for itself)."""
        self._refuse_own_task("run.wait()")
        self.close()
        try:
            self.join(timeout)
        except KeyboardInterrupt:
            self.cancel("interrupted (KeyboardInterrupt)")
            self.join()
            raise
        if not self.done():
            self._given_up = True  # (a script that ends now cancels it: finish_runs_at_exit)
            raise TimeoutError(f"run of {self.graph.name!r} still {self.state()} after {timeout} s")
        # (its last lines too: a script that ends now goes into MPI_Finalize, which no
        # thread that called MPI should still be running beside)
        if self._thread is not threading.current_thread():
            self._thread.join(THREAD_END)
        if self._error is not None:
            raise self._error
        self._say_summary()  # (in a script, if anything failed, was skipped or retried)
        return self

    def _refuse_own_task(self, what: str) -> None:
        """GraphError if this thread runs one of this run's tasks: the run cannot end
        before the task does (a task that read another's future without taking it as an
        argument hung its run, a trial)."""
        here = running_here(self._executor) if self._executor is not None else None
        if here is not None:
            raise GraphError(
                f"{here} waits for its own run {self.graph.name!r} to end ({what}): it "
                "never would. Pass the future to the task as an argument (the task then "
                "gets its value), or spawn the work with tg.spawn and wait for that"
            )

    def result(self, future=None):
        """The value of ``future`` in this run, as :meth:`RunHandle.result` gives it;
        GraphError inside one of this run's own tasks (it would wait for itself)."""
        self._refuse_own_task("future.result()" if future is not None else "run.result()")
        return super().result(future)

    def cancel(self, reason: str | None = None) -> None:
        """Stop the run on every rank; ``wait()`` then raises RunError naming ``reason``
        (default "cancelled by the user"). A queued run is stopped as it starts (every
        rank takes part in it, so that none waits for this one)."""
        reason = reason or "cancelled by the user"
        with self._lock:
            ex = self._executor
            if ex is None:
                self._cancel_reason = reason
                return
        ex.cancel(reason)

    def _fetch(self, tid: int):
        """The value of task ``tid`` from the rank that holds it, on every rank."""
        self.wait()
        if tid in self.values:
            return self.values[tid]
        label = self.graph.label(tid)
        return share_value(
            self.world,
            self.plan.placement[tid],
            (self.id, tid, label),
            dict.get(self.values, tid),
            self.cluster.fetch_timeout,
            f"task {label} (run {self.graph.name!r})",
        )


class IdleRun(RunHandle):
    """A run of a cluster this rank is not part of (``tg.Cluster(n)`` with n smaller
    than the job): the graph is planned here, as on every rank, and nothing else
    happens; ``wait()`` returns at once. Its figures are NaN, its trace empty; values
    live on the cluster's ranks only, and asking for one here raises RunError.

    Parameters
    ----------
    cluster : the job cluster this rank is not a member of.
    graph : the graph its ranks run.
    plan : a plan made already (None: planned here).
    """

    def __init__(self, cluster: JobCluster, graph: Graph, plan: Plan | None = None):
        super().__init__(cluster, graph, plan)
        self.seconds = self.compile_seconds = math.nan
        self.executor = None
        self.values = RunValues(set(self._valued))  # all absent: every one is elsewhere
        self._own_graph()

    def done(self) -> bool:
        """True: nothing runs here."""
        return True

    def state(self) -> str:
        """``"done"``: nothing runs here."""
        return "done"

    def join(self, timeout: float | None = None) -> bool:
        """True at once: nothing runs here."""
        return True

    def wait(self, timeout: float | None = None) -> IdleRun:
        """Return at once: nothing runs here."""
        return self

    def cancel(self, reason: str | None = None) -> None:
        """Nothing runs here: nothing to stop."""

    def submit(self, fn, /, *args, **kwargs):
        """RunError: nothing runs on this rank (submit on the cluster's ranks)."""
        raise RunError(
            f"rank {self.cluster.job.rank} is not one of the {self.cluster.size} rank(s) of "
            f"this cluster, so run {self.graph.name!r} takes no calls here: submit on "
            f"ranks 0..{self.cluster.size - 1}"
        )

    def close(self) -> None:
        """Nothing runs here: nothing to close."""

    def progress(self) -> tuple[int, int]:
        """(0, 0): no task runs here."""
        return (0, 0)

    def batches(self) -> list[dict]:
        """No events here: an empty list."""
        return []

    @property
    def trace(self) -> Trace:
        """An empty trace (the cluster's ranks have the events)."""
        trace = Trace.for_graph(self.graph, self.cluster.size)
        trace.finish(None)
        return trace

    def show(self, **kwargs) -> None:
        """Nothing to show on a rank outside the cluster (its ranks show the run)."""

    def result(self, future=None):
        """RunError: the values live on the cluster's ranks, not this one."""
        return self._fetch(future.id if future is not None else -1)

    def _fetch(self, tid: int):
        raise RunError(
            f"rank {self.cluster.job.rank} is not one of the {self.cluster.size} rank(s) of "
            f"this cluster, so run {self.graph.name!r} has no values here: use them on "
            f"ranks 0..{self.cluster.size - 1}, or make tg.Cluster() of the whole job"
        )

    def __repr__(self) -> str:
        return f"<Run {self.graph.name!r} on {self.cluster.size} ranks, not this one>"


def runs_in_flight() -> list[Run]:
    """The runs of this process that have not ended, in the order they were made."""
    with _flight_lock:
        return list(_in_flight)


def finish_runs_at_exit() -> None:
    """The script ends on this rank while runs are going (``run.wait()`` was left to
    rank 0 only, or forgotten): each is closed and waited for, its error said, before
    MPI_Finalize. Those runs need this rank: the job hung there with no word (a trial,
    5 of 5)."""
    if "ipyparallel.engine" in sys.modules:  # (an engine's runs are its client's)
        return
    for run in runs_in_flight():
        rank = f"rank {run.world.rank}/{run.world.size}"
        if run._given_up:  # (its wait(timeout) ran out, and the script went on to end)
            print(f"taskgraph: {rank}: the script ended after giving up on run "
                  f"{run.graph.name!r}: cancelled", file=sys.stderr, flush=True)  # fmt: skip
            run.cancel("the script ended after its wait(timeout) ran out")
            run.join(10.0)
            continue
        print(
            f"taskgraph: {rank}: the script ended while run {run.graph.name!r} was "
            f"{run.state()}: waiting for it here, as every rank takes part in it (call "
            "run.wait() on every rank)",
            file=sys.stderr,
            flush=True,
        )
        run.close()
        try:
            run.join()
        except KeyboardInterrupt:  # (a second Ctrl-C: stop it, as wait() does)
            run.cancel("interrupted (KeyboardInterrupt) at the script's end")
            run.join(10.0)
        if run._error is not None:
            name, error = run.graph.name, run._error
            print(f"taskgraph: {rank}: run {name!r} failed: {error}", file=sys.stderr)


# before MPI_Finalize (an atexit function): the ranks' runs must end first
threading._register_atexit(finish_runs_at_exit)  # type: ignore[attr-defined]
