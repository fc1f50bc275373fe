"""Clusters and runs: where graphs execute, and the handle a run returns.

In a batch job (``mpiexec -n 4 python script.py``, or ``taskgraph run -n 4``) every
rank runs the same script (SPMD), and ``tg.Cluster()`` means the ranks of that job:
each rank plans the graph for itself (plans are deterministic, so all agree) and runs
its own share. ``tg.Cluster(n=2)`` inside a job of 4 ranks is the job's first 2 ranks
(a communicator of their own); the other ranks take part in no run of that cluster
(see :class:`JobCluster`). Without an MPI launcher, ``tg.Cluster()`` is one rank and
mpi4py is never imported.

``cluster.run(graph)`` checks and plans the graph at once (a malformed graph raises
here), then executes it in a background thread and returns a :class:`Run`:
``wait()`` blocks and raises if the run failed on any rank, ``done()`` polls,
``cancel()`` stops it on every rank. Runs execute one at a time per process, in the
order they were made (the same on every rank)::

    run(g1) ─► Run #1  running ──────────► done
    run(g2) ─► Run #2  queued ···········► running ─────► done

Before a run starts, every rank checks that all ranks built the same graph (a
fingerprint, :mod:`taskgraph.fingerprint`): a graph built in another order or with
other arguments on some rank fails on every rank, naming the first task that differs.

Values of ``@tg.task`` calls stay on the rank that computed them; only the values of
tasks that no other task reads (sinks) reach every rank at the end of the run. In
batch, ``future.result()`` on any other value is collective: every rank calls it
(SPMD), the rank that holds the value sends it to the others
(:func:`taskgraph.comm.share_value`), and a rank that never calls makes the others fail
after ``fetch_timeout`` seconds with an error naming the task and the ranks, instead of
hanging.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
import threading
import time
from typing import Any

import numpy as np

from . import config
from .comm import World, share_value, tell_written, wait_written, world
from .errors import GraphError, RunError
from .executor import BufferPool, Executor, Stats, gc_frozen
from .graph import Graph
from .plan import Plan, make_plan
from .trace import Trace

FETCH_TIMEOUT = 120.0  # seconds a rank waits for another's value in future.result()

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


def check_same_graph(graph: Graph, net) -> None:
    """Raise GraphError on every rank if the ranks of ``net`` built different graphs,
    naming the first task that differs (:func:`taskgraph.fingerprint.compare_ranks`:
    one allgather of 24 bytes when they agree). Collective over ``net``."""
    if net.size == 1:
        return
    try:
        fp = importlib.import_module(".fingerprint", __package__)
    except ImportError:  # (the module lands with the graph fingerprint)
        return
    message = fp.compare_ranks(graph, net.allgather)
    if message is not None:
        raise GraphError(f"run {graph.name!r}, rank {net.rank}/{net.size}: {message}")


class RunValues(dict):
    """A batch run's values on this rank: the graph's ``results`` while it is the
    run's.

    A value that only one rank holds (the task has successors, so it is not shared at
    the end) reads as absent (``in`` is False) on every rank until it has been
    shared, so that :meth:`Graph.result` asks the run's fetch hook, which every rank
    calls alike. Indexing still returns what this rank holds.
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


_queue_lock = threading.Lock()
_last_run: Run | None = None  # the run a new run waits for


class Run:
    """A graph executing on a cluster; returned at once by :meth:`JobCluster.run`.

    States: queued (an earlier run of this process still going), running, done or
    failed. ``wait()`` raises the run's error; ``result(future)`` or
    ``future.result()`` gives a value (collective in batch: see the module doc).
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
    ):
        global _last_run
        assert cluster.world is not None and cluster.rank is not None  # (a member's)
        self.cluster = cluster
        self.world: World = cluster.world
        self.tracing = trace
        self.graph = graph
        self.workers = workers
        self.blas_threads = blas_threads
        self.task_timeout = task_timeout
        self.plan = plan if plan is not None else make_plan(graph, cluster.size)
        self.rank_plan = self.plan.for_rank(cluster.rank)
        self.world.runs += 1
        self.id = self.world.runs  # (the same on every rank of the world: SPMD)
        self._valued = {t.id for t in graph.tasks if not hasattr(t.fn, "modes")}
        self.values = RunValues(self._valued - set(self.rank_plan.results))
        self._own_graph()
        self.compile_seconds = 0.0
        self.seconds = 0.0
        self.stats = Stats()
        self._error: BaseException | None = None
        self._executor: Executor | None = None
        self._lock = threading.Lock()
        self._cancel_reason: str | None = None
        self._begun = threading.Event()  # no earlier run to wait for any more
        self._started = threading.Event()
        self._finished = threading.Event()  # waited on, not join(): see join()
        self._cursor = (0, 0)
        self._trace: Trace | None = None
        with _queue_lock:
            self._previous, _last_run = _last_run, self
        self._thread = threading.Thread(target=self._main, name="taskgraph-run", daemon=True)
        self._thread.start()

    def _own_graph(self) -> None:
        """Point the graph's futures at this run: its values, its fetch."""
        g = self.graph
        g.results = self.values
        g.result_ranks.clear()
        g.result_ranks.update((t, self.plan.placement[t]) for t in self._valued)
        g.fetch = self._fetch

    def _main(self) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            previous.join()  # one run at a time: their communicators are made in order
        self._begun.set()
        try:
            self._execute()
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc
        finally:
            self._started.set()
            self._finished.set()

    def _execute(self) -> None:
        from threadpoolctl import threadpool_limits

        self.compile_seconds = compile_kernels(self.graph)
        # (scipy's BLAS is loaded already, by JobCluster: the limit covers only the
        # libraries loaded when it is set)
        with threadpool_limits(limits=self.blas_threads, user_api="blas"), gc_frozen():
            net = self.world.network()
            try:
                check_same_graph(self.graph, net)
            except BaseException:
                net.close()
                raise
            ex = self._executor_for(net)
            with self._lock:
                self._executor, reason = ex, self._cancel_reason
            self._started.set()
            if reason is not None:
                ex.cancel(reason)
            t0 = time.perf_counter()
            try:
                ex.run()
            finally:
                self.seconds = time.perf_counter() - t0
                self.stats = ex.stats
                self._claim_values()

    def _executor_for(self, net) -> Executor:
        extra = {} if self.task_timeout is None else {"task_timeout": self.task_timeout}
        return Executor(
            self.graph,
            self.rank_plan,
            net,
            self.workers,
            self.cluster.pool,
            self.tracing,
            compile_seconds=self.compile_seconds,  # (traced apart from the run's time)
            **extra,
        )

    def _claim_values(self) -> None:
        """The executor put its values into ``graph.results``: a later run of the same
        graph may have taken that over since (it waits for this one): take them back."""
        written = self.graph.results
        if written is not self.values:
            dict.update(self.values, written)
            dict.clear(written)

    def done(self) -> bool:
        return self._finished.is_set()

    def state(self) -> str:
        """``"queued"``, ``"running"``, ``"done"`` or ``"failed"``."""
        if self._finished.is_set():
            return "failed" if self._error is not None else "done"
        return "running" if self._begun.is_set() else "queued"

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks) on this rank."""
        ex = self._executor
        return ex.progress() if ex is not None else (0, len(self.rank_plan.tasks))

    def batches(self) -> list[dict]:
        """This rank's events since the last call (the notebook view polls these)."""
        ex = self._executor
        if ex is None:
            return []
        batch, self._cursor = ex.trace.batch(self._cursor)
        done, total = ex.progress()
        batch.update(done=done, total=total, elapsed=ex.trace.now(), final=self.done())
        return [batch]

    @property
    def trace(self) -> Trace:
        """The run's events, merged over every rank on rank 0 (this rank's elsewhere)."""
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

    def show(self, **kwargs):
        """Live view: a widget in a notebook, a progress line and trace files elsewhere."""
        from .widgets import show

        return show(self, **kwargs)

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end, without raising its error.

        An Event, not ``Thread.join``: a KeyboardInterrupt that lands in
        ``Thread.join`` can leave the thread looking finished while it still runs.
        """
        return self._finished.wait(timeout)

    @property
    def executor(self) -> Executor | None:
        return self._executor

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run ends (a queued run: starts and ends); raise its error if
        it failed on any rank; TimeoutError if it is still going after ``timeout`` s."""
        try:
            self.join(timeout)
        except KeyboardInterrupt:
            self.cancel("interrupted (KeyboardInterrupt)")
            self.join()
            raise
        if not self.done():
            raise TimeoutError(f"run of {self.graph.name!r} still {self.state()} after {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop the run on every rank; ``wait()`` then raises. A queued run is stopped
        as it starts (every rank takes part in it, so that none waits for this one)."""
        with self._lock:
            ex = self._executor
            if ex is None:
                self._cancel_reason = reason
                return
        ex.cancel(reason)

    def result(self, future=None):
        """Wait, then the value of ``future`` in this run (the graph's only sink if
        none is given). Collective in batch for a value that one rank holds: call it
        on every rank (see the module doc)."""
        self.wait()
        if future is None:
            sinks = self.rank_plan.results
            if len(sinks) != 1:
                raise RunError(f"the graph has {len(sinks)} results: name the future you want")
            tid = sinks[0]
        else:
            if future.graph is not self.graph:
                raise RunError(f"{future!r} is not a task of run {self.graph.name!r}")
            tid = future.id
        if tid not in self._valued:
            raise GraphError(f"task {self.graph.label(tid)} is a kernel: it has no value")
        if tid not in self.values:
            self.values[tid] = self._fetch(tid)
        return self.values[tid]

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

    def __repr__(self) -> str:
        return f"<Run {self.graph.name!r} on {self.cluster.size} ranks: {self.state()}>"


class IdleRun:
    """A run of a cluster this rank is not part of (``tg.Cluster(n)`` with n smaller
    than the job): the graph is planned here, as on every rank, and nothing else
    happens; ``wait()`` returns at once. Its figures are NaN, its trace empty; values
    live on the cluster's ranks only, and asking for one here raises RunError."""

    def __init__(self, cluster: JobCluster, graph: Graph, plan: Plan | None = None):
        self.cluster = cluster
        self.graph = graph
        self.plan = plan if plan is not None else make_plan(graph, cluster.size)
        self.seconds = self.compile_seconds = math.nan
        self.stats = Stats()
        self.executor = None
        graph.fetch = self._fetch
        graph.results = RunValues({t.id for t in graph.tasks})
        graph.result_ranks.clear()
        graph.result_ranks.update((t.id, self.plan.placement[t.id]) for t in graph.tasks)

    def done(self) -> bool:
        return True

    def state(self) -> str:
        return "done"

    def join(self, timeout: float | None = None) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> IdleRun:
        return self

    def cancel(self, reason: str = "") -> None:
        """Nothing runs here: nothing to stop."""

    def progress(self) -> tuple[int, int]:
        return (0, 0)

    def batches(self) -> list[dict]:
        return []

    @property
    def trace(self) -> Trace:
        trace = Trace.for_graph(self.graph, self.cluster.size)
        trace.finish(None)
        return trace

    def show(self, **kwargs) -> None:
        """Nothing to show on a rank outside the cluster (its ranks show the run)."""

    def result(self, future=None):
        return self._fetch(future.id if future is not None else -1)

    def _fetch(self, tid: int):
        raise RunError(
            f"rank {self.cluster.job.rank} is not one of the {self.cluster.size} rank(s) of "
            f"this cluster, so run {self.graph.name!r} has no values here: use them on "
            f"ranks 0..{self.cluster.size - 1}, or make tg.Cluster() of the whole job"
        )

    def __repr__(self) -> str:
        return f"<Run {self.graph.name!r} on {self.cluster.size} ranks, not this one>"


def _signature(
    n: int | None = None,
    *,
    workers: int | None = None,
    blas_threads: int | None = None,
    timeout: float = 120,
) -> None:
    """The parameters every kind of cluster takes (shown by ``tg.Cluster?``)."""


class Cluster:
    """Where graphs run: ``tg.Cluster(n=4)``.

    In a notebook (no MPI launcher), ``Cluster(n)`` starts a local ipyparallel
    controller and ``n`` engines under mpiexec, one per MPI rank
    (:class:`~taskgraph.engines.EngineCluster`). In a batch job (``mpiexec``,
    ``srun``, ``taskgraph run``) it is the job's own ranks
    (:class:`JobCluster`): ``Cluster()`` or ``Cluster(n=N)`` all N of them, ``Cluster(n)``
    with n < N the first n, and n > N is an error. ``Cluster()`` without MPI is one
    rank in this process. ``Cluster.attach(...)`` connects to engines started
    elsewhere (a SLURM job, ``ipcluster start --engines=mpi``).

    Parameters
    ----------
    n : ranks (engines); None: the job's ranks (one rank outside a job).
    workers : worker threads per rank (default: the cores of a rank's share).
    blas_threads : BLAS threads per worker (default 1).
    timeout : seconds to wait for engines to start (a notebook's cluster only).

    Use it as a context manager, or call :meth:`close`, to stop what it started.
    """

    rank: int | None
    size: int
    __signature__: Any = inspect.signature(_signature).replace(
        return_annotation=inspect.Signature.empty
    )

    def __new__(cls, n: int | None = None, **kwargs):
        if cls is Cluster:
            if n is None or config.use_mpi():
                cls = JobCluster
            else:
                from .engines import EngineCluster

                cls = EngineCluster
        return super().__new__(cls)

    @classmethod
    def attach(cls, *args, **kwargs):
        """Connect to running engines; see :meth:`taskgraph.engines.EngineCluster.attach`."""
        from .engines import EngineCluster

        return EngineCluster.attach(*args, **kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop whatever this cluster started."""

    def run(
        self,
        graph: Graph,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        plan: Plan | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
    ):
        """Plan ``graph`` and start running it; returns a run handle at once.

        ``trace=False`` records no events (tracing is on by default: it is cheap);
        ``task_timeout``: seconds any task may run (a task's own ``timeout`` wins).
        """
        raise NotImplementedError

    def gather_tiles(self, matrix, out, root) -> None:
        raise NotImplementedError


class JobCluster(Cluster):
    """The ranks of this MPI job (or a single rank without MPI).

    ``n``: None (or the job's size) for every rank of the job; fewer for the job's
    first ``n`` ranks, on a communicator of their own. Every rank of the job must make
    the cluster (collective). The other ranks get a cluster whose ``member`` is False:
    they take part in no run of it; its ``run()`` returns a handle that is done at
    once (:class:`IdleRun`), and its values are not theirs to read. More ranks than
    the job has raise ValueError.

    ``workers``, ``blas_threads``: as :class:`Cluster`; ``timeout`` is accepted for a
    notebook's code and means nothing here; ``fetch_timeout``: seconds a rank waits
    for another rank's value in ``future.result()``.
    """

    __signature__ = None  # (the real one: this __init__'s)
    rank: int | None
    remote = False
    start_seconds = 0.0  # (an engine cluster's start time; a job's ranks are there)

    def __init__(
        self,
        n: int | None = None,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        timeout: float = 120,
        fetch_timeout: float = FETCH_TIMEOUT,
        world_: World | None = None,
    ):
        self.job = world_ or world()
        part = self.job.split(self._checked_size(n))
        self.world: World | None = part
        self.member = part is not None
        self.size = part.size if part is not None else int(n or 0)
        self.rank = part.rank if part is not None else None
        self.host = self.job.host
        self.fetch_timeout = fetch_timeout
        self.timeout = timeout
        here = part.local_size if part is not None else self.job.local_size
        self.workers = workers or config.workers(here)
        self.blas_threads = blas_threads or config.blas_threads()
        self.pool = BufferPool()
        self.infos = self._infos()
        self.hosts = [info["host"] for info in self.infos]
        # scipy's BLAS (a library apart from numpy's) loaded now, before any run holds
        # BLAS to one thread per worker: the hold covers only the libraries loaded when
        # it is set, and a task that imported scipy.linalg first ran it on every core
        # in every worker. Not inside a run: the import takes ~0.2 s of CPU
        import scipy.linalg  # noqa: F401

    def _checked_size(self, n: int | None) -> int:
        job = self.job.size
        if n is None:
            return job
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"Cluster(n={n!r}): n is a number of ranks, at least 1")
        if n > job:
            raise ValueError(
                f"Cluster(n={n}) inside an MPI job of {job} rank(s): start the job with at "
                f"least {n} ranks (mpiexec -n {n}, taskgraph run -n {n}, srun --ntasks={n})"
            )
        if n < job and self.job.rank == 0:
            print(
                f"taskgraph: Cluster(n={n}) inside an MPI job of {job} ranks: it runs on "
                f"ranks 0..{n - 1}; ranks {n}..{job - 1} take part in none of its runs",
                file=sys.stderr,
            )
        return n

    def _infos(self) -> list[dict]:
        """What an engine cluster's ``infos`` says, for each rank (members only)."""
        if self.world is None:
            return []
        import os

        mine = {
            "rank": self.rank,
            "size": self.size,
            "host": self.host,
            "pid": os.getpid(),
            "workers": self.workers,
            "single_copy": self.world.single_copy,
        }
        return self.world.allgather(mine)

    def __repr__(self) -> str:
        if not self.member:
            return (
                f"<Cluster of ranks 0..{self.size - 1} of a job of {self.job.size}; rank "
                f"{self.job.rank} is not one of them>"
            )
        return (
            f"<Cluster rank {self.rank} of {self.size}, {self.workers} workers per rank, "
            f"{self.blas_threads} BLAS thread(s) per worker>"
        )

    def run(
        self,
        graph: Graph,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        plan: Plan | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
    ) -> Run | IdleRun:
        """Plan ``graph`` and start running it; returns a :class:`Run` at once.

        A run made while an earlier one is still going waits for it (its state says
        "queued"). ``task_timeout``: seconds any task may run, unless the task has a
        ``timeout`` of its own. On a rank outside this cluster: an :class:`IdleRun`.
        """
        if not self.member:
            return IdleRun(self, graph, plan)
        if self.world is None:
            raise RunError("the cluster is closed")
        return Run(
            self,
            graph,
            workers or self.workers,
            blas_threads or self.blas_threads,
            plan,
            trace,
            task_timeout,
        )

    def compile(self, dtypes=("float64", "float32")) -> float:
        """Compile the built-in kernels on every rank now; the slowest rank's seconds.
        Collective over the cluster's ranks (0.0 at once on the others)."""
        if self.world is None:
            return 0.0
        from taskgraph.kernels import compile_all

        return float(max(self.world.allgather(compile_all(dtypes)["total"])))

    def restart(self) -> JobCluster:
        """Nothing to do in batch: a job's ranks cannot be replaced (a rank that dies
        ends the job). Returns the cluster unchanged, so a notebook's call runs."""
        return self

    def alive(self) -> bool:
        """True: in batch a rank that dies ends the whole job."""
        return True

    def barrier(self) -> None:
        """Wait for every rank of the cluster (at once on ranks outside it)."""
        if self.world is not None:
            self.world.barrier()

    def close(self) -> None:
        """Free the communicators of a cluster of part of the job (collective over its
        ranks, after its runs end); nothing for the whole job's."""
        part = self.world
        if part is None or part is self.job:
            return
        self.world = None
        last = _last_run
        if last is not None:
            last.join()
        for comm in (part.values, part.comm):
            if comm is not None:
                comm.Free()

    def gather_tiles(self, matrix, out, root) -> None:
        if self.world is None:
            raise RunError(
                f"matrix {matrix.name} lives on ranks 0..{self.size - 1}; rank "
                f"{self.job.rank} is not one of them (or the cluster is closed)"
            )
        self.world.gather_tiles(matrix, out, root)


_current: JobCluster | None = None


def current_cluster() -> JobCluster:
    """The cluster new matrices and runs use by default: this job's ranks."""
    global _current
    if _current is None:
        _current = JobCluster()
    return _current
