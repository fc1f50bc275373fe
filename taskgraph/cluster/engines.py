"""The notebook side: ipyparallel engines, one per MPI rank.

::

    notebook (client)                      engines 0..n-1 = MPI ranks 0..n-1
    ─────────────────                      ──────────────────────────────────
    EngineCluster(n)  ── start ──────────► controller on 127.0.0.1, mpiexec -n n engines
                      ── whoami(token) ──► rank, world size, the token rank 0 broadcast
    TiledMatrix(...)  ── build_matrix ───► each rank makes its own tiles
    cluster.run(g)    ── run_graph ──────► plan + graph in one message; each rank runs
                      ◄─ data batches ──── progress and events, every 0.25 s
    run.wait()        ◄─ summaries ─────── errors come back as TaskError / RunError
    run.cancel()      ── SIGINT ─────────► KeyboardInterrupt, the run stops everywhere
    A.gather()        ◄─ tiles ─────────── assembled into one array in the notebook

The notebook plans the graph itself (a malformed graph fails in the notebook) and
sends the plan to every engine in one message. Engine ids are mapped to
``COMM_WORLD`` ranks when the cluster connects, and checked: every engine must be in
one MPI world of exactly n ranks. An engine that dies ends ``wait()`` with a clear
error within seconds; ``restart()`` gives a fresh set of engines.

A cluster started here cleans up after itself. Engines that die at start are reported
as soon as their ``mpiexec`` exits, with the tail of their log. ``close()`` ends the
engines in order (MPI finalized, so MPICH's ``/dev/shm`` segment goes), then the
controller, then removes what is left (its connection files, any segment our engines
had mapped). A watchdog process (:mod:`taskgraph.cluster.watchdog`) does the same if the client
dies without closing (SIGKILL included); SIGTERM and SIGHUP close the clusters first,
then end the process as they would have.

Several runs in flight: the engines start a run and take the next request at once, so
a second ``run()`` while one is going runs beside it, on communicators of its own (each
engine makes them in the order the runs arrive, the same on every engine); a failure or
``cancel()`` of one leaves the other going. A run waits ("queued") only for an earlier
run still going that writes data it uses, or uses data it writes.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid
import weakref
from collections import deque
from pathlib import Path

import numpy as np

from ..core import config, pickling
from ..core.errors import RunError
from ..dsl.graph import Graph
from ..dsl.options import checked_sizes, parse_memory, whole
from ..plan.planner import Plan
from ..run.singlecopy import single_copy_env
from . import engine_side, watchdog
from .base import Cluster
from .engine_run import EngineRun
from .launch import launcher_flavour, local_env
from .submit import run_request

_remote_uids = itertools.count(1)
_live: weakref.WeakSet[EngineCluster] = weakref.WeakSet()  # clusters started here, open
LOG_TAIL = 30  # lines of the engines' log quoted when they die at start
STOP_TIMEOUT = 5.0  # seconds an orderly engine shutdown may take before they are killed
_NOT_BY_NAME = {e.__name__ for e in pickling.NOT_BY_NAME}  # (as an engine's error names them)


class EngineCluster(Cluster, kind="engines"):
    """ipyparallel engines under mpiexec, driven from a notebook.

    ``n``, ``workers``, ``blas_threads``, ``timeout``: as :class:`Cluster`; ``cores``,
    ``memory`` (bytes, or ``"2GB"``), ``gpus``: what each engine hands out to tasks at
    once (default: its workers, its share of the node's available memory and GPUs; see
    :mod:`taskgraph.run.resources`), as a job's ``Cluster(cores=...)``. A bad one raises
    (ValueError; GraphError for memory) before anything starts.
    """

    remote = True
    rank = None

    def __init__(
        self,
        n: int | None = None,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        timeout: float = 120,
        cores: int | None = None,
        memory: int | str | None = None,
        gpus: int | None = None,
        _client=None,
        _ipp_cluster=None,
    ):
        checked_sizes("Cluster", workers, blas_threads, timeout=timeout)
        self.limits = _checked_limits(cores, memory, gpus)
        self.workers = workers
        self.blas_threads = blas_threads
        self.timeout = timeout
        self._ipp = _ipp_cluster
        self._owns = _client is None
        # matrices freed here, for the engines to drop with the next run's message
        self._forgotten: deque[int] = deque()
        self._guard: watchdog.Guard | None = None  # the watchdog of a cluster started here
        self._marker: str | None = None  # in the environment of its every process
        self._runs: list[EngineRun] = []  # the runs made here, not seen ended yet
        self._stuck: str | None = None  # an engine stuck in a task: what it is stuck in
        self.start_seconds = 0.0
        if _client is None:
            if not whole(n, 1):
                raise ValueError(f"Cluster(n={n!r}) needs a whole number, at least one engine")
            self._start(int(n))
        else:
            self._connect(_client, n)

    # -- starting and connecting -----------------------------------------------------

    def _start(self, n: int) -> None:
        import ipyparallel as ipp
        from traitlets.config import Config

        exe = config.mpiexec()
        flavour = launcher_flavour(exe)
        self._marker = uuid.uuid4().hex
        mark = {watchdog.MARK: self._marker}
        cfg = Config()
        cfg.MPILauncher.mpi_cmd = [exe]
        # engines start MPI before taskgraph is imported: single copy and shared
        # memory only (no rank listening on the machine's address) come from here
        cfg.MPIEngineSetLauncher.environment = {
            **single_copy_env(),
            **local_env(flavour, os.environ),
            **mark,
        }
        cfg.LocalControllerLauncher.environment = mark
        if flavour == "openmpi":
            cfg.MPILauncher.mpi_args = ["--oversubscribe", "--allow-run-as-root"]
        t0 = time.perf_counter()
        guard = watchdog.Guard()  # before anything starts: a kill now is covered too
        self._guard = guard
        self._ipp = ipp.Cluster(
            n=n,
            engines="mpi",
            controller_ip="127.0.0.1",
            # the hub warns of every data_message (our progress batches) it does not store
            controller_args=["--log-level=ERROR"],
            config=cfg,
            engine_timeout=self.timeout,
            log_level=40,
        )
        guard.watch(self._marker, self._leftover_files())
        try:
            # not start_and_connect: its wait draws ipyparallel's own progress bar in the
            # notebook; _connect waits for the engines quietly
            self._ipp.start_cluster_sync()
            guard.watch(self._marker, self._leftover_files())
            client = self._ipp.connect_client_sync()
            self._connect(client, n)
            # (and what the engines map and their proxies hold: a signal to the whole
            # process group, a notebook server's stop, kills those before they clean up)
            shm = [f for info in getattr(self, "infos", []) for f in info.get("shm", ())]
            guard.watch(self._marker, self._leftover_files() + shm)
        except BaseException:
            self._stop_started(kill_first=True)
            raise
        _live.add(self)
        _install_signal_handlers()
        self.start_seconds = time.perf_counter() - t0

    def _leftover_files(self) -> list[str]:
        """What a cluster started here leaves on disk when it is killed: its connection
        and cluster files, the controller's engine list, the launchers' logs."""
        ipp = self._ipp
        if ipp is None:
            return []
        profile = Path(ipp.profile_dir)
        files = [
            ipp.cluster_file,
            str(profile / "security" / f"ipcontroller-{ipp.cluster_id}-client.json"),
            str(profile / "security" / f"ipcontroller-{ipp.cluster_id}-engine.json"),
            str(profile / "log" / f"engines{ipp.cluster_id}.json"),
        ]
        launchers = [ipp.controller, *ipp.engines.values()]
        return files + [ln.output_file for ln in launchers if ln is not None]

    def _engines_exited(self) -> str | None:
        """The tail of the engines' log if their mpiexec has exited (None if it runs)."""
        import psutil

        for es in self._ipp.engines.values() if self._ipp is not None else ():
            proc = getattr(es, "process", None)
            try:
                running = proc is not None and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                running = False
            if not running:
                return _tail(es.output_file)
        return None

    def _connect(self, client, n: int | None) -> None:
        self.client = client
        if n is not None:
            self._await_engines(client, n)
        ids = sorted(client.ids)
        if not ids:
            raise RunError("the cluster has no engines")
        token = uuid.uuid4().hex
        infos = client[ids].apply_sync(engine_side.whoami, token)
        check_one_world(ids, infos, token)
        client[ids].apply_sync(engine_side.set_limits, *self.limits)
        by_rank = sorted(zip(ids, infos), key=lambda pair: pair[1]["rank"])
        self.engine_ids = [e for e, _ in by_rank]
        self.infos = [info for _, info in by_rank]
        self.size = len(ids)
        self.view = client[self.engine_ids]
        self.view.block = False
        self.hosts = [info["host"] for info in self.infos]
        self.generation = getattr(self, "generation", 0) + 1
        self._runs = []
        self._stuck = None

    def _await_engines(self, client, n: int) -> None:
        """Wait for n engines; fail at once, with their log, if their mpiexec exits."""
        deadline = time.monotonic() + self.timeout
        while len(client.ids) < n:
            log = self._engines_exited() if self._owns else None
            if log is not None:
                raise RunError(
                    f"the engines exited before {n - len(client.ids)} of {n} registered; "
                    f"the end of their log:\n{log}"
                )
            if time.monotonic() > deadline:
                raise RunError(
                    f"only {len(client.ids)} of {n} engines registered within {self.timeout} s"
                )
            time.sleep(0.1)

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
    ) -> EngineCluster:
        """Connect to engines someone else started.

        ``connection_file``: a client JSON file (``ipcontroller-client.json``);
        otherwise the cluster with ``cluster_id`` in ``profile`` (ipyparallel's
        defaults when omitted). ``n``: wait for this many engines; ``timeout``: seconds
        to wait for them; ``workers``, ``blas_threads``: as :class:`Cluster`.
        """
        import ipyparallel as ipp

        try:
            if connection_file is not None:
                client = ipp.Client(connection_file, timeout=timeout)
                ipp_cluster = None
            else:
                ipp_cluster = ipp.Cluster.from_file(profile=profile, cluster_id=cluster_id or "")
                client = ipp_cluster.connect_client_sync()
        except (OSError, TimeoutError) as exc:
            where = connection_file or f"cluster {cluster_id or '(default)'!r}" + (
                f" of profile {profile!r}" if profile else ""
            )
            raise RunError(f"cannot attach to {where}: {exc}") from exc
        return cls(
            n,
            workers=workers,
            blas_threads=blas_threads,
            timeout=timeout,
            _client=client,
            _ipp_cluster=ipp_cluster,
        )

    def __repr__(self) -> str:
        hosts = sorted(set(getattr(self, "hosts", [])))
        return f"<Cluster of {self.size} engines (MPI ranks) on {', '.join(hosts) or '?'}>"

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect; stop the controller and engines if this cluster started them.

        Engines started here end in order (MPI finalized, shared memory freed), then
        the controller; leftovers are removed. A run still going is cancelled first. The
        runs' handles still answer after: a run cut off fails (RunError), and a value not
        fetched before is gone with the engines (RunError)."""
        _live.discard(self)
        client = getattr(self, "client", None)
        if client is not None and self._owns:
            self._shutdown_engines()
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self.client = None
        if self._owns:
            self._stop_started()

    def _shutdown_engines(self) -> None:
        """Cancel what runs, then finalize MPI on every engine and let them exit. Engines
        that do not answer within ``STOP_TIMEOUT`` are left to be killed."""
        going = [r for r in self._runs if not r.done()]
        try:
            for run in going:
                run.cancel("the cluster was closed")
            deadline = time.monotonic() + STOP_TIMEOUT
            while any(not r.done() for r in going) and time.monotonic() < deadline:
                time.sleep(0.05)
            if any(not r.done() for r in going):
                return
            if self._stuck is not None or not self.alive():
                return
            ar = self.view.apply_async(engine_side.shutdown)
            ar.wait(STOP_TIMEOUT)
            deadline = time.monotonic() + STOP_TIMEOUT
            while ar.ready() and self._engines_exited() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 - what is left is killed by _stop_started
            pass

    def _stop_started(self, kill_first: bool = False) -> None:
        """Stop what _start started, then remove every process and file left of it.
        ``kill_first`` (a start that failed or was interrupted): signal the processes
        before ipyparallel's stop, which waits seconds for engines still starting."""
        shm = [f for info in getattr(self, "infos", []) for f in info.get("shm", ())]
        files = self._leftover_files()
        if kill_first and self._marker is not None:
            watchdog.stop(self._marker, files, shm)
        if self._ipp is not None:
            try:
                self._ipp.stop_cluster_sync()
            except Exception:  # noqa: BLE001 - stop everything we can
                pass
        if self._marker is not None:
            watchdog.stop(self._marker, files, shm)
        if self._guard is not None:
            self._guard.release()
            self._guard = None

    def restart(self) -> EngineCluster:
        """Fresh engines (all of them: one MPI world). Matrices must be made again."""
        if not self._owns or self._ipp is None:
            raise RunError("only a cluster started here (Cluster(n=...)) can be restarted")
        n = len(self.engine_ids)
        self.close()
        self.generation += 1
        self._start(n)
        return self

    def alive(self) -> bool:
        """Whether every engine of this cluster is still registered."""
        client = getattr(self, "client", None)
        return client is not None and set(self.engine_ids) <= set(client.ids)

    # -- data ------------------------------------------------------------------------

    def new_uid(self) -> int:
        """A fresh id for a matrix made from here (negative: no rank's own ids)."""
        return -next(_remote_uids)

    def build_matrix(self, matrix, fill) -> None:
        """Make ``matrix``'s tiles on the engines that own them, filled by
        ``fill(i, j, shape)`` (as made if None); they are dropped when ``matrix`` is freed."""
        self._engines_here()
        payload = pickling.dumps(fill) if fill is not None else None
        self._wait(self.view.apply_async(engine_side.build_matrix, matrix.spec(), payload))
        matrix.generation = self.generation
        weakref.finalize(matrix, _forget, weakref.ref(self), matrix.uid)

    def scatter_matrix(self, matrix, array: np.ndarray) -> None:
        """Send each engine only the tiles its rank owns."""
        self._engines_here()
        per_rank: list[dict] = [{} for _ in range(self.size)]
        for i, j in matrix.indices():
            per_rank[matrix.owner(i, j)][i, j] = np.asfortranarray(matrix.block(array, i, j))
        results = [
            self.client[e].apply_async(engine_side.put_tiles, matrix.uid, tiles)
            for e, tiles in zip(self.engine_ids, per_rank)
        ]
        for ar in results:
            self._wait(ar)

    def gather_tiles(self, matrix, out, root) -> None:
        """Copy every tile of ``matrix`` from its engine into ``out`` here (``root`` is
        not used: the notebook's process gathers)."""
        self._check_current(matrix)
        self._engines_here()
        for part in self._wait(self.view.apply_async(engine_side.get_tiles, matrix.uid)):
            for (i, j), arr in part.items():
                matrix.block(out, i, j)[...] = arr

    def _check_current(self, matrix) -> None:
        if getattr(matrix, "generation", self.generation) != self.generation:
            raise RunError(
                f"matrix {matrix.name} was made before the cluster restarted; make it again"
            )

    def _wait(self, ar, timeout: float | None = None):
        """The result of an AsyncResult, failing (not hanging) if an engine dies."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ar.ready():
            ar.wait(0.2)
            if not ar.ready() and not self.alive():
                raise RunError(self._dead_message())
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no answer from the engines within {timeout} s")
        return ar.get()

    def _engines_here(self) -> None:
        """RunError, naming what is gone, if the cluster is closed or lost an engine
        (ipyparallel's own error was a bare KeyError of the engine's id: a trial)."""
        if self.client is None:
            raise RunError("the cluster is closed")
        if not self.alive():
            raise RunError(self._dead_message())

    def _dead_message(self) -> str:
        live = set(self.client.ids) if self.client is not None else set()
        dead = [
            f"rank {r} (engine {e}, pid {self.infos[r]['pid']} on {self.infos[r]['host']})"
            for r, e in enumerate(self.engine_ids)
            if e not in live
        ]
        return (
            f"lost {', '.join(dead) or 'the connection to the engines'}: the MPI world is "
            "broken; cluster.restart() starts fresh engines"
        )

    def compile(self, dtypes=("float64", "float32")) -> float:
        """Compile the built-in kernels on every engine now; the slowest engine's seconds."""
        self._engines_here()
        return max(self._wait(self.view.apply_async(engine_side.compile_kernels, dtypes)))

    def cholesky_tile(self, n: int, dtype="float64"):
        """See :meth:`Cluster.cholesky_tile` (order ``n``, ``dtype``): measured on the
        engine of rank 0."""
        self._engines_here()
        first = self.client[self.engine_ids[0]]
        return self._wait(
            first.apply_async(engine_side.cholesky_tile, n, self.workers, str(np.dtype(dtype)))
        )

    def fetch(self, run_id: str, task: int, rank: int):
        """The value of ``task`` of run ``run_id`` from the engine of ``rank``: as
        ipyparallel sends it, else, where its plain pickle failed (a closure inside it),
        by value (cloudpickle) in a second request."""
        self._engines_here()
        engine = self.client[self.engine_ids[rank]]
        try:
            return self._wait(engine.apply_async(engine_side.result, run_id, task))
        except Exception as exc:  # (ipyparallel's RemoteError, named as the engine's error)
            if getattr(exc, "ename", None) not in _NOT_BY_NAME:  # (not the reply's pickling)
                raise
        return self._wait(engine.apply_async(engine_side.result, run_id, task, True))

    # -- runs ------------------------------------------------------------------------

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
    ) -> EngineRun:
        """Plan here, send graph and plan to every engine in one message; returns at once.

        ``workers``, ``blas_threads``: per engine (default: the cluster's); ``plan``: a
        plan made already; ``trace``: record events; ``task_timeout``: seconds a task
        may run unless its function has a ``timeout`` of its own (None: no limit). A
        task past its limit fails the run, naming it; an engine stuck in it (a call into
        C that never returns) is reported by ``wait()`` within the limit plus
        ``STUCK_GRACE`` seconds. A run started while others are going runs beside them;
        only one that overlaps an earlier run still going (writes data it uses, or uses
        data it writes) waits for it (``run.state() == "queued"``). ``open``: the run
        takes ``run.submit(fn, *args)`` calls until ``run.close()`` or ``run.wait()``
        (:mod:`taskgraph.cluster.submit`); ``graph`` may then be left out. ``retries``,
        ``on_failure``, ``checkpoint``, ``launch_rate``, ``max_launching``: as for
        :meth:`taskgraph.cluster.job.JobCluster.run`."""
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
        self._engines_here()
        if self._stuck is not None:
            raise RunError(f"{self._stuck}; cluster.restart() starts fresh engines")
        for m in graph.matrices():
            self._check_current(m)
        run = EngineRun(
            self,
            graph,
            workers or self.workers,
            blas_threads or self.blas_threads,
            plan,
            trace,
            task_timeout,
            earlier=self._runs,
            open=open,
            options=options,
        )
        self._runs = [r for r in self._runs if not r.done()] + [run]
        return run


def _checked_limits(
    cores: int | None, memory: int | str | None, gpus: int | None
) -> tuple[int | None, int | None, int | None]:
    """(cores, memory in bytes, gpus) for the engines; ValueError for a bad one."""
    mem = None if memory is None else parse_memory(memory, "Cluster(memory=...)")
    for name, v in (("cores", cores), ("memory", mem), ("gpus", gpus)):
        least = 1 if name == "cores" else 0
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise ValueError(f"Cluster({name}={v!r}): an int >= {least}, or None")
    return cores, mem, gpus


def _tail(path: str, lines: int = LOG_TAIL) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


_previous_handlers: dict[int, object] = {}


def _install_signal_handlers() -> None:
    """SIGTERM and SIGHUP (a closed SSH session) close this process's clusters first,
    then do what they did before: the default (end the process) or the handler that
    was there. Ignored signals stay ignored; only the main thread can install."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if sig in _previous_handlers:
            continue
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN or current is None:
            continue
        _previous_handlers[sig] = current
        signal.signal(sig, _close_then_resignal)


def _close_then_resignal(signum, frame) -> None:
    for cluster in list(_live):
        try:
            cluster.close()
        except Exception:  # noqa: BLE001 - the watchdog removes what is left
            pass
    previous = _previous_handlers.pop(signum, signal.SIG_DFL)
    signal.signal(signum, previous)  # type: ignore[arg-type]
    if callable(previous):
        previous(signum, frame)
    else:
        os.kill(os.getpid(), signum)


def check_one_world(ids: list[int], infos: list[dict], token: str) -> None:
    """Engines must form one MPI world: sizes n, ranks 0..n-1, rank 0's token everywhere."""
    n = len(ids)
    sizes = sorted({info["size"] for info in infos})
    ranks = sorted(info["rank"] for info in infos)
    if sizes != [n] or ranks != list(range(n)) or any(i["token"] != token for i in infos):
        detail = ", ".join(
            f"engine {e}: rank {i['rank']} of {i['size']}" for e, i in zip(ids, infos)
        )
        raise RunError(
            f"the {n} engines are not one MPI world ({detail}): start them together with "
            "mpiexec, e.g. `ipcluster start --engines=mpi -n N`"
        )


def _forget(cluster_ref, uid: int) -> None:
    """A matrix was freed: its engines drop their tiles with the next run's message.

    Only a note here: this runs whenever the collector frees the matrix, in the middle
    of any code (ipyparallel's own included), and a Ctrl-C that lands inside a finalizer
    is lost (a finalizer's exceptions are only printed), so it must be over in a few
    bytecodes.
    """
    cluster = cluster_ref()
    if cluster is not None:
        cluster._forgotten.append(uid)


__all__ = ["EngineCluster", "EngineRun", "check_one_world"]
