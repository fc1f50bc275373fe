"""What runs on an ipyparallel engine: one engine is one MPI rank.

The notebook (:mod:`taskgraph.cluster.engines`) calls these functions on every engine with
``apply``. Each engine keeps, per process, the matrices made for the notebook (by
uid) and its recent runs (for fetching their values later).

A run executes on the engine's own ranks exactly as in a batch job (the same
:class:`~taskgraph.cluster.Run` and executor), and several may be in flight at once:
:func:`run_graph` starts one and returns, so the engine (which takes one request at a
time) is free for the next run or a cancel. A thread per run meanwhile publishes
progress and event batches every ``interval`` seconds with ipyparallel's data
publication, under the request that started the run, each under a key of its own
(``b000001``, ...), so the notebook's ``AsyncResult.data`` collects every batch, a
heartbeat (``alive``: a count and the tasks its workers are in) that tells the notebook
the engine still answers, and at the end the run's summary (``summary``), with this
rank's tally of the calls' outcomes (``tally``: :meth:`~taskgraph.run.attempts.Tally.to_wire`,
merged in the notebook into ``run.summary()``).
:func:`cancel_run` cancels one run on every rank (the others go on); the run ends with
a RunError. :func:`submit_calls` and :func:`close_run` add calls to a running run
(``run.submit`` in the notebook) through its :class:`~taskgraph.cluster.submit.Inbox`;
the run's watcher publishes each call's outcome as it ends (``s<key>``), before the
summary.

:func:`set_limits` gives this rank the cluster's ``cores=``, ``memory=`` and ``gpus=``
(:func:`taskgraph.run.resources.set_limits`), as a job's ``Cluster(...)`` does.

:func:`shutdown` ends an engine in order: its process pool (``process=True`` calls)
killed, MPI finalized (its shared memory freed), then the process exits, without the
traceback and MPI_Abort that a SIGTERM brings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator

import cloudpickle

from ..calibrate import on_this_node
from ..core import pickling
from ..core.errors import RunError, TaskgraphError
from ..core.files import held_topology, shm_files
from ..dsl.tiled import TiledMatrix
from ..run import procpool, resources
from ..run.attempts import wire
from .handle import RunHandle
from .job import current_cluster
from .submit import Inbox

MATRICES: dict[int, TiledMatrix] = {}
RUNS: OrderedDict[str, RunHandle] = OrderedDict()  # run id -> run, the latest few
KEEP_RUNS = 8
INBOXES: dict[str, Inbox] = {}  # run id -> its submitted calls, while it goes
SUBMIT_TICK = 0.01  # seconds between looks at submitted calls while some are out


def whoami(token: str | None = None) -> dict:
    """This engine's rank, world size, host and pid; ``token`` as rank 0 sent it."""
    c = current_cluster()
    assert c.world is not None  # an engine is always a rank of an MPI world
    seen = c.world.bcast(token, root=0) if c.size > 1 else token
    return {
        "rank": c.rank,
        "size": c.size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "workers": c.workers,
        "single_copy": c.world.single_copy,
        "token": seen,
        # (what a stopped cluster leaves: its mpiexec is killed, proxies and all)
        "shm": sorted(shm_files([os.getpid()]) | held_topology([os.getppid()])),
    }


def set_limits(cores: int | None, memory: int | None, gpus: int | None) -> int:
    """What this rank hands out to tasks at once (None: as measured); its rank."""
    c = current_cluster()  # (made first: a new JobCluster sets limits of its own)
    resources.set_limits(cores, memory, gpus)
    return c.rank or 0


def shutdown(delay: float = 0.5) -> bool:
    """Kill this rank's process pool, finalize MPI (every rank calls it together),
    then end this engine process ``delay`` seconds after the answer leaves. True if
    MPI was finalized."""
    sys.excepthook = sys.__excepthook__  # no MPI_Abort for anything said at exit
    procpool.shutdown()  # (its processes would follow the engine out; not a moment later)
    finalized = False
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.COMM_WORLD.Barrier()
            MPI.Finalize()
            finalized = True
    threading.Thread(target=_exit_soon, args=(delay,), daemon=True).start()
    return finalized


def _exit_soon(delay: float) -> None:
    time.sleep(delay)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    os._exit(0)


def build_matrix(spec: dict, fill: bytes | None) -> int:
    """Make this rank's tiles of a matrix described by ``spec``; fill them."""
    a = TiledMatrix(**spec, cluster=current_cluster())
    if fill is not None:
        fn = cloudpickle.loads(fill)
        for (i, j), t in a.tiles.items():
            t[...] = fn(i, j, t.shape)
    MATRICES[a.uid] = a
    return len(a.tiles)


def put_tiles(uid: int, tiles: dict) -> int:
    a = matrix(uid)
    for ij, t in tiles.items():
        a.tiles[ij][...] = t
    return len(tiles)


def get_tiles(uid: int) -> dict:
    return dict(matrix(uid).tiles)


def forget_matrix(uid: int) -> None:
    MATRICES.pop(uid, None)


def matrix(uid: int) -> TiledMatrix:
    try:
        return MATRICES[uid]
    except KeyError:
        raise TaskgraphError(
            f"matrix {uid} does not exist on rank {current_cluster().rank}: "
            "was the cluster restarted since it was made?"
        ) from None


def cholesky_tile(n: int, workers: int | None, dtype: str):
    """The Cholesky tile for the notebook's cluster (:meth:`Cluster.cholesky_tile`),
    measured on this engine's node; ``workers``: the notebook's setting (None: each
    engine's own default)."""
    c = current_cluster()
    return on_this_node(n, c.size * (workers or c.workers), dtype)


def compile_kernels(dtypes=("float64", "float32")) -> float:
    from taskgraph.kernels import compile_all

    return compile_all(dtypes)["total"]


def run_graph(payload: bytes, run_id: str, forget=(), interval: float = 0.25) -> dict:
    """Start this rank's share of a planned graph and return at once (``{"rank": r}``):
    the engine takes its next request (another run, a cancel) while this one runs.
    First drop the matrices in ``forget`` (freed in the notebook since the last run).
    ``payload``: the pickled (plan, workers, blas_threads, trace, task_timeout, open,
    options).

    The run's communicators are queued here, in the engine's main thread, which takes
    requests in the order the notebook sent them (the same on every engine), and made
    in that order (see :class:`~taskgraph.run.comm.RunComms`); a SIGINT meanwhile is
    held until the run is made, then cancels it (:func:`_sigint_held`). A thread
    then publishes the run's heartbeat and batches under this request, and at the end
    its summary (``{"summary": ...}``, see :func:`_summary`)."""
    with _sigint_held() as interrupted:
        run = _make_run(payload, run_id, forget, interval)
    if interrupted:
        run.cancel("interrupted (SIGINT) on this engine as the run was made")
    return {"rank": current_cluster().rank}


@contextlib.contextmanager
def _sigint_held() -> Iterator[list]:
    """Hold SIGINT off (ipykernel raises KeyboardInterrupt in the request going on):
    one that landed while an engine made a run left it unmade there, and the other
    engines' run waiting for its communicators, and every later run behind it, for
    ever. Yields a list that holds the signals that came meanwhile."""
    came: list = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, old)


def _make_run(payload: bytes, run_id: str, forget, interval: float):
    """:func:`run_graph`'s run, made, kept and watched."""
    for uid in forget:
        forget_matrix(uid)
    plan, workers, blas_threads, trace, task_timeout, open, options = cloudpickle.loads(payload)
    cluster = current_cluster()
    publish = _publisher()
    if publish is not None:  # before any task can hold the interpreter
        publish({"alive": (0.0, [])})
    extra = {} if task_timeout is None else {"task_timeout": task_timeout}
    run = cluster.run(
        plan.graph,
        workers=workers,
        blas_threads=blas_threads,
        plan=plan,
        trace=trace,
        open=open,
        **extra,
        **{k: v for k, v in dataclasses.asdict(options).items() if v is not None},
    )
    _keep(run_id, run)
    inbox = INBOXES[run_id] = Inbox(run, run_id)
    watcher = threading.Thread(
        target=_watch,
        args=(run, publish, interval, inbox),
        name=f"taskgraph-watch-{run_id}",
        daemon=True,
    )
    watcher.start()
    return run


def cancel_run(run_id: str, reason: str = "interrupted from the notebook") -> bool:
    """Cancel run ``run_id`` on this rank (it stops on every rank); False if this engine
    has no such run going."""
    run = RUNS.get(run_id)
    if run is None or run.done():
        return False
    run.cancel(reason)
    return True


def _keep(run_id: str, run) -> None:
    """Keep ``run`` for its values; forget the oldest ended runs past ``KEEP_RUNS``."""
    RUNS[run_id] = run
    ended = [key for key, kept in RUNS.items() if kept.done()]
    for key in ended[: max(0, len(RUNS) - KEEP_RUNS)]:
        del RUNS[key]


def submit_calls(run_id: str, calls: list[bytes]) -> dict:
    """Add calls to run ``run_id`` on this rank (see :mod:`taskgraph.cluster.submit`);
    returns at once. ``calls``: (key, fn, args, kwargs) each, pickled. The errors of
    those refused (the run has ended or was closed), by key."""
    todo = [cloudpickle.loads(call) for call in calls]
    inbox = INBOXES.get(run_id)
    if inbox is None:
        return {
            key: RunError(
                f"run {run_id} is not going on rank {current_cluster().rank}: "
                f"{getattr(fn, '__name__', 'the call')} not submitted"
            )
            for key, fn, _, _ in todo
        }
    return inbox.submit(todo)


def close_run(run_id: str) -> bool:
    """Run ``run_id`` takes no more submitted calls on this rank; False if it is not
    going here."""
    inbox = INBOXES.get(run_id)
    if inbox is None:
        return False
    inbox.close()
    return True


def _watch(run, publish, interval: float, inbox: Inbox | None = None) -> None:
    """Publish ``run``'s heartbeat and batches until it ends, and the outcome of each
    submitted call as it ends, then its summary; a summary always, even if this thread
    fails (the notebook waits for it)."""
    seq, cursor = 0, (0, 0)
    inbox = inbox if inbox is not None else Inbox(run)  # (a run without submitted calls)
    try:
        t0 = time.perf_counter()
        next_batch = 0.0
        while not run.join(SUBMIT_TICK if inbox.outstanding() else min(interval, 0.05)):
            inbox.hand_over()
            _publish_outcomes(publish, inbox)
            if time.perf_counter() >= next_batch:
                next_batch = time.perf_counter() + interval
                seq, cursor = _publish_batch(publish, run, seq, cursor, t0)
        INBOXES.pop(inbox.key, None)
        inbox.hand_over()  # (calls taken as it ended: refused, told as errors)
        _publish_outcomes(publish, inbox)  # (before the summary: the notebook relies on it)
        seq, cursor = _publish_batch(publish, run, seq, cursor, t0, final=True)
        summary = _summary(run, seq)
    except BaseException as exc:  # noqa: BLE001 - a bug here: the notebook must hear of it
        INBOXES.pop(inbox.key, None)
        run.join()
        summary = {
            "rank": current_cluster().rank,
            "seconds": 0.0,
            "compile_seconds": 0.0,
            "stats": {},
            "values": [],
            "error": RunError(
                f"rank {current_cluster().rank}: {exc}"
                if isinstance(exc, TaskgraphError)  # (one of ours says what went wrong)
                else f"rank {current_cluster().rank}: the run's watcher on this engine "
                f"failed: {exc!r}"
            ),
            "data": None,
            "batches": seq,
            "tally": _tally(run),
        }
    if publish is not None:
        try:
            publish({"summary": summary})
        except Exception as exc:  # noqa: BLE001 - an unpicklable error or value: say so
            summary.update(error=TaskgraphError(f"{summary['error'] or exc}"), data=None)
            publish({"summary": summary})


def _publish_outcomes(publish, inbox: Inbox) -> None:
    """Publish the outcomes of the submitted calls that ended, in one message; one that
    plain pickle cannot send (a closure) goes by value, and one that cannot be sent at
    all (an unpicklable value) is told as ``("unsent", why)`` instead: the notebook
    names the call (see :func:`~taskgraph.cluster.submit._outcome`)."""
    outcomes = inbox.ended()
    if not outcomes or publish is None:
        return
    try:
        publish(outcomes)
        return
    except Exception:  # noqa: BLE001 - find which one, below
        pass
    for key, outcome in outcomes.items():
        try:
            publish({key: outcome})
            continue
        except Exception:  # noqa: BLE001 - by value, below
            pass
        try:
            publish({key: pickling.ByValue(outcome)})  # (it arrives as the outcome itself)
        except Exception as exc:  # noqa: BLE001 - told to the notebook instead
            publish({key: ("unsent", f"{type(exc).__name__}: {exc}")})


def _summary(run, batches: int) -> dict:
    """What the notebook reads of an ended run on this rank."""
    cluster = current_cluster()
    error = None
    try:
        run.wait()
    except TaskgraphError as exc:
        error = exc
    return {
        "rank": cluster.rank,
        "seconds": run.seconds,
        "compile_seconds": run.compile_seconds,
        "stats": run.stats.as_dict(),
        "values": sorted(run.values),
        "error": error,
        # the final values of the plain data the run wrote (every engine has them)
        "data": getattr(run, "data_values", None) if error is None and cluster.rank == 0 else None,
        "batches": batches,
        "tally": _tally(run),
    }


def _tally(run) -> dict | None:
    """This rank's counts of the run's calls (:func:`taskgraph.run.attempts.wire`);
    None if its executor never started (the run failed before anything ran)."""
    ex = getattr(run, "executor", None)
    if ex is None:
        return None
    try:
        return wire(ex)
    except Exception:  # noqa: BLE001 - an executor cut short: no counts, the error says why
        return None


_publish_lock = threading.Lock()  # (the watchers of several runs share one socket)


def _publisher():
    """A function that publishes data under the current request, from any thread, after
    the request has returned too; None outside an engine."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
        from ipyparallel.serialize import serialize_object

        pub = ZMQInteractiveShell.instance().data_pub
        pub.publish_data({})  # fails outside an engine's execution
    except Exception:  # noqa: BLE001 - not on an engine: nothing to publish to
        return None
    parent = dict(pub.parent_header)  # this request's, whatever the engine does next
    session = pub.session

    def publish(data: dict) -> None:
        buffers = serialize_object(
            data, buffer_threshold=session.buffer_threshold, item_threshold=session.item_threshold
        )
        with _publish_lock:
            session.send(
                pub.pub_socket,
                "data_message",
                content={"keys": list(data)},
                parent=parent,
                buffers=buffers,
                ident=pub.topic,
            )

    return publish


def _running(ex) -> list[tuple[int, float]]:
    """(task, seconds it has run) for each busy worker of the executor."""
    now = time.perf_counter()
    current = getattr(ex, "current", None) or []
    started = getattr(ex, "started", None) or []
    return [(int(t), now - s) for t, s in zip(current, started) if t >= 0 and s]


def _publish_batch(publish, run, seq: int, cursor, t0: float, final: bool = False):
    ex = run.executor
    if publish is None:
        return seq, cursor
    # the heartbeat, even while kernels compile: this engine still answers
    publish({"alive": (time.perf_counter() - t0, _running(ex) if ex is not None else [])})
    if ex is None:
        return seq, cursor
    batch, cursor = ex.trace.batch(cursor)
    seq += 1
    batch.update(ex.counts(), elapsed=time.perf_counter() - t0, final=final)
    publish({f"b{seq:06d}": batch})
    return seq, cursor


def result(run_id: str, task: int, by_value: bool = False):
    """The value of a task of a recent run, from this rank (which holds it); wrapped to
    go by value if ``by_value`` (the reply of plain pickle failed: a closure)."""
    run = RUNS.get(run_id)
    if run is None:
        raise TaskgraphError(f"run {run_id} is no longer kept on this engine")
    try:
        value = dict.__getitem__(run.values, task)
    except KeyError:
        raise TaskgraphError(
            f"task {run.graph.label(task)} of run {run.graph.name!r} has no value on rank "
            f"{current_cluster().rank}"
        ) from None
    return pickling.ByValue(value) if by_value else value
