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
``cancel()`` stops it on every rank. Several runs may be in flight at once, each on
communicators of its own, made in the order the runs are made (the same on every
rank); one that fails or is cancelled leaves the others running. A run waits
("queued") only for an earlier run still going that writes data it uses, or uses data
it writes (:mod:`taskgraph.cluster.overlap`)::

    run(g1)              ─► Run #1  running ──────────────► done
    run(g2)              ─► Run #2  running ─────► done          (other data: at once)
    run(g3: reads g1's)  ─► Run #3  queued ···············► running ──► done

Before a run starts, every rank checks that all ranks built the same graph (a
fingerprint, :mod:`taskgraph.dsl.fingerprint`): a graph built in another order or with
other arguments on some rank fails on every rank, naming the first task that differs.

Values of ``@tg.task`` calls stay on the rank that computed them; only the values of
tasks that no other task reads (sinks) reach every rank at the end of the run. In
batch, ``future.result()`` on any other value is collective: every rank calls it
(SPMD), the rank that holds the value sends it to the others
(:func:`taskgraph.run.comm.share_value`), and a rank that never calls makes the others fail
after ``fetch_timeout`` seconds with an error naming the task and the ranks, instead of
hanging.
"""

from __future__ import annotations

import sys
import threading

from ..calibrate import on_this_node
from ..core import config
from ..core.errors import RunError
from ..dsl.graph import Graph
from ..dsl.options import checked_sizes, parse_memory, whole
from ..dsl.tiled import use_clusters
from ..plan.planner import Plan
from ..run import procpool
from ..run.comm import World, world
from ..run.executor import BufferPool
from ..run.resources import set_limits
from .base import Cluster
from .jobrun import IdleRun, Run, compile_kernels, runs_in_flight
from .submit import run_request

FETCH_TIMEOUT = 120.0  # seconds a rank waits for another's value in future.result()


class JobCluster(Cluster, kind="job"):
    """The ranks of this MPI job (or a single rank without MPI).

    ``n``: None (or the job's size) for every rank of the job; fewer for the job's
    first ``n`` ranks, on a communicator of their own. Every rank of the job must make
    the cluster (collective). The other ranks get a cluster whose ``member`` is False:
    they take part in no run of it; its ``run()`` returns a handle that is done at
    once (:class:`IdleRun`), and its values are not theirs to read. More ranks than
    the job has raise ValueError.

    ``workers``, ``blas_threads``: as :class:`Cluster`; ``timeout`` is accepted for a
    notebook's code and means nothing here; ``fetch_timeout``: seconds a rank waits
    for another rank's value in ``future.result()``; ``world_``: the ranks to use
    instead of this job's (tests pass their own); ``cores``, ``memory``, ``gpus``:
    what each rank hands out to tasks at once (default: its workers, its share of
    the node's available memory and GPUs; see :mod:`taskgraph.run.resources`).
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
        cores: int | None = None,
        memory: int | str | None = None,
        gpus: int | None = None,
    ):
        checked_sizes(
            "Cluster", workers, blas_threads, timeout=timeout, fetch_timeout=fetch_timeout
        )
        mem = None if memory is None else parse_memory(memory, "Cluster(memory=...)")
        set_limits(cores, mem, gpus)  # (each rank's capacity: taskgraph.run.resources)
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
        self.pool = BufferPool()  # the first run's receive buffers (kept for the next)
        self._spare_pools = [self.pool]  # pools no run in flight uses
        self._pools_lock = threading.Lock()
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
        if not whole(n, 1):
            raise ValueError(f"Cluster(n={n!r}): n is a number of ranks, at least 1")
        n = int(n)
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
        graph: Graph | None = None,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        plan: Plan | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
        open: bool = False,
        retries: int | None = None,
        on_failure: str | None = None,
        checkpoint: str | None = None,
        launch_rate: float | None = None,
        max_launching: int | None = None,
    ) -> Run | IdleRun:
        """Plan ``graph`` and start running it; returns a :class:`Run` at once.

        Runs in flight at once run together; one made while an earlier run still going
        writes data it uses (or uses data it writes) waits for that run (its state says
        "queued"). Make runs from one thread, in the same order on every rank (SPMD).
        ``workers``, ``blas_threads``: per rank, for this run (default:
        the cluster's); ``plan``: a plan made before (default: made now, on every
        rank); ``trace``: record events (on by default: it is cheap); ``task_timeout``:
        seconds any task may run, unless the task has a ``timeout`` of its own. On a
        rank outside this cluster: an :class:`IdleRun`. ``open``: the run takes
        ``run.submit(fn, *args)`` calls until ``run.close()`` or ``run.wait()``
        (:mod:`taskgraph.cluster.submit`); ``graph`` may then be left out (a run of
        submitted calls only). A submitted call's value is on the rank that submitted it.
        ``retries``, ``on_failure``: the failure policy of every task that leaves its own
        at the default (see :func:`taskgraph.task`); ``checkpoint``: a directory where
        each finished call's value is kept, so that the same run made again skips what
        is done; ``launch_rate``: at most this many task starts a second over the run;
        ``max_launching``: at most this many tasks starting at once on a rank.
        """
        graph, options = run_request(
            graph,
            open,
            sizes={"workers": workers, "blas_threads": blas_threads, "task_timeout": task_timeout},
            retries=retries,
            on_failure=on_failure,
            checkpoint=checkpoint,
            launch_rate=launch_rate,
            max_launching=max_launching,
        )
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
            open,
            options,
        )

    def compile(self, dtypes=("float64", "float32")) -> float:
        """Compile the built-in kernels for ``dtypes`` on every rank now; the slowest
        rank's seconds. Collective over the cluster's ranks (0.0 at once on the others)."""
        if self.world is None:
            return 0.0
        from taskgraph.kernels import compile_all

        return float(max(self.world.allgather(compile_all(dtypes)["total"])))

    def cholesky_tile(self, n: int, dtype="float64"):
        """See :meth:`Cluster.cholesky_tile` (order ``n``, ``dtype``). Collective over the
        cluster's ranks: rank 0 measures while the others wait asleep, and every rank gets
        its answer."""
        threads = self.size * self.workers
        if self.world is None:  # not one of the cluster's ranks: nothing to agree with
            return on_this_node(n, threads, dtype)
        choice = on_this_node(n, threads, dtype) if self.rank == 0 else None
        self.barrier()
        return self.world.bcast(choice)

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
        ranks, after its runs end; the whole job's stay), then end this rank's process
        pool (``process=True`` calls) unless a run still going uses it."""
        part = self.world
        if part is not None and part is not self.job:
            self.world = None
            for run in runs_in_flight():
                if run.cluster is self:
                    run.join()
            for comm in (part.values, part.comm):
                if comm is not None:
                    comm.Free()
        if not runs_in_flight():  # (a later process call starts a new pool)
            procpool.shutdown()

    def take_pool(self) -> BufferPool:
        """Receive buffers for a run: a pool no run in flight uses (a new one if every
        pool is in use: a pool is one run's at a time)."""
        with self._pools_lock:
            spare = self._spare_pools
            if self.pool in spare:  # (the cluster's own first: its buffers are kept)
                spare.remove(self.pool)
                return self.pool
            return spare.pop() if spare else BufferPool()

    def give_pool(self, pool: BufferPool) -> None:
        """A run ended: its pool serves the next."""
        with self._pools_lock:
            self._spare_pools.append(pool)

    def gather_tiles(self, matrix, out, root) -> None:
        """Copy every tile of ``matrix`` into ``out`` on rank ``root`` (collective over
        the cluster's ranks); RunError on a rank outside the cluster."""
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


# matrices made without a cluster live on this one (the dsl layer cannot import it)
use_clusters(Cluster, current_cluster)

__all__ = ["IdleRun", "JobCluster", "Run", "compile_kernels", "current_cluster"]
