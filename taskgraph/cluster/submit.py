"""Calls added to a running run from outside its tasks: ``run.submit`` and
:func:`as_completed`.

A run made with ``cluster.run(g, open=True)`` (``g`` may be left out: a run of
submitted calls only) takes ``run.submit(fn, *args, **kwargs)`` until ``run.close()``;
``run.wait()`` closes it, then waits for its tasks and every submitted call. A run made
without ``open=True`` takes calls while it still goes, and raises RunError once it has
ended. Each call enters the executor's pool of spawned work as a call of no task
(:meth:`~taskgraph.run.dynamic.SpawnRunner.submit`): it may be stolen by an idle rank,
and its value comes back to the rank it was submitted on. A failed call fails its
future only (a :class:`~taskgraph.run.dynamic.SpawnedTaskError` naming the call, its
rank and traceback); the run goes on::

    batch (every rank runs the script)        notebook (EngineCluster)
    ──────────────────────────────────        ────────────────────────────────────────
    rank 0: run.submit ─► SpawnFuture         run.submit ─► EngineFuture, at once
            (this rank's executor)              │ apply(submit_calls) to the engines in
    other ranks: steal it when idle             ▼ turn (round-robin)
    every rank: run.wait()                    engine: Inbox ─► run.submit (the executor's
                                                pool); its run's watcher publishes each
                                                ended call (``s<key>``) under the run's
                                                request, before the run's summary
                                              client: the future reads it from there

In the notebook the calls made while a request to an engine is in flight go together
in its next one (:class:`Outbox`). An :class:`EngineFuture` ends with its value, its
call's error, or RunError when the run's summary arrives without it (the run failed or
was cancelled) or an engine is lost: every wait has a way out. :func:`as_completed`
yields futures of either kind as they end.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ..core.errors import GraphError, RemoteTraceback, RunError, TaskError, TaskgraphError
from ..dsl.graph import Graph, task
from ..dsl.options import RunOptions, checked_sizes
from ..dsl.tasks import Future
from ..run import context, dynamic
from ..run.attempts import Skipped
from ..run.context import TaskAbandoned
from ..run.dynamic import FAILED, SpawnFuture

POLL_MIN, POLL_MAX = 0.001, 0.02  # seconds between looks at futures that have not ended
NOTE_AFTER = 10.0  # seconds before a wait on an open run's task says why it may not end


@task
def ensemble_start():
    """The one task of a run of submitted calls only: a plain function, so that the
    run's spawned calls may be stolen between ranks (see :func:`ensemble_graph`)."""
    return None


def ensemble_graph(name: str = "ensemble") -> Graph:
    """The graph of a run made without one (``cluster.run(open=True)``): one tiny
    ``@tg.task`` call, since only a graph with plain functions steals spawned work."""
    with Graph(name) as g:
        ensemble_start()
    g.internal = True  # (its one task is not the user's: the summary does not count it)
    return g


def run_request(
    graph: Graph | None, open: bool, *, sizes: dict[str, Any], **options: Any
) -> tuple[Graph, RunOptions]:
    """What ``cluster.run(graph, open=..., **options)`` runs, on every kind of cluster:
    the graph (a run of submitted calls only, for ``open=True`` without one) and the
    checked :class:`~taskgraph.dsl.options.RunOptions`; RunError for no graph and not
    open, GraphError for a bad option (``sizes``: ``workers``, ``blas_threads`` and
    ``task_timeout``, checked only), TypeError for something else than a graph and
    RuntimeError inside a running task (its run would wait for the new one on its
    rank alone: the ranks fell out of step, a trial)."""
    refuse_in_task("cluster.run()")
    run_options = RunOptions.make(**options)
    checked_sizes("cluster.run", **sizes)
    if graph is not None and not isinstance(graph, Graph):
        raise TypeError(f"cluster.run() takes a tg.Graph, not {type(graph).__name__}")
    if graph is None:
        if not open:
            raise RunError("cluster.run() needs a graph, unless open=True")
        graph = ensemble_graph()
    return graph, run_options


def refuse_in_task(what: str) -> None:
    """RuntimeError if this thread runs a task (a run's worker, or a process=True
    task's process): ``what`` is made by the script, on every rank alike."""
    if context.current() is None and not context.in_pool_process:
        return
    raise RuntimeError(
        f"{what} inside a running task: runs are made by the script (on every rank of a "
        "batch job, or in the notebook); inside a task, start more work with "
        "tg.spawn(fn, *args) and wait for it with fut.result()"
    )


def _done(fut: Any) -> bool:
    return bool(fut.done())


@contextlib.contextmanager
def cancelled_if_interrupted(futures: Iterable[Any]) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) while the notebook waits for ``futures`` cancels their
    runs, as it does in ``run.wait()``, and is raised: the engines ran on with no one
    waiting (a trial). Only the notebook's futures (EngineFutures, and ``@tg.task``
    calls' of a run on engines): a task's waits are not interrupted so, and a batch
    job's Ctrl-C reaches every rank's ``run.wait()``."""
    try:
        yield
    except KeyboardInterrupt:
        runs: dict[int, Any] = {}
        for f in futures:
            run: Any = f.run if isinstance(f, EngineFuture) else None
            if isinstance(f, Future):
                run = f.graph.last_run
            if run is not None and getattr(run, "where", None) == "engines":
                runs[id(run)] = run
        for run in runs.values():
            run.cancel("interrupted (KeyboardInterrupt)")
        raise


def _refuse_unrun(fut: Any, what: str) -> None:
    """GraphError for a ``@tg.task`` call's future whose graph never ran: it would never
    end (``tg.as_completed`` waited for ever, a trial)."""
    if isinstance(fut, Future) and fut.graph.last_run is None:
        label = fut.graph.label(fut.id)
        raise GraphError(f"{what}: task {label} has not run yet: run the graph first")


def _open_note(fut: Any) -> str:
    """Why a ``@tg.task`` call's future has not ended, if its run is open and not closed
    (it ends with its run, which ends once closed: a wait over it alone waited for ever,
    a trial); "" otherwise. Not refused: another thread may close the run, or a failure
    end it."""
    if not isinstance(fut, Future) or fut.done():
        return ""
    run = fut.graph.last_run
    if getattr(run, "closed", True):
        return ""
    return (
        f"task {fut.graph.label(fut.id)} has its value when its run ends, and run "
        f"{fut.graph.name!r} is open: it ends once run.close() (or run.wait()) is called"
    )


def wait(futures: Iterable[Any], timeout: float | None = None) -> list:
    """The values of ``futures``, in their order, once all have ended; raises a failed
    one's error as soon as one has failed; TimeoutError after ``timeout`` seconds (they
    go on). Spawned calls (``tg.spawn``, ``run.submit`` in a batch job): see
    :func:`taskgraph.run.dynamic.wait`, which a task uses to help meanwhile; a
    notebook's ``run.submit`` futures (EngineFutures) too, mixed as you like. TypeError,
    naming it, for one future alone or an item that is no future."""
    if hasattr(futures, "result"):
        raise TypeError(
            f"tg.wait takes a list of futures, not one {type(futures).__name__}: call its "
            ".result(), or tg.wait([fut])"
        )
    if not hasattr(futures, "__iter__"):
        raise TypeError(f"tg.wait takes a list of futures, not {type(futures).__name__}")
    futures = list(futures)
    for i, f in enumerate(futures):
        if not (callable(getattr(f, "result", None)) and callable(getattr(f, "done", None))):
            raise TypeError(
                f"tg.wait: item {i} is {type(f).__name__} {f!r:.60}, not a future (tg.spawn "
                "and run.submit give futures)"
            )
        _refuse_unrun(f, "tg.wait")
    if all(f.__class__ is SpawnFuture for f in futures):
        return dynamic.wait(futures, timeout)
    for f in _as_completed(futures, timeout):  # (checked above; raises at the first that failed)
        f.result()
    return [f.result() for f in futures]


def as_completed(futures: Iterable[Any], timeout: float | None = None) -> Iterator[Any]:
    """Yield ``futures`` as they end, in the order they end (those ended already first).

    ``futures``: SpawnFutures (``run.submit`` in a batch job, ``tg.spawn``) and
    EngineFutures (``run.submit`` in a notebook), mixed as you like; the set is fixed
    when called (call it again on a new batch). ``timeout``: seconds for all of them,
    then TimeoutError naming how many have not ended. A future that failed is yielded
    too: its ``result()`` raises. A ``@tg.task`` call's future ends when its run does
    (GraphError if the graph never ran; a warning after NOTE_AFTER seconds if its run is
    open and not closed, which it ends only once closed)."""
    futures = list(futures)
    for f in futures:
        _refuse_unrun(f, "tg.as_completed")
    return _as_completed(futures, timeout)


def _as_completed(futures: list, timeout: float | None) -> Iterator[Any]:
    """:func:`as_completed`, its futures checked; Ctrl-C while it waits cancels the
    notebook's runs of them (:func:`cancelled_if_interrupted`)."""
    with cancelled_if_interrupted(futures):
        yield from _yield_as_completed(futures, timeout)


def _yield_as_completed(futures: list, timeout: float | None) -> Iterator[Any]:
    """:func:`_as_completed`'s loop."""
    began = time.monotonic()
    deadline = None if timeout is None else began + timeout
    noted = False  # (the warning about an open run's task, once)
    ready: list = []  # ended already, in order: yielded first
    ended: deque = deque()  # (a spawned call is put here as it ends: see SpawnFuture.watch)
    spawned: dict[int, SpawnFuture] = {}  # those not ended, by id, in order
    others: list = []  # any other kind, looked at in turn
    for f in dict.fromkeys(futures):  # (each once, in order)
        if isinstance(f, SpawnFuture):
            if f.put_on_end(ended):
                spawned[id(f)] = f
            else:
                ready.append(f)
        elif _done(f):
            ready.append(f)
        else:
            others.append(f)
    owners = list({id(f.owner): f.owner for f in spawned.values()}.values())
    mine = next((o for o in owners if o.is_worker_here()), None)  # (in a task of that run)
    sleep = POLL_MIN
    try:
        yield from ready
        while spawned or others:
            out = []
            while ended:
                f = ended.popleft()
                if spawned.pop(id(f), None) is not None:
                    out.append(f)
            if others:
                left: list = []
                for f in others:
                    (out if _done(f) else left).append(f)
                others = left
            if not out:  # (a run that stopped ends its calls without a word)
                for o in owners:
                    if o.stopping:
                        out += [spawned.pop(k) for k, f in list(spawned.items()) if f.owner is o]
            if out:
                sleep = POLL_MIN
                yield from out
                continue
            if deadline is not None and time.monotonic() >= deadline:
                first = next(iter(spawned.values()), None) or others[0]
                pending = len(spawned) + len(others)
                note = next(filter(None, map(_open_note, others)), "")
                raise TimeoutError(
                    f"{pending} of the futures {'has' if pending == 1 else 'have'} not ended "
                    f"after {timeout} s (the first: {first!r})" + (f": {note}" if note else "")
                )
            if not noted and others and time.monotonic() - began >= NOTE_AFTER:
                noted = True
                note = next(filter(None, map(_open_note, others)), "")
                if note:
                    warnings.warn(f"still waiting: {note}", RuntimeWarning, stacklevel=2)
            pause = sleep if deadline is None else min(sleep, max(0.0, deadline - time.monotonic()))
            helping = None
            if mine is not None:
                helping = next((f for f in spawned.values() if f.owner is mine), None)
            if mine is not None and helping is not None:  # (a task of that run: it helps)
                try:
                    seconds = pause if deadline is not None else POLL_MAX
                    timed = deadline is not None  # (its calls go on their own threads)
                    mine.wait_any(helping, seconds, list(spawned.values()), timed)
                except RunError:
                    pass  # (the run stopped: its futures are done now, each yielded)
            else:
                time.sleep(pause)
                sleep = min(POLL_MAX, sleep * 2)
    finally:  # (left early: the calls not ended forget this queue)
        for f in spawned.values():
            f.forget(ended)


# -- the client's side of a run on engines ---------------------------------------------


class EngineFuture:
    """The future of ``run.submit(fn, ...)`` on a run on engines, in the notebook.

    ``label``: the call, readable; ``rank``: the engine it was submitted to (its value
    comes back from there, wherever it ran); ``key``: its name under the run's request;
    ``run``: the run; ``sent``: the :class:`Batch` it goes to its engine in (the
    request's failure fails the future). States: pending, then done (a value) or
    failed (an exception): set once, by whichever thread looks first, under a lock."""

    def __init__(self, run: Any, key: str, rank: int, label: str, sent: Any):
        self.run = run
        self.key = key
        self.rank = rank
        self.label = label
        self._sent = sent  # the Batch it goes in (see Outbox)
        self._lock = threading.Lock()
        self._ended = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        state = "pending" if not self._ended else ("failed" if self._error else "done")
        return f"<submitted {self.label} to rank {self.rank}: {state}>"

    def done(self) -> bool:
        """Whether the call has ended (well or not), or can no longer end."""
        if not self._ended:
            self._look()
        return self._ended

    def result(self, timeout: float | None = None) -> Any:
        """The call's value once it has ended. Raises its error (a TaskError naming
        the call, its rank and the remote traceback), RunError if the run ended
        without it (failed, cancelled) or an engine was lost, TimeoutError after
        ``timeout`` seconds (the call goes on)."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error once it has ended (None if it ended well); as
        :meth:`result` for ``timeout``."""
        self._wait(timeout)
        return self._error

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        sleep = POLL_MIN
        with cancelled_if_interrupted([self]):
            while not self.done():
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{self.label} (run {self.run.graph.name!r}) has not ended after "
                        f"{timeout} s"
                    )
                time.sleep(sleep)
                sleep = min(POLL_MAX, sleep * 2)

    def _end(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if not self._ended:
                self._value, self._error, self._ended = value, error, True

    def _look(self) -> None:
        """One look, without waiting: the published outcome, a failed submission, the
        run's end without it, a lost engine."""
        data = self.run._data_of(self.rank)
        outcome = data.get(self.key)
        if outcome is not None:
            self._end(*_outcome(outcome, self))
            return
        problem = self._submission_problem()
        if problem is not None:
            self._end(None, problem)
            return
        if "summary" in data:  # (published after every outcome: none will come)
            outcome = data.get(self.key)
            if outcome is not None:
                self._end(*_outcome(outcome, self))
                return
            self._end(None, self.run._ended_without(self.label))
            return
        if self.run._engines_gone():  # (closed or restarted: nothing more will come)
            self._end(None, RunError(f"{self.label} did not end: {self.run._cut_off()}"))
            return
        if not self.run.cluster.alive():
            self._end(None, RunError(self.run.cluster._dead_message()))

    def _submission_problem(self) -> BaseException | None:
        """The error of the request that submitted the call, if it failed."""
        batch = self._sent
        if batch.error is not None:
            return RunError(f"{self.label} could not be sent to rank {self.rank}: {batch.error}")
        sent = batch.ar
        if sent is None or not sent.ready():
            return None
        try:
            refused = sent.get()
        except Exception as exc:  # noqa: BLE001 - the engine function failed: the future's error
            return RunError(f"{self.label} could not be submitted to rank {self.rank}: {exc}")
        error = refused.get(self.key) if isinstance(refused, dict) else None
        return error


class Batch:
    """Submitted calls that go to one engine in one request: ``ar``, the request's
    AsyncResult (None until sent); ``error``, why it could not be sent."""

    __slots__ = ("ar", "error")

    def __init__(self) -> None:
        self.ar: Any = None
        self.error: BaseException | None = None


class Outbox:
    """The notebook's submitted calls on their way to the engines. A call goes at once
    when no request to its engine is in flight; else it waits, with the calls made
    meanwhile, and they go in one request as soon as the one in flight is answered (an
    engine takes a few ms a request: one call a request topped out at ~300 calls a
    second). ``send(rank, calls)``: the AsyncResult of the request carrying ``calls``
    (pickled) to the engine of ``rank``. Any thread (answers come on the client's)."""

    def __init__(self, send: Any):
        self._send = send
        self._lock = threading.RLock()  # (an answered request may call back at once)
        self._calls: dict[int, list[bytes]] = {}  # rank -> calls waiting
        self._batch: dict[int, Batch] = {}  # rank -> the Batch they will go in
        self._flying: dict[int, Any] = {}  # rank -> the request in flight

    def put(self, rank: int, call: bytes) -> Batch:
        """Send the pickled ``call`` to ``rank``'s engine, now or with the next batch;
        the Batch it goes in."""
        with self._lock:
            batch = self._batch.setdefault(rank, Batch())
            self._calls.setdefault(rank, []).append(call)
            if rank not in self._flying:
                self._go(rank)
            return batch

    def flush(self) -> None:
        """Send every call waiting, now (before a request that must come after them:
        each engine takes requests in the order sent)."""
        with self._lock:
            for rank in list(self._calls):
                self._go(rank)

    def _go(self, rank: int) -> None:
        calls, batch = self._calls.pop(rank, None), self._batch.pop(rank, None)
        if not calls or batch is None:
            return
        try:
            ar = self._send(rank, calls)
        except Exception as exc:  # noqa: BLE001 - its futures fail, naming it
            batch.error = exc
            return
        batch.ar = self._flying[rank] = ar
        ar.add_done_callback(lambda _, r=rank, a=ar: self._answered(r, a))

    def _answered(self, rank: int, ar: Any) -> None:
        with self._lock:
            if self._flying.get(rank) is ar:
                del self._flying[rank]
            if self._calls.get(rank):
                self._go(rank)


def _outcome(outcome: tuple, fut: EngineFuture) -> tuple[Any, BaseException | None]:
    """(value, error) of ``fut`` from what an engine published: ``("ok", value)``,
    ``("err", error)``, or ``("unsent", why)`` (its outcome did not pickle); a
    TaskError gets its remote traceback as its cause."""
    kind, payload = outcome
    if kind == "ok":
        if payload.__class__ is Skipped:  # (on_failure="skip": it has no value)
            return None, payload.exception()
        return payload, None
    if kind == "unsent":
        return None, TaskgraphError(
            f"{fut.label} on rank {fut.rank}/{fut.run.cluster.size} ended, but its outcome "
            f"cannot be sent to the notebook: {payload}"
        )
    if isinstance(payload, TaskError) and payload.traceback:
        payload.__cause__ = RemoteTraceback(payload.traceback)
    return None, payload


# -- the engine's side -----------------------------------------------------------------


class Inbox:
    """An engine's submitted calls of one run: taken by :meth:`submit` (the engine's
    main thread, never blocking), handed to the run once its executor exists and their
    outcomes taken for publication by :meth:`flush` (the run's watcher thread).

    Guarded by ``lock``: ``waiting`` (key, fn, args, kwargs) not given to the run yet,
    ``futures`` (key -> SpawnFuture) given and not published, ``closing``. ``ended``:
    the futures given, as they end (see ``SpawnFuture.watch``: no look at those that
    have not, which took 10,000 looks a tick with 10,000 calls out)."""

    def __init__(self, run: Any, key: str = ""):
        self.run = run
        self.key = key  # the run's id
        self.lock = threading.Lock()
        self.waiting: list[tuple] = []
        self.futures: dict[str, SpawnFuture] = {}
        self.keys: dict[int, str] = {}  # id of a future given -> its key
        self.ended_queue: deque = deque()
        self.closing = False

    def submit(self, calls: list[tuple]) -> dict[str, BaseException]:
        """Take ``calls`` ((key, fn, args, kwargs) each); the errors of those refused, by
        key (RunError: the run has ended or is closed; GraphError: the call asks for
        more cores, memory or GPUs than any rank has)."""
        refused: dict[str, BaseException] = {}
        with self.lock:
            if self.closing:
                for key, fn, *_ in calls:
                    refused[key] = RunError(
                        f"run {self.run.graph.name!r} is closed: {_name(fn)} not submitted"
                    )
                return refused
            self.waiting += calls
        self.hand_over(refused)
        return refused

    def close(self) -> None:
        """No more calls: the run is closed once those taken are handed over."""
        with self.lock:
            self.closing = True
        self.hand_over()

    def hand_over(self, refused: dict | None = None) -> None:
        """The calls waiting, to the run, once it has an executor; then, if closing,
        close the run. ``refused`` collects the errors of calls the run refused (else
        they are published)."""
        if self.run.executor is None and not self.run.done():
            return
        with self.lock:
            calls, self.waiting = self.waiting, []
            closing = self.closing
        for key, fn, args, kwargs in calls:
            try:
                fut = self.run.submit(fn, *args, **kwargs)
            except (RunError, GraphError) as exc:  # (closed, or asks for more than a rank has)
                if refused is not None:
                    refused[key] = exc
                    continue
                fut = _failed(exc)
            with self.lock:
                self.futures[key] = fut
                self.keys[id(fut)] = key
            self._watch(fut)
        if closing:
            self.run.close()

    def _watch(self, fut: Any) -> None:
        """Have ``fut`` put on ``ended_queue`` as it ends (now, if it has)."""
        if not isinstance(fut, SpawnFuture) or not fut.put_on_end(self.ended_queue):
            self.ended_queue.append(fut)  # (refused, or ended already)

    def outstanding(self) -> bool:
        """Whether some calls have not been published yet."""
        return bool(self.futures or self.waiting)

    def ended(self) -> dict[str, tuple]:
        """The outcomes of the calls that ended since the last call, taken out:
        ``("ok", value)`` or ``("err", SpawnedTaskError)``, by key."""
        keys, futs = [], []
        with self.lock:
            while self.ended_queue:
                fut = self.ended_queue.popleft()
                key = self.keys.pop(id(fut), None)
                if key is not None:
                    keys.append(key)
                    futs.append(self.futures.pop(key))
        out = {}
        for key, fut in zip(keys, futs):
            if _stopped(fut):
                continue  # (the run stopped under it: the summary tells why)
            if fut.state == FAILED:
                out[key] = ("err", fut.error() if fut.failure is not None else fut.exc)
            else:
                out[key] = ("ok", fut.value)
        return out


def _stopped(fut: Any) -> bool:
    """Whether a call failed because its run stopped under it (TaskAbandoned, or a
    wait's RunError: see SpawnFuture.stopped_under; a SystemExit of its own is its
    failure, published as any other)."""
    if fut.state != FAILED:
        return False
    if isinstance(fut, SpawnFuture) and fut.stopped_under():
        return True
    if fut.exc is not None:
        return isinstance(fut.exc, TaskAbandoned)
    return fut.failure is not None and str(fut.failure[4]).startswith("TaskAbandoned")


class _Refused:
    """A call the run refused after it was taken: ended, failed with ``exc``."""

    state = FAILED
    failure = None

    def __init__(self, exc: BaseException):
        self.exc = exc


def _failed(exc: BaseException) -> Any:
    return _Refused(exc)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


__all__ = ["Batch", "EngineFuture", "Inbox", "Outbox", "as_completed", "ensemble_graph"]
