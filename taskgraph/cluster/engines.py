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

One run at a time: engines execute requests in order, so a second ``run()`` while one
is going waits on the engines until the first ends; its handle says ``queued`` until
then (``run.state()``), and ``cancel()`` takes it out of the queue.
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

import cloudpickle
import numpy as np

from ..core import config
from ..core.errors import RemoteTraceback, RunError, TaskError
from ..dsl.graph import Graph
from ..plan.planner import Plan, make_plan
from ..run.comm import single_copy_env
from ..trace.events import Trace
from . import engine_side, watchdog
from .base import Cluster
from .launch import launcher_flavour, local_env

_remote_uids = itertools.count(1)
STUCK_GRACE = 5.0  # seconds past a task's limit before its silent engine is called stuck
_live: weakref.WeakSet[EngineCluster] = weakref.WeakSet()  # clusters started here, open
LOG_TAIL = 30  # lines of the engines' log quoted when they die at start
STOP_TIMEOUT = 5.0  # seconds an orderly engine shutdown may take before they are killed


class EngineCluster(Cluster, kind="engines"):
    """ipyparallel engines under mpiexec, driven from a notebook."""

    remote = True
    rank = None

    def __init__(
        self,
        n: int | None = None,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        timeout: float = 120,
        _client=None,
        _ipp_cluster=None,
    ):
        self.workers = workers
        self.blas_threads = blas_threads
        self.timeout = timeout
        self._ipp = _ipp_cluster
        self._owns = _client is None
        # matrices freed here, for the engines to drop with the next run's message
        self._forgotten: deque[int] = deque()
        self._guard: watchdog.Guard | None = None  # the watchdog of a cluster started here
        self._marker: str | None = None  # in the environment of its every process
        self._last_run: EngineRun | None = None
        self._stuck: str | None = None  # an engine stuck in a task: what it is stuck in
        self.start_seconds = 0.0
        if _client is None:
            if n is None or n < 1:
                raise ValueError(f"Cluster(n=...) needs at least one engine, got n={n}")
            self._start(n)
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
        except BaseException:
            self._stop_started()
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
        by_rank = sorted(zip(ids, infos), key=lambda pair: pair[1]["rank"])
        self.engine_ids = [e for e, _ in by_rank]
        self.infos = [info for _, info in by_rank]
        self.size = len(ids)
        self.view = client[self.engine_ids]
        self.view.block = False
        self.hosts = [info["host"] for info in self.infos]
        self.generation = getattr(self, "generation", 0) + 1
        self._last_run = None
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
        **kwargs,
    ) -> EngineCluster:
        """Connect to engines someone else started.

        ``connection_file``: a client JSON file (``ipcontroller-client.json``);
        otherwise the cluster with ``cluster_id`` in ``profile`` (ipyparallel's
        defaults when omitted). ``n``: wait for this many engines.
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
        return cls(n, timeout=timeout, _client=client, _ipp_cluster=ipp_cluster, **kwargs)

    def __repr__(self) -> str:
        hosts = sorted(set(getattr(self, "hosts", [])))
        return f"<Cluster of {self.size} engines (MPI ranks) on {', '.join(hosts) or '?'}>"

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect; stop the controller and engines if this cluster started them.

        Engines started here end in order (MPI finalized, shared memory freed), then
        the controller; leftovers are removed. A run still going is cancelled first."""
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
        last = self._last_run
        try:
            if last is not None and not last.done():
                last.cancel()
                last.ar.wait(STOP_TIMEOUT)
                if not last.done():
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

    def _stop_started(self) -> None:
        """Stop what _start started, then remove every process and file left of it."""
        shm = [f for info in getattr(self, "infos", []) for f in info.get("shm", ())]
        files = self._leftover_files()
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
        return -next(_remote_uids)

    def build_matrix(self, matrix, fill) -> None:
        payload = cloudpickle.dumps(fill) if fill is not None else None
        self._wait(self.view.apply_async(engine_side.build_matrix, matrix.spec(), payload))
        matrix.generation = self.generation
        weakref.finalize(matrix, _forget, weakref.ref(self), matrix.uid)

    def scatter_matrix(self, matrix, array: np.ndarray) -> None:
        """Send each engine only the tiles its rank owns."""
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
        self._check_current(matrix)
        t = matrix.tile
        for part in self._wait(self.view.apply_async(engine_side.get_tiles, matrix.uid)):
            for (i, j), arr in part.items():
                out[i * t : i * t + arr.shape[0], j * t : j * t + arr.shape[1]] = arr

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
        return max(self._wait(self.view.apply_async(engine_side.compile_kernels, dtypes)))

    def fetch(self, run_id: str, task: int, rank: int):
        return self._wait(
            self.client[self.engine_ids[rank]].apply_async(engine_side.result, run_id, task)
        )

    # -- runs ------------------------------------------------------------------------

    def run(
        self,
        graph: Graph,
        *,
        workers: int | None = None,
        blas_threads: int | None = None,
        plan: Plan | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
    ) -> EngineRun:
        """Plan here, send graph and plan to every engine in one message; returns at once.

        ``workers``, ``blas_threads``: per engine (default: the cluster's); ``plan``: a
        plan made already; ``trace``: record events; ``task_timeout``: seconds a task
        may run unless its function has a ``timeout`` of its own (None: no limit). A
        task past its limit fails the run, naming it; an engine stuck in it (a call into
        C that never returns) is reported by ``wait()`` within the limit plus
        ``STUCK_GRACE`` seconds. A run started while another is going is queued behind
        it (``run.state() == "queued"``) and starts when that one ends."""
        if self.client is None:
            raise RunError("the cluster is closed")
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
            previous=self._last_run,
        )
        self._last_run = run
        return run


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


class EngineRun:
    """A graph running on the engines; returned at once by :meth:`EngineCluster.run`.

    States (:meth:`state`): ``"queued"`` while an earlier run of the cluster is still
    going (the engines take one request at a time), ``"running"``, then ``"done"``
    (``wait()`` says whether it failed)."""

    def __init__(
        self,
        cluster: EngineCluster,
        graph: Graph,
        workers,
        blas_threads,
        plan,
        trace=True,
        task_timeout: float | None = None,
        previous: EngineRun | None = None,
    ):
        self.cluster = cluster
        self.graph = graph
        self.plan = plan if plan is not None else make_plan(graph, cluster.size)
        self.id = uuid.uuid4().hex[:12]
        self.task_timeout = task_timeout
        self._previous = previous if previous is not None and not previous.done() else None
        graph.results.clear()
        graph.result_ranks.clear()
        graph.result_ranks.update(
            (t.id, self.plan.placement[t.id]) for t in graph.tasks if not hasattr(t.fn, "modes")
        )
        graph.fetch = self._fetch
        payload = cloudpickle.dumps((self.plan, workers, blas_threads, trace, task_timeout))
        self.payload_bytes = len(payload)
        self.t0 = time.perf_counter()
        forget = []
        while cluster._forgotten:
            forget.append(cluster._forgotten.popleft())
        self.ar = cluster.view.apply_async(engine_side.run_graph, payload, self.id, forget)
        self._seen: list[set[str]] = [set() for _ in range(cluster.size)]
        self._kept: list[dict] = []  # every batch, for the trace
        self._trace: Trace | None = None
        self._cancelled = False
        self._heard: dict[int, tuple[object, float]] = {}  # rank -> (heartbeat, when seen)
        self.summaries: list[dict] | None = None
        self.seconds = 0.0
        self.compile_seconds = 0.0
        self.wall_seconds = 0.0

    def __repr__(self) -> str:
        return f"<Run {self.graph.name!r} on {self.cluster.size} engines: {self.state()}>"

    def done(self) -> bool:
        return self.ar.ready()

    def queued(self) -> bool:
        """Whether the run waits for an earlier run of the cluster to end."""
        prev = self._previous
        if prev is not None and prev.done():
            self._previous = prev = None
        return prev is not None and not self.done()

    def state(self) -> str:
        """``"queued"``, ``"running"`` or ``"done"``."""
        if self.done():
            return "done"
        return "queued" if self.queued() else "running"

    def wait(self, timeout: float | None = None) -> EngineRun:
        """Block until the run ends everywhere; raise its error (TaskError, RunError).

        ``timeout``: seconds, then TimeoutError (the run goes on). An engine stuck in a
        task past its time limit raises RunError naming the task and rank. Ctrl-C
        cancels the run, waits up to 10 s for it to stop, and raises KeyboardInterrupt;
        a second Ctrl-C meanwhile stops only the waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self.ar.ready():
                self.ar.wait(0.2)
                if self.ar.ready():
                    break
                if not self.cluster.alive():
                    raise RunError(self.cluster._dead_message())
                self._check_stuck()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run of {self.graph.name!r} still going after {timeout} s")
        except KeyboardInterrupt:
            self.cancel()
            try:
                self.ar.wait(10)
            finally:
                raise
        self._conclude()
        return self

    def _limit(self, tid: int) -> float | None:
        own = getattr(self.graph.tasks[tid].fn, "timeout", None)
        return own if own is not None else self.task_timeout

    def _check_stuck(self) -> None:
        """RunError if an engine is stuck in a task: its heartbeat shows the task past
        its time limit plus ``STUCK_GRACE``, or the heartbeat itself stopped for that
        long (a call into C that holds the interpreter) while every task has a limit."""
        if self.queued():
            return
        data = self.ar.data if isinstance(self.ar.data, list) else [self.ar.data]
        data += [{}] * (self.cluster.size - len(data))
        now = time.monotonic()
        longest = self._longest_limit()
        for rank, per_engine in enumerate(data):
            beat = per_engine.get("alive") if isinstance(per_engine, dict) else None
            if beat is None:  # stuck before its first heartbeat: silent since it started
                beat = (None, [])
            heard = self._heard.get(rank)
            if heard is None or heard[0] != beat:
                self._heard[rank] = heard = (beat, now)
            silent = now - heard[1]
            running: list[tuple[int, float]] = beat[1]
            for tid, seconds in running:
                limit = self._limit(tid)
                if limit is not None and seconds + silent > limit + STUCK_GRACE:
                    self._report_stuck([tid], rank, limit, silent)
            if longest is not None and silent > longest + STUCK_GRACE:
                tids = [tid for tid, _ in running] or self._unfinished(rank)
                self._report_stuck(tids, rank, longest, silent)

    def _longest_limit(self) -> float | None:
        """The longest time limit of the graph's tasks (None if one has none)."""
        limits = [self._limit(t.id) for t in self.graph.tasks]
        return None if not limits or None in limits else max(limits)  # type: ignore[type-var]

    def _unfinished(self, rank: int) -> list[int]:
        """Tasks of ``rank`` whose end has not been reported."""
        self.batches()
        ended = {t for b in self._kept if b["rank"] == rank for t in b["events"]["tasks"]["id"]}
        placement = self.plan.placement
        return [t.id for t in self.graph.tasks if placement[t.id] == rank and t.id not in ended]

    def _report_stuck(self, tids: list[int], rank: int, limit: float, silent: float) -> None:
        names = ", ".join(self.graph.label(t) for t in tids[:3]) + (" ..." if len(tids) > 3 else "")
        what = (
            f"task {names} on rank {rank}/{self.cluster.size} ran past its time limit of "
            f"{limit:g} s and was not stopped"
            + (f"; the engine has not answered for {silent:.0f} s" if silent > 1 else "")
            + " (a call that never returns)"
        )
        self.cancel()
        self.cluster._stuck = what
        raise RunError(f"{what}: cluster.restart() starts fresh engines")

    def _conclude(self) -> None:
        if self.summaries is not None:
            return
        try:
            summaries = self.ar.get()
        except Exception as exc:  # an engine died or the engine function failed
            if not self.cluster.alive():
                raise RunError(self.cluster._dead_message()) from exc
            raise
        if any(not isinstance(s, dict) for s in summaries):  # ipyparallel's TaskAborted
            raise RunError(f"run of {self.graph.name!r} was cancelled before it started")
        self.summaries = summaries
        self.wall_seconds = time.perf_counter() - self.t0
        self.seconds = max(s["seconds"] for s in self.summaries)
        self.compile_seconds = max(s["compile_seconds"] for s in self.summaries)
        errors = [s["error"] for s in self.summaries if s["error"] is not None]
        if errors:
            err = errors[0]
            cause = RemoteTraceback(err.traceback) if isinstance(err, TaskError) else None
            raise err from cause

    def cancel(self) -> None:
        """Stop the run on every engine; ``wait()`` then raises RunError. A queued run is
        taken out of the engines' queue; a running one gets one SIGINT per engine, and
        cancelling again changes nothing."""
        if self._cancelled or self.ar.ready():
            return
        self._cancelled = True
        client = self.cluster.client
        if self.queued():
            client.abort(self.ar, targets=self.cluster.engine_ids, block=False)
        else:
            client.send_signal(signal.SIGINT, targets=self.cluster.engine_ids)

    def result(self, future=None):
        """Wait, then the value of ``future`` (or of the graph's only result)."""
        self.wait()
        if future is None:
            sinks = [t for t in self.graph.result_ranks if not self._has_successor(t)]
            if len(sinks) != 1:
                raise RunError(f"the graph has {len(sinks)} results: name the future you want")
            return self.graph.result(sinks[0])
        return future.result()

    def _has_successor(self, tid: int) -> bool:
        return any(tid in t.preds for t in self.graph.tasks)

    def _fetch(self, tid: int):
        if self.summaries is None:
            self.wait()
        return self.cluster.fetch(self.id, tid, self.graph.result_ranks[tid])

    # -- live events -----------------------------------------------------------------

    def batches(self) -> list[dict]:
        """Progress and event batches that arrived since the last call, in order."""
        data = self.ar.data
        if isinstance(data, dict):  # a single engine
            data = [data]
        out = []
        for rank, per_engine in enumerate(data):
            for key in sorted(per_engine):
                if key.startswith("b") and key not in self._seen[rank]:
                    self._seen[rank].add(key)
                    out.append(per_engine[key])
        self._kept += out
        return out

    @property
    def trace(self) -> Trace:
        """Every rank's events of this run, merged (waits for the run to end)."""
        if self._trace is None:
            error = None
            try:
                self.wait()
            except (TaskError, RunError) as exc:
                error = str(exc)
            self.ar.wait_for_output(10)
            self.batches()
            trace = Trace.for_graph(self.graph, self.cluster.size)
            for batch in self._kept:
                trace.ingest(batch)
            trace.finish(error)
            self._trace = trace
        return self._trace

    def show(self, **kwargs):
        """The live widget in a notebook (a progress line elsewhere)."""
        from ..trace.widgets import show

        return show(self, **kwargs)

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks in all) over every rank, from the latest batches."""
        latest: dict[int, tuple[int, int]] = {}
        if self.summaries is not None:  # the ranks' final counts
            return sum(s["stats"]["tasks"] for s in self.summaries), self.graph.ntasks
        data = self.ar.data if isinstance(self.ar.data, list) else [self.ar.data]
        for per_engine in data:
            for key in sorted(k for k in per_engine if k.startswith("b")):
                b = per_engine[key]
                latest[b["rank"]] = (b["done"], b["total"])
        return sum(d for d, _ in latest.values()), self.graph.ntasks


__all__ = ["EngineCluster", "EngineRun", "check_one_world"]
