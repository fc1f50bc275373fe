"""Clusters and runs: where graphs execute, and the handle a run returns.

In a batch job (``mpiexec -n 4 python script.py``, or ``taskgraph run -n 4``) every
rank runs the same script, and ``tg.Cluster()`` means the ranks of that job: each
rank plans the graph for itself (plans are deterministic, so all agree) and runs its
own share. Without an MPI launcher, ``tg.Cluster()`` is one rank and mpi4py is never
imported.

``cluster.run(graph)`` checks and plans the graph at once (a malformed graph raises
here), then executes it in a background thread and returns a :class:`Run`:
``wait()`` blocks and raises if the run failed on any rank, ``done()`` polls,
``cancel()`` stops it on every rank.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from . import config
from .comm import World, world
from .errors import RunError
from .executor import BufferPool, Executor, Stats, gc_frozen
from .graph import Graph
from .plan import Plan, make_plan
from .trace import Trace

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


class Run:
    """A graph executing on a cluster; returned at once by :meth:`Cluster.run`."""

    def __init__(
        self,
        cluster: JobCluster,
        graph: Graph,
        workers: int,
        blas_threads: int,
        plan: Plan | None = None,
        trace: bool = True,
    ):
        self.cluster = cluster
        self.tracing = trace
        self.graph = graph
        self.workers = workers
        self.blas_threads = blas_threads
        self.plan = plan if plan is not None else make_plan(graph, cluster.size)
        self.rank_plan = self.plan.for_rank(cluster.rank)
        graph.results.clear()
        graph.result_ranks.update(
            (t.id, self.plan.placement[t.id]) for t in graph.tasks if not hasattr(t.fn, "modes")
        )
        self.compile_seconds = 0.0
        self.seconds = 0.0
        self.stats = Stats()
        self._error: BaseException | None = None
        self._executor: Executor | None = None
        self._started = threading.Event()
        self._finished = threading.Event()  # waited on, not join(): see join()
        self._cursor = (0, 0)
        self._trace: Trace | None = None
        self._thread = threading.Thread(target=self._main, name="taskgraph-run", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        from threadpoolctl import threadpool_limits

        try:
            self.compile_seconds = compile_kernels(self.graph)
            # (scipy's BLAS is loaded already, by JobCluster: the limit covers only the
            # libraries loaded when it is set)
            with threadpool_limits(limits=self.blas_threads, user_api="blas"), gc_frozen():
                ex = Executor(
                    self.graph,
                    self.rank_plan,
                    self.cluster.world.network(),
                    self.workers,
                    self.cluster.pool,
                    self.tracing,
                )
                self._executor = ex
                self._started.set()
                t0 = time.perf_counter()
                try:
                    ex.run()
                finally:
                    self.seconds = time.perf_counter() - t0
                    self.stats = ex.stats
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc
        finally:
            self._started.set()
            self._finished.set()

    def done(self) -> bool:
        return self._finished.is_set()

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
            self._trace = trace
        return self._trace

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
        """Block until the run ends; raise its error if it failed on any rank."""
        try:
            self.join(timeout)
        except KeyboardInterrupt:
            self.cancel("interrupted (KeyboardInterrupt)")
            self.join()
            raise
        if not self.done():
            raise TimeoutError(f"run of {self.graph.name!r} still going after {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop the run on every rank; ``wait()`` then raises."""
        self._started.wait()
        if self._executor is not None:
            self._executor.cancel(reason)

    def result(self, future=None):
        """Wait, then return a future's value (the graph's only sink if none is given)."""
        self.wait()
        if future is None:
            sinks = self.rank_plan.results
            if len(sinks) != 1:
                raise RunError(f"the graph has {len(sinks)} results: name the future you want")
            return self.graph.result(sinks[0])
        return future.result()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<Run {self.graph.name!r} on {self.cluster.size} ranks: {state}>"


class Cluster:
    """Where graphs run.

    ``Cluster()`` is the ranks of this MPI job (one rank without MPI); ``Cluster(n=4)``
    in a notebook starts a local ipyparallel controller and 4 engines under mpiexec,
    one per rank (inside an MPI job it is the job's own ranks, so a notebook's code
    runs unchanged in batch); ``Cluster.attach(...)`` connects to engines started
    elsewhere (a SLURM job, ``ipcluster start --engines=mpi``).
    """

    rank: int | None
    size: int

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
    ):
        """Plan ``graph`` and start running it; returns a run handle at once.

        ``trace=False`` records no events (tracing is on by default: it is cheap).
        """
        raise NotImplementedError

    def gather_tiles(self, matrix, out, root) -> None:
        raise NotImplementedError


class JobCluster(Cluster):
    """The ranks of this MPI job (or a single rank without MPI)."""

    rank: int

    def __init__(
        self,
        n: int | None = None,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        world_: World | None = None,
    ):
        self.world = world_ or world()
        if n is not None and n != self.world.size and self.world.rank == 0:
            print(
                f"taskgraph: Cluster(n={n}) inside an MPI job of {self.world.size} ranks: "
                "using the job's ranks",
                file=sys.stderr,
            )
        self.rank = self.world.rank
        self.size = self.world.size
        self.host = self.world.host
        self.workers = workers or config.workers(self.world.local_size)
        self.blas_threads = blas_threads or config.blas_threads()
        self.pool = BufferPool()
        # scipy's BLAS (a library apart from numpy's) loaded now, before any run holds
        # BLAS to one thread per worker: the hold covers only the libraries loaded when
        # it is set, and a task that imported scipy.linalg first ran it on every core
        # in every worker. Not inside a run: the import takes ~0.2 s of CPU
        import scipy.linalg  # noqa: F401

    def __repr__(self) -> str:
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
    ) -> Run:
        """Plan ``graph`` and start running it; returns a :class:`Run` at once."""
        return Run(
            self, graph, workers or self.workers, blas_threads or self.blas_threads, plan, trace
        )

    def barrier(self) -> None:
        self.world.barrier()

    def gather_tiles(self, matrix, out, root) -> None:
        self.world.gather_tiles(matrix, out, root)


_current: JobCluster | None = None


def current_cluster() -> JobCluster:
    """The cluster new matrices and runs use by default: this job's ranks."""
    global _current
    if _current is None:
        _current = JobCluster()
    return _current
