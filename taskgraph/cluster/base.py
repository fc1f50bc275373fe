"""The public ``tg.Cluster``: the interface every kind of cluster has, and the factory
that picks one (the job's ranks in batch, ipyparallel engines in a notebook).

The kinds register themselves by subclassing (``class JobCluster(Cluster, kind="job")``),
so this module imports neither (see :mod:`taskgraph.cluster.job` and
:mod:`taskgraph.cluster.engines`).
"""

from __future__ import annotations

import inspect
from typing import Any

from ..core import config
from ..dsl.graph import Graph
from ..plan.planner import Plan


def _signature(
    n: int | None = None,
    *,
    workers: int | None = None,
    blas_threads: int | None = None,
    timeout: float = 120,
    cores: int | None = None,
    memory: int | str | None = None,
    gpus: int | None = None,
) -> None:
    """The parameters every kind of cluster takes (shown by ``tg.Cluster?``)."""


class Cluster:
    """Where graphs run: ``tg.Cluster(n=4)``.

    In a notebook (no MPI launcher), ``Cluster(n)`` starts a local ipyparallel
    controller and ``n`` engines under mpiexec, one per MPI rank
    (:class:`~taskgraph.cluster.engines.EngineCluster`). In a batch job (``mpiexec``,
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
    cores, memory, gpus : what each rank hands out to tasks at once (``@tg.task(cores=
        ...)``; default: its workers, its share of the node's available memory, its
        GPUs; see :mod:`taskgraph.run.resources`).

    Use it as a context manager, or call :meth:`close`, to stop what it started.
    """

    rank: int | None
    size: int
    __signature__: Any = inspect.signature(_signature).replace(
        return_annotation=inspect.Signature.empty
    )

    # the kinds ``Cluster(...)`` picks from, registered by their subclasses (``kind=``)
    _kinds: dict[str, type[Cluster]] = {}

    def __init_subclass__(cls, kind: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if kind is not None:
            Cluster._kinds[kind] = cls

    def __new__(cls, n: int | None = None, **kwargs):
        if cls is Cluster:
            cls = Cluster._kinds["job" if n is None or config.use_mpi() else "engines"]
        return super().__new__(cls)

    @classmethod
    def attach(
        cls,
        cluster_id: str | None = None,
        *,
        profile: str | None = None,
        connection_file: str | None = None,
        n: int | None = None,
        timeout: float = 30,
        workers: int | None = None,
        blas_threads: int | None = None,
    ) -> Cluster:
        """Connect to ipyparallel engines started elsewhere (a SLURM job,
        ``ipcluster start --engines=mpi``), one per MPI rank.

        Parameters
        ----------
        cluster_id : the ipyparallel cluster's id (ipyparallel's default if None).
        profile : the IPython profile it runs in (the default if None).
        connection_file : a client JSON file (``ipcontroller-client.json``); if given,
            ``cluster_id`` and ``profile`` are not used.
        n : wait for this many engines (None: those registered now).
        timeout : seconds to wait for the connection and the engines.
        workers : worker threads per engine (default: the engine's cores).
        blas_threads : BLAS threads per worker (default 1).

        Raises RunError if there is nothing to attach to, or the engines are not one
        MPI world. See :meth:`taskgraph.cluster.engines.EngineCluster.attach`.
        """
        return Cluster._kinds["engines"].attach(
            cluster_id,
            profile=profile,
            connection_file=connection_file,
            n=n,
            timeout=timeout,
            workers=workers,
            blas_threads=blas_threads,
        )

    def __enter__(self) -> Cluster:
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
        open: bool = False,
        retries: int | None = None,
        on_failure: str | None = None,
        checkpoint: str | None = None,
        launch_rate: float | None = None,
        max_launching: int | None = None,
    ):
        """Plan ``graph`` and start running it; returns a run handle at once.

        ``workers``, ``blas_threads``: per rank (default: the cluster's); ``plan``: a
        plan made already; ``trace=False`` records no events (tracing is on by default:
        it is cheap); ``task_timeout``: seconds any task may run (a task's own
        ``timeout`` wins). ``open``: the run takes ``run.submit`` calls; ``retries``,
        ``on_failure``: the failure policy of tasks that leave theirs at the default;
        ``checkpoint``: a directory of finished values, so a run made again skips what is
        done; ``launch_rate``, ``max_launching``: a launch throttle. Returns a
        :class:`~taskgraph.cluster.handle.RunHandle`.
        """
        raise NotImplementedError

    def cholesky_tile(self, n: int, dtype="float64"):
        """The tile size for a tiled Cholesky of order ``n`` in ``dtype`` on this
        cluster's ranks x workers, from the kernel speeds measured on its first rank's
        node (cached there: :mod:`taskgraph.calibrate`): a
        :class:`~taskgraph.plan.tilesize.Choice` (``.tile``, ``.why()``), the same on
        every rank. What ``tile="auto"`` of a :class:`~taskgraph.TiledMatrix` uses."""
        raise NotImplementedError

    def gather_tiles(self, matrix, out, root) -> None:
        """Copy every tile of ``matrix`` into the array ``out`` (on rank ``root`` in
        batch; in the notebook's process for engines). Called by
        :meth:`taskgraph.dsl.tiled.TiledMatrix.gather`; collective in batch."""
        raise NotImplementedError
