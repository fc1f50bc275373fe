"""Failure policies: the attempts of one managed call, and what its failure means.

A *managed* call is a ``@tg.task`` call (in a graph, ``tg.spawn`` or ``run.submit``)
whose options (:func:`~taskgraph.dsl.options.effective`: the task's, filled in by the
run's) are not the defaults, or any such call in a run made with options; where a
graph has one managed call, all its ``@tg.task`` calls are managed (a default one may
read a skipped value). Everything else keeps the executor's plain path. Tile kernels
are never managed: they write tiles in place, and a failed one fails the run.

One managed call, on the worker that took it::

    an input is Skipped ─────────────────────────────► Skipped (not run)
    in the checkpoint ───────────────────────────────► its value (not run)
    attempt 1, 2, ... through ex.launcher.call ──ok──► value (checkpointed)
            │ raised
            ▼ decide(options, attempt, exc)
      "retry" ─► next attempt        "fail" ─► raise: the run fails (a spawned
      "skip"  ─► Skipped(...)                   call's future fails), as always
      "ignore"─► the exception, as the value (picklable, its traceback text kept)

Timeouts: a graph task's attempt is watched by the executor (where it has a policy;
else a timeout fails the run); a spawned or submitted call's attempt with a
``timeout`` always, by a watcher thread of this module (:class:`Watch`), and one past
its time is a failed attempt (``AttemptTimeout``, a TimeoutError naming the call).
A timed Python function runs on a thread of its own (:func:`_own_thread`), so that
one stuck in a C call the interrupt cannot end is abandoned, and the policy goes on.
As a waiting worker runs deeper calls on its own stack, the interrupt is raised only
in the innermost timed attempt of a thread while nothing deeper runs there; one whose
time ran out under a deeper call fails as that call returns to it. A managed call
that waits for a spawned call gives its cores, memory and GPUs back meanwhile.

Every attempt leaves one trace row (``trace.attempt``). A :class:`Skipped` value
travels as any value does (to another rank too), so every call that takes it as an
input is skipped in turn, and the rest of the graph goes on; ``run.result(f)`` of a
skipped task, or ``fut.result()`` of a skipped spawned call, raises
:class:`TaskSkipped`. The counts go into a :class:`Tally` per rank, gathered at the end
into the run's :class:`Summary`.
"""

from __future__ import annotations

import ctypes
import heapq
import html
import itertools
import math
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import TaskError
from ..dsl.options import DEFAULT, TaskOptions, effective, options_of
from ..dsl.tasks import Ref
from .checkpoint import Checkpoint
from .context import current as dynamic_context
from .context import enter as enter_context
from .launcher import EXES as _EXES
from .launcher import call_need
from .tuning import ABANDON

RETRY, FAIL, SKIP, IGNORE = "retry", "fail", "skip", "ignore"

# attempt row states (as taskgraph.trace.recorder names them)
DONE_ROW, FAILED_ROW, RETRIED_ROW = "done", "failed", "retried"
SKIPPED_ROW, CHECKPOINT_ROW = "skipped", "checkpoint-hit"


def decide(options: TaskOptions, attempt: int, exc: BaseException) -> str:
    """What follows attempt number ``attempt`` (1, 2, ...) of a call with ``options``
    that raised ``exc``: ``"retry"`` while retries are left, else the call's
    ``on_failure`` (``"fail"``, ``"skip"`` or ``"ignore"``). An exception that is not
    an ``Exception`` (an interrupt, the run abandoning the task) always fails."""
    if not isinstance(exc, Exception):
        return FAIL
    if attempt <= options.retries:
        return RETRY
    return options.on_failure


class TaskSkipped(TaskError):
    """The value of a skipped call was asked for (``run.result(f)``, ``fut.result()``):
    the call did not run, because it failed with ``on_failure="skip"`` or a call it
    takes as an input was skipped. As :class:`~taskgraph.core.errors.TaskError`
    (``task``, ``rank``, ``size``, ``host``, ``error``, ``traceback``), with ``task``
    the call asked for, ``rank``/``size`` where the failure was, and ``error`` saying
    which call failed and why."""

    def __str__(self) -> str:
        return f"task {self.task} was skipped: {self.error}"


class Skipped:
    """The value of a skipped call: ``task`` (its label), ``origin`` (the call that
    failed, which may be the same), ``rank`` and ``size`` where that failed, and
    ``error`` (``Type: text``). Small, and picklable by plain pickle."""

    __slots__ = ("error", "origin", "rank", "size", "task")

    def __init__(self, task: str, origin: str, rank: int, size: int, error: str):
        self.task = task
        self.origin = origin
        self.rank = rank
        self.size = size
        self.error = error

    def __reduce__(self):
        return (Skipped, (self.task, self.origin, self.rank, self.size, self.error))

    def why(self) -> str:
        """Why it was skipped, in words."""
        if self.origin == self.task:
            return f"it failed on rank {self.rank}/{self.size}: {self.error}"
        return f"its input {self.origin} failed on rank {self.rank}/{self.size}: {self.error}"

    def exception(self, host: str = "") -> TaskSkipped:
        """The :class:`TaskSkipped` to raise where its value is asked for."""
        return TaskSkipped(self.task, self.rank, self.size, host, self.why())

    def __repr__(self) -> str:
        return f"<skipped {self.task}: {self.why()}>"


def skipped_input(args: tuple | list, kwargs: dict | None) -> Skipped | None:
    """The first :class:`Skipped` among a call's arguments (top level: a graph call's
    inputs are there, also those packed in containers), or None."""
    for a in args:
        if a.__class__ is Skipped:
            return a
    if kwargs:
        for v in kwargs.values():
            if v.__class__ is Skipped:
                return v
    return None


def ignored(exc: BaseException, label: str, net: Any) -> BaseException:
    """The value of a call that failed with ``on_failure="ignore"``: ``exc`` itself,
    carrying its traceback text as ``remote_traceback``, if it pickles; else a
    TaskError that names the call and carries the text."""
    text = "".join(traceback.format_exception(exc))
    try:
        exc.remote_traceback = text  # type: ignore[attr-defined]
        pickle.loads(pickle.dumps(exc, protocol=5))
        return exc
    except Exception:  # noqa: BLE001 - not picklable: a TaskError stands in
        err = TaskError(label, net.rank, net.size, net.host, f"{type(exc).__name__}: {exc}", text)
        err.remote_traceback = text  # type: ignore[attr-defined]
        return err


# -- the counts ----------------------------------------------------------------------


class Tally:
    """One rank's counts (any thread: each change is one statement under the GIL, or
    a ``list.append``): ``ok`` calls that ended well (managed ones, and spawned or
    submitted ones), ``static`` managed graph tasks that ended (any way), ``failed``
    (label, rank, error) of calls whose last attempt failed, ``skipped`` labels,
    ``retries``, ``hits`` (values from the checkpoint), ``reruns`` (spawned calls put
    back to run again from their start after unwinding: taskgraph.run.unwind)."""

    __slots__ = ("failed", "hits", "ok", "reruns", "retries", "skipped", "static")

    def __init__(self) -> None:
        self.ok = 0
        self.static = 0
        self.retries = 0
        self.hits = 0
        self.reruns = 0
        self.failed: list[tuple[str, int, str]] = []
        self.skipped: list[str] = []

    def to_wire(self, static_done: int) -> dict:
        """As plain data, with ``static_done`` (graph tasks done on this rank)."""
        ok = self.ok + static_done - self.static
        return {
            "ok": ok,
            "retries": self.retries,
            "hits": self.hits,
            "reruns": self.reruns,
            "failed": list(self.failed),
            "skipped": list(self.skipped),
        }


HANDLED = (
    "  the run ended well: each failure below was caught by its caller, handled by its "
    "on_failure, or kept in its submitted call's future"
)


RERUNS = "every run of a call is counted"  # (see taskgraph.run.unwind)


@dataclass(repr=False)  # (its repr is its text: a script's last expression prints it)
class Summary:
    """What a run did, over every rank: ``succeeded`` calls (graph tasks, spawned and
    submitted calls; with retries, and ``from_checkpoint`` of them read from the
    checkpoint), ``failed`` (label, rank, error) of the calls whose last attempt
    failed, ``skipped`` (labels of calls not run: an input was skipped), ``retries``
    (attempts after a failed one); ``reruns``: spawned calls that an error unwound and
    that ran again from their start (taskgraph.run.unwind): each run of a call, and of
    the calls it spawned, is counted, so the counts exceed the calls of the program;
    ``ended_well``: the run did not fail, so every failure was handled (a caller caught
    it, the call's ``on_failure``, or it is kept in a submitted call's future)."""

    name: str = ""
    succeeded: int = 0
    failed: list[tuple[str, int, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    retries: int = 0
    reruns: int = 0
    from_checkpoint: int = 0
    ended_well: bool = False

    @classmethod
    def merge(cls, name: str, parts: list[dict]) -> Summary:
        """The summary of every rank's :meth:`Tally.to_wire`."""
        s = cls(name)
        for p in parts:
            s.succeeded += p["ok"]
            s.retries += p["retries"]
            s.reruns += p.get("reruns", 0)
            s.from_checkpoint += p["hits"]
            s.failed.extend(tuple(f) for f in p["failed"])
            s.skipped.extend(p["skipped"])
        return s

    @property
    def notable(self) -> bool:
        """Whether anything failed, was skipped or retried."""
        return bool(self.failed or self.skipped or self.retries)

    def headline(self) -> str:
        """One line of counts."""
        ck = f" ({self.from_checkpoint} from the checkpoint)" if self.from_checkpoint else ""
        again = f" ({self.reruns} unwound and ran again: {RERUNS})" if self.reruns else ""
        return (
            f"run {self.name!r}: {self.succeeded} succeeded{ck}, {len(self.failed)} failed, "
            f"{len(self.skipped)} skipped, {self.retries} retries{again}"
        )

    def __str__(self) -> str:
        lines = [self.headline()]
        if self.failed and self.ended_well:  # (a caught error read as the run's own)
            lines.append(HANDLED)
        for label, rank, error in self.failed[:20]:
            lines.append(f"  failed  {label} on rank {rank}: {error}")
        if len(self.failed) > 20:
            lines.append(f"  ... and {len(self.failed) - 20} more failed")
        if self.skipped:
            more = f" ... and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else ""
            lines.append(f"  skipped {', '.join(self.skipped[:10])}{more}")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(lb)}</td><td>{r}</td><td>{html.escape(e)}</td></tr>"
            for lb, r, e in self.failed[:50]
        )
        table = f"<table><tr><th>failed</th><th>rank</th><th>error</th></tr>{rows}</table>"
        skipped = html.escape(", ".join(self.skipped[:50]))
        handled = f"<p>{html.escape(HANDLED.strip())}</p>" if rows and self.ended_well else ""
        return (
            f"<div><b>{html.escape(self.headline())}</b>{handled}{table if rows else ''}"
            f"{'<p>skipped: ' + skipped + '</p>' if skipped else ''}</div>"
        )


# -- per-attempt timeouts --------------------------------------------------------------


class AttemptTimeout(TimeoutError):
    """Raised in a worker's thread whose managed attempt ran past its ``timeout``: that
    attempt failed, and the call's failure policy decides what follows."""


def _raise_in(ident: int, exc: type | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc and ctypes.py_object(exc))


class Timed:
    """One timed attempt of a spawned or submitted call, armed on thread ``ident``:
    its ``label``, ``limit`` (seconds), ``deadline`` (``time.perf_counter``), and
    ``hit`` (its interrupt was raised, and not yet withdrawn), at ``hit_at``."""

    __slots__ = ("deadline", "hit", "hit_at", "ident", "label", "limit")

    def __init__(self, ident: int, label: str, limit: float, now: float):
        self.ident = ident
        self.label = label
        self.limit = limit
        self.deadline = now + limit
        self.hit = False
        self.hit_at = 0.0


PAUSE = None  # on a thread's stack of timed attempts: a deeper call runs on it now


class Watch:
    """The managed attempts with a timeout running on a rank, for the timeout checks.
    Lock: the executor's.

    - Graph tasks (the executor's check, :func:`expire`): by worker, ``live`` (thread
      ident, start, limit) while an attempt with a policy runs, and ``hit``, the
      deadline of the grace of an attempt interrupted already.
    - Spawned and submitted calls (this module's watcher thread, :func:`watch_loop`):
      ``stacks``, by thread, the :class:`Timed` attempts running on it, innermost
      last, with a :data:`PAUSE` above each one while a deeper call (a waiting worker
      helps) runs on the same stack; ``heap`` of (deadline, seq, Timed) to look at.

    The rule: an interrupt is raised in a thread only for the innermost timed attempt
    on it, while nothing deeper runs there; a timed attempt whose thread runs a deeper
    call when its time is up is interrupted once that call has returned to it."""

    def __init__(self, nworkers: int):
        self.live: list[tuple[int, float, float] | None] = [None] * nworkers
        self.hit: dict[int, float] = {}
        self.stacks: dict[int, list[Timed | None]] = {}
        self.heap: list[tuple[float, int, Timed]] = []
        self.seq = itertools.count()
        self.armed = 0  # Timed attempts on the stacks
        self.kick = threading.Event()  # an earlier deadline came, or nothing is armed
        self.thread: threading.Thread | None = None

    def expire(self, worker: int, now: float, grace: float) -> bool:
        """The timeout check found ``worker``'s task past its limit: True if a managed
        attempt handles it (interrupted now, or within its grace still, or a deeper
        call runs on its thread: interrupted once that returns), False if the run must
        fail as for any task. Lock held."""
        live = self.live[worker]
        if live is None:
            return False
        ident, start, limit = live
        if worker in self.hit:
            return now < self.hit[worker]
        if now - start <= limit or self.stacks.get(ident):
            return True  # (a new attempt: its own clock; or a deeper call is running)
        self.hit[worker] = now + grace
        _raise_in(ident, AttemptTimeout)
        return True

    def timed_on(self, ident: int, worker: int) -> bool:
        """Whether a timed attempt runs on thread ``ident`` (worker ``worker``)."""
        return ident in self.stacks or (
            0 <= worker < len(self.live) and self.live[worker] is not None
        )

    def pause(self, ident: int, worker: int) -> None:
        """Thread ``ident`` (this one) is about to run a deeper call on its stack: no
        interrupt for the attempts below it until :meth:`resume`; one raised and not
        landed yet is withdrawn (it is raised again after). Lock held."""
        stack = self.stacks.setdefault(ident, [])
        top = stack[-1] if stack else None
        if top is not None and top.hit:
            _raise_in(ident, None)
            top.hit = False
            heapq.heappush(self.heap, (top.deadline, next(self.seq), top))
        elif not stack and 0 <= worker < len(self.live) and self.hit.pop(worker, 0.0):
            _raise_in(ident, None)
        stack.append(PAUSE)

    def resume(self, ident: int, worker: int, now: float, grace: float) -> bool:
        """The deeper call on thread ``ident`` (this one) returned; True if the timed
        attempt it returns to is past its time: the caller raises AttemptTimeout in it
        now (marked as interrupted, so that the watcher raises none too). Lock held."""
        stack = self.stacks[ident]
        stack.pop()
        if stack:
            top = stack[-1]
            if top is None or top.hit or now < top.deadline:
                return False
            top.hit, top.hit_at = True, now
            return True
        del self.stacks[ident]
        live = self.live[worker] if 0 <= worker < len(self.live) else None
        if live is None or worker in self.hit or now - live[1] <= live[2]:
            return False
        self.hit[worker] = now + grace
        return True

    def arm(self, entry: Timed) -> bool:
        """A timed attempt starts on its thread; True if the watcher thread must be
        started. Lock held."""
        self.stacks.setdefault(entry.ident, []).append(entry)
        self.armed += 1
        first = not self.heap or entry.deadline < self.heap[0][0]
        heapq.heappush(self.heap, (entry.deadline, next(self.seq), entry))
        if first:
            self.kick.set()
        return self.thread is None

    def disarm(self, entry: Timed) -> None:
        """The attempt ended: off its thread's stack (its heap entry is dropped when
        the watcher meets it); an interrupt raised and not landed is withdrawn. Lock
        held."""
        stack = self.stacks[entry.ident]
        stack.remove(entry)
        if not stack:
            del self.stacks[entry.ident]
        self.armed -= 1
        entry.ident = 0  # (no longer armed)
        if entry.hit:
            entry.hit = False
            _raise_in(threading.get_ident(), None)
        if not self.armed:
            self.heap.clear()
            self.kick.set()

    def stuck(self, ident: int, now: float, after: float) -> bool:
        """Whether the timed attempt on thread ``ident`` (one of its own: see
        :func:`_own_thread`) was interrupted over ``after`` seconds ago and is still in
        its call (nothing deeper runs there): a long C call, or code that caught the
        interrupt. Lock held."""
        stack = self.stacks.get(ident)
        top = stack[-1] if stack else None
        return top is not None and top.hit and now - top.hit_at > after

    def abandon(self, ident: int) -> None:
        """Thread ``ident``'s timed attempts are given up: off the watch (its
        interrupt, raised already, ends the call if it ever returns). Lock held."""
        for entry in self.stacks.pop(ident, ()):
            if entry is not None:
                entry.ident = 0
                self.armed -= 1
        if not self.armed:
            self.heap.clear()
            self.kick.set()

    def check(self, now: float, grace: float) -> float | None:
        """Interrupt the timed attempts past their deadline (see the class doc); the
        seconds until the next look, None when nothing is armed. Lock held."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if not entry.ident:
                continue
            if self.stacks[entry.ident][-1] is not entry:  # a deeper call runs: later
                heapq.heappush(heap, (now + WATCH_PAUSED, next(self.seq), entry))
                continue
            if not entry.hit:  # (else: raised as its deeper call returned)
                _raise_in(entry.ident, AttemptTimeout)
                entry.hit, entry.hit_at = True, now
            # (raised again after the grace if the call caught it and goes on)
            heapq.heappush(heap, (now + grace, next(self.seq), entry))
        if not self.armed:
            return None
        return max(0.0, heap[0][0] - now) if heap else WATCH_PAUSED


WATCH_PAUSED = 0.05  # seconds between looks at an attempt past its time under a deeper call


def expire(ex: Any, worker: int, now: float) -> bool:
    """:meth:`Watch.expire` for the executor ``ex`` (its timeout check)."""
    return ex.watch.expire(worker, now, ex.tuning.stop_grace)


def watch_loop(ex: Any) -> None:
    """The watcher thread of the timed spawned and submitted calls of ``ex``: it ends
    when none is armed, or the run stops."""
    w = ex.watch
    while True:
        with ex.lock:
            delay = w.check(time.perf_counter(), ex.tuning.stop_grace)
            if delay is None or ex.stopping:
                w.thread = None
                return
            w.kick.clear()
        w.kick.wait(delay)


def _arm(ex: Any, worker: int, limit: float) -> None:
    """A managed attempt with a timeout and a policy starts on ``worker`` (``limit``:
    inf where it runs on a thread of its own, which times it)."""
    with ex.lock:
        start = time.perf_counter()
        ex.started[worker] = start
        ex.watch.hit.pop(worker, None)
        ex.watch.live[worker] = (threading.get_ident(), start, limit)


def _disarm(ex: Any, worker: int) -> None:
    """The attempt ended: no interrupt comes after this; one already set and not yet
    raised is withdrawn (an interrupt may land in here too: then do it again). The
    task's clock starts afresh: the next attempt, or the policy, is not late."""
    while True:
        try:
            with ex.lock:
                ex.watch.live[worker] = None
                ex.started[worker] = time.perf_counter()
                if ex.watch.hit.pop(worker, None) is not None:
                    _raise_in(threading.get_ident(), None)
            return
        except AttemptTimeout:
            continue


def _arm_call(ex: Any, label: str, limit: float) -> Timed:
    """A timed attempt of a spawned or submitted call starts on this thread."""
    entry = Timed(threading.get_ident(), label, limit, time.perf_counter())
    with ex.lock:
        if ex.watch.arm(entry):
            th = threading.Thread(
                target=watch_loop, args=(ex,), name="taskgraph-timeouts", daemon=True
            )
            ex.watch.thread = th
            th.start()
    return entry


def _disarm_call(ex: Any, entry: Timed) -> None:
    """The timed attempt ``entry`` ended (as :func:`_disarm`)."""
    while True:
        try:
            with ex.lock:
                if entry.ident:
                    ex.watch.disarm(entry)
            return
        except AttemptTimeout:
            continue


def _timed(opts: TaskOptions) -> bool:
    """Whether a timeout of this call is one failed attempt (not the run's failure)."""
    return opts.timeout is not None and (opts.retries > 0 or opts.on_failure != FAIL)


# -- the attempt loop ------------------------------------------------------------------


def _stamps(ex: Any, worker: int, t0: float, t1: float) -> tuple:
    last = getattr(ex.launcher, "last", None)
    s = last(worker) if last is not None else None
    if s is None:
        return (t0, t0, t0, t1, 1)
    return (s.ready, s.launched, s.started, s.ended, s.cores)


def _row(ex: Any, worker: int, label: str, task: int, attempt: int, state: str, st: tuple):
    record = getattr(ex.trace, "attempt", None)
    if record is not None:
        record(worker, label, task, attempt, state, *st)


def _ended(ex: Any, worker: int, label: str, task: int, attempt: int, state: str, t0: float):
    """The trace row of an attempt that began at ``t0`` and ended now."""
    _row(ex, worker, label, task, attempt, state, _stamps(ex, worker, t0, time.perf_counter()))


# per thread: [fn, kwargs, given back] of the managed calls running on its stack,
# innermost last (given back: it waits, its resources are free meanwhile)
_held = threading.local()


def _launch(ex: Any, fn: Any, args, kwargs, label: str, worker: int) -> Any:
    """``ex.launcher.call``, known meanwhile to :func:`give_back`."""
    calls = _held.__dict__.setdefault("calls", [])
    calls.append([fn, kwargs, False])
    try:
        return ex.launcher.call(fn, args, kwargs, label, worker)
    finally:
        calls.pop()


def give_back() -> tuple[list, Any] | None:
    """(entry, need): the innermost managed call on this thread and the resources (a
    :class:`~taskgraph.run.resources.Need`) it holds, marked as given back, if it
    holds some and has not given them back yet; else None. The caller gives them
    back to the gate, and takes them again before it clears the mark (``entry[2]``)."""
    calls = getattr(_held, "calls", None)
    if not calls or calls[-1][2]:
        return None
    entry = calls[-1]
    need = call_need(entry[0], entry[1])
    if not (need.cores or need.memory or need.gpus):
        return None
    entry[2] = True
    return entry, need


def _attempt(ex: Any, worker: int, fn: Any, args, kwargs, label: str, opts: TaskOptions, task: int):
    """One attempt through the launcher; a timeout of it raises AttemptTimeout: a graph
    task's where it has a policy (the executor watches those), a spawned or submitted
    call's always (the watcher thread: :class:`Watch`). A timed Python function on a
    worker thread runs on a thread of its own (:func:`_own_thread`)."""
    graph = task >= 0 and worker >= 0 and _timed(opts)
    limit = opts.timeout
    if limit is None or (not graph and task >= 0):
        return _launch(ex, fn, args, kwargs, label, worker)
    if not opts.process and getattr(fn, "fn", fn) not in _EXES:  # (on a worker thread)
        if not graph:
            return _own_thread(ex, worker, label, limit, fn, args, kwargs)
        _arm(ex, worker, math.inf)  # (its own thread times it, not the executor's check)
        try:
            return _own_thread(ex, worker, label, limit, fn, args, kwargs)
        finally:
            _disarm(ex, worker)
    if not graph:
        return _attempt_call(ex, worker, fn, args, kwargs, label, limit)
    _arm(ex, worker, limit)
    try:
        try:
            return _launch(ex, fn, args, kwargs, label, worker)
        finally:
            _disarm(ex, worker)
    except AttemptTimeout:
        raise AttemptTimeout(f"attempt timed out after {limit:g} s") from None


def _attempt_call(ex: Any, worker: int, fn: Any, args, kwargs, label: str, limit: float):
    """One attempt of a spawned or submitted call with a timeout."""
    entry = _arm_call(ex, label, limit)
    try:
        try:
            return _launch(ex, fn, args, kwargs, label, worker)
        finally:
            _disarm_call(ex, entry)
    except AttemptTimeout:
        net = ex.net
        raise AttemptTimeout(
            f"{label} timed out after {limit:g} s on rank {net.rank}/{net.size}"
        ) from None


def _own_thread(ex: Any, worker: int, label: str, limit: float, fn: Any, args, kwargs):
    """:func:`_attempt_call` on a thread of its own, this one waiting for it: where the
    interrupt cannot end the call (one long C call such as ``time.sleep``, or code that
    catches it) ``ABANDON`` seconds after it was raised, that thread is abandoned (a
    daemon; the interrupt ends it if the call ever returns, and its resources go back
    then) and this attempt fails with AttemptTimeout: the policy goes on at once."""
    out: list = []
    done = threading.Event()
    ctx = dynamic_context()

    def body() -> None:
        try:
            enter_context(ctx)
            try:
                out.append((True, _attempt_call(ex, worker, fn, args, kwargs, label, limit)))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                out.append((False, exc))
            done.set()
        except BaseException:  # noqa: BLE001 - an interrupt landing after its end
            done.set()

    th = threading.Thread(target=body, name=f"taskgraph-attempt {label}"[:60], daemon=True)
    th.start()
    ident = th.ident or 0
    try:
        if not done.wait(limit):
            while not done.wait(WATCH_PAUSED):
                with ex.lock:
                    if ex.watch.stuck(ident, time.perf_counter(), ABANDON):
                        ex.watch.abandon(ident)
                        break
    except BaseException as exc:  # (the run stops: this worker is interrupted)
        _raise_in(ident, type(exc))
        raise
    if not out:
        ex.launcher.abandoned(worker, ident)
        net = ex.net
        raise AttemptTimeout(
            f"{label} timed out after {limit:g} s on rank {net.rank}/{net.size} (stuck in "
            f"a call the interrupt cannot end: its thread was abandoned)"
        )
    ok, value = out[0]
    if ok:
        return value
    raise value


def run_call(
    ex: Any,
    worker: int,
    label: str,
    fn: Any,
    args: tuple | list,
    kwargs: dict,
    opts: TaskOptions,
    task: int = -1,
) -> Any:
    """Run one managed call (see the module doc) on this thread for ``worker``; its
    value: the function's, a :class:`Skipped`, or the exception (``"ignore"``).
    Raises the last attempt's exception under ``"fail"``. ``task``: the graph task's
    id, -1 for a spawned or submitted call."""
    tally, net = ex.tally, ex.net
    skipped = skipped_input(args, kwargs)
    if skipped is not None:
        tally.skipped.append(label)
        _row(ex, worker, label, task, 0, SKIPPED_ROW, (None, None, None, None, opts.slots))
        return Skipped(label, skipped.origin, skipped.rank, skipped.size, skipped.error)
    ck = ex.checkpoint
    key = ck.key(fn, args, kwargs) if ck is not None else None
    if key is not None:
        found, value = ck.load(key)
        if found:
            tally.hits += 1
            tally.ok += 1
            now = time.perf_counter()
            _row(ex, worker, label, task, 0, CHECKPOINT_ROW, (now, None, None, now, opts.slots))
            return value
    attempt = 1
    while True:
        t0 = time.perf_counter()
        try:
            value = _attempt(ex, worker, fn, args, kwargs, label, opts, task)
        except BaseException as exc:  # (the policy decides)
            verdict = decide(opts, attempt, exc)
            state = RETRIED_ROW if verdict == RETRY else FAILED_ROW
            _ended(ex, worker, label, task, attempt, state, t0)
            if verdict == RETRY:
                tally.retries += 1
                attempt += 1
                continue
            error = f"{type(exc).__name__}: {exc}"
            tally.failed.append((label, net.rank, row_error(exc)))
            if verdict == SKIP:
                return Skipped(label, label, net.rank, net.size, error)
            if verdict == IGNORE:
                return ignored(exc, label, net)
            if attempt > 1:
                exc.add_note(f"(the last of {attempt} attempts of {label})")
            raise
        _ended(ex, worker, label, task, attempt, DONE_ROW, t0)
        tally.ok += 1
        if key is not None:
            ck.store(key, value, label)
        return value


# -- the executor's hooks -------------------------------------------------------------


def fn_options(fn: Any, run_options: Any) -> TaskOptions:
    """The effective options of a call of ``fn`` (a TaskFunction, a packed call of one,
    or a plain callable) in a run with ``run_options``."""
    return effective(options_of(getattr(fn, "task_fn", fn)), run_options)


def install(ex: Any) -> None:
    """Give the executor ``ex`` its tally, checkpoint and watch, and route its graph's
    ``@tg.task`` calls through :func:`run_call` where any is managed (the plain path is
    left exactly as it is otherwise). Called at the end of the executor's constructor."""
    ex.tally = Tally()
    ex.watch = Watch(ex.nworkers)
    ex.checkpoint = Checkpoint(ex.options.checkpoint) if ex.options.checkpoint else None
    ex.summary = None
    tasks = ex.graph.tasks
    fns = {tasks[t].fn for t in ex.plan.tasks if not hasattr(tasks[t].fn, "modes")}
    opts = {fn: fn_options(fn, ex.options) for fn in fns}
    if not ex.options.active and all(o == DEFAULT for o in opts.values()):
        return
    ex.managed = opts
    managed = {t for t in ex.plan.tasks if tasks[t].fn in opts and t not in ex.plan.foreign}
    ex._not_direct = ex._not_direct | managed  # (run only by a worker: through the loop)
    base = ex._call

    def call(t: int) -> Any:
        return call_static(ex, t, base)

    ex._call = call


def call_static(ex: Any, t: int, base: Any) -> Any:
    """Graph task ``t`` on a worker of ``ex``: a managed call, or ``base(t)`` (the plain
    path) for a kernel, or a task that writes other ranks' data."""
    task = ex.graph.tasks[t]
    opts = ex.managed.get(task.fn)
    if opts is None or t in ex.plan.foreign:
        return base(t)
    fetch, reads = ex._fetch, task.reads
    args = [fetch(a.data, reads) if a.__class__ is Ref else a for a in task.args]
    kwargs = {
        k: fetch(v.data, reads) if v.__class__ is Ref else v for k, v in (task.kwargs or {}).items()
    }
    worker = ex.current.index(t) if t in ex.current else -1
    value = run_call(ex, worker, ex.graph.label(t), task.fn, args, kwargs, opts, t)
    ex.tally.static += 1
    return value


def spawned_options(ex: Any, fn: Any) -> TaskOptions | None:
    """The options of a spawned or submitted call of ``fn`` if it is managed, else
    None (the plain path)."""
    if not ex.options.active and getattr(fn, "options", DEFAULT) is DEFAULT:
        return None
    return fn_options(fn, ex.options)


def spawn_fn(fn: Any) -> Any:
    """What a spawned call keeps as its function: the plain function, unless ``fn`` is
    a ``@tg.task`` function with options of its own (they travel with it)."""
    inner = getattr(fn, "fn", fn)
    return fn if inner is not fn and options_of(fn) != DEFAULT else inner


def conclude(ex: Any, parts: list[dict] | None, ended_well: bool) -> None:
    """Set ``ex.summary`` from every rank's tally (``parts``; None: this rank alone);
    ``ended_well``: the run did not fail."""
    if parts is None:
        parts = [wire(ex)]
    ex.summary = Summary.merge(ex.graph.name, parts)
    ex.summary.ended_well = ended_well


def wire(ex: Any) -> dict:
    """This rank's tally as plain data, with the run's own failure if it is this rank's."""
    tally = getattr(ex, "tally", None) or Tally()
    internal = getattr(ex.graph, "internal", False)  # (a run of submitted calls' start)
    out = tally.to_wire(0 if internal else ex.sched.done)
    f = ex.failure
    if f is not None and f.origin and f.task is not None:
        if not any(label == f.task for label, _, _ in out["failed"]):
            out["failed"].append((f.task, f.rank, f.error))
    return out


def say_summary(summary: Summary | None, rank: int) -> None:
    """In a script (not in IPython), print ``summary`` on rank 0 if anything failed,
    was skipped or retried."""
    if summary is None or not summary.notable or rank != 0:
        return
    if "IPython" in sys.modules and getattr(sys.modules["IPython"], "get_ipython", lambda: None)():
        return
    # one write, on stdout with the script's own output: other ranks' lines cannot cut in
    sys.stdout.write(f"{summary}\n")
    sys.stdout.flush()


__all__ = [
    "AttemptTimeout",
    "Skipped",
    "Summary",
    "Tally",
    "TaskSkipped",
    "decide",
]


def row_error(exc: BaseException) -> str:
    """``exc`` as a summary row shows it: ``Type: text``, without the traceback that a
    failed child's error carries in its text (a summary row is one line)."""
    text = BaseException.__str__(exc) if isinstance(exc, TaskError) else str(exc)
    return f"{type(exc).__name__}: {text}"


def count_plain(tally: Tally, item: Any, exc: BaseException | None, net: Any) -> None:
    """A spawned or submitted call on the plain path ended (``exc``: how it failed)."""
    if exc is None:
        tally.ok += 1
    else:
        tally.failed.append((item.label(), net.rank, row_error(exc)))
