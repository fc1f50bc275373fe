"""Spawned tasks: tasks that a running task starts, and waits for, within its run.

Inside a running task, :func:`spawn` puts a call into the rank's pool of spawned work
and returns a :class:`SpawnFuture` at once; :meth:`SpawnFuture.result` (or :func:`wait`)
waits for it. The running task is found through a thread-local context that each
worker thread of an :class:`~taskgraph.run.executor.Executor` sets when it starts::

    static task (a frame, depth 0) ── spawn ──► pool (one deque per rank, under the lock)
         │                                        newest ──► a waiting worker (helping)
         └── result(): while the child is not      oldest ──► an idle worker (or a thief:
             done, run pool work deeper than           the oldest is nearest the root)
             this frame, on this stack; none:
             wait on ``spawn_cv``

- **Helping, bounded.** A waiting worker runs only work deeper than the task it waits
  in, so the frames nested on its stack never outnumber the depth of the recursion;
  and the call it waits for, if that is in the pool however deep (a sibling's future
  reached through a closure: else a rank of one worker would wait for ever). A wait
  with a timeout runs them on a thread of their own instead, one at a time, and ends
  at its time (:class:`Until`).
  Every :func:`nest_segment` nested waits (~66) the next goes on on a new thread's
  stack while this one blocks (one thread works for the worker at a time; the
  interpreter's recursion limit counts a thread's frames): NEST_LIMIT deep in all.
  It never deadlocks: the deepest waiter of any chain
  waits for a child that is either running or in the pool and deeper than itself.
  With nothing deeper (its call was stolen), a shallow waiter runs a ready static
  task on its stack, once (a static task reads only what has been written: it never
  waits on the task below it; :meth:`~taskgraph.run.workers.WorkerLoop.run_static_nested`).
- **Idle workers** take the oldest spawned work, only when no static task is ready
  (the worker loop looks at the pool just before it would sleep).
- **Implicit join.** A task's children all end before it counts as done; a child's
  exception that its parent never asked for (``result()``) fails the parent then.
  A task that fails drops its children still in the pool (never asked for) and
  :func:`wait` raises as soon as one of its calls fails, so an uncaught error climbs
  the tree at once, not after every call before it in the tree has run; a waiter
  buried under calls its worker took meanwhile has them unwound (taskgraph.run.unwind).
- **Errors.** ``result()`` of a failed child raises :class:`SpawnedTaskError` (a
  :class:`~taskgraph.core.errors.TaskError` naming the child, its rank and its
  traceback), caused by the child's own exception and an instance of its class too;
  the parent may catch it as either.

Future states: ``PENDING`` (in the pool) -> ``RUNNING`` -> ``DONE`` or ``FAILED``.
"""

from __future__ import annotations

import pickle
import re
import reprlib
import sys
import textwrap
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..core import pickling
from ..core.errors import RemoteTraceback, RunError, TaskError, refuse_async
from ..dsl.nested import readonly_view
from ..dsl.options import DEFAULT as DEFAULT_OPTIONS
from ..trace.recorder import TASK_DONE, TASK_FAILED
from . import attempts, context, unwind
from .context import TaskAbandoned
from .context import tls as _tls
from .unwind import Unwind

PENDING, RUNNING, DONE, FAILED = range(4)

# spawned calls nested on one worker at most: deeper, the waiting call fails with a
# clear error (each NEST_SEGMENT of them on a thread of their own: see _wait_nested)
NEST_LIMIT = 5000
# threads running calls that timed waits handed over, at most, on a rank (a chain of
# timed waits would take one a level): past it, a timed wait runs them on its stack
HANDED_LIMIT = 256


def nest_segment() -> int:
    """Waits nested on one thread's stack before the next goes on a new thread's: each
    takes ~6 of the interpreter's frames (1000 by default), the calls' own come on top.
    A raised limit is not trusted: a library may raise it only for a while (jedi does)."""
    return max(8, (min(sys.getrecursionlimit(), 1000) - 200) // 12)


_short = reprlib.Repr()
_short.maxstring = 20
_short.maxother = 20
_short.maxlist = _short.maxtuple = 4


def call_label(fn: Callable, args: tuple, kwargs: dict) -> str:
    """A readable name of the call ``fn(*args, **kwargs)``: ``fib(19)`` (long
    arguments cut short)."""
    name = getattr(getattr(fn, "fn", fn), "__name__", None) or repr(fn)
    parts: Iterable[str] = map(_brief, args)
    if kwargs:
        parts = [*parts, *(f"{k}={_brief(v)}" for k, v in kwargs.items())]
    return f"{name}({', '.join(parts)})"


_NUMBERS = frozenset({int, float, bool, type(None)})
_all_numbers = _NUMBERS.issuperset


def _brief(a: Any) -> str:
    """``a`` as reprlib's short form shows it; numbers and small tuples of them without
    reprlib, which took a third of a spawn's time (every spawned call is named)."""
    c = a.__class__
    if c in _NUMBERS:
        text = repr(a)
        if len(text) <= _short.maxother:
            return text
    elif c is tuple and 1 < len(a) <= _short.maxtuple and _all_numbers(map(type, a)):
        text = repr(a)  # (its parts, split at ", ", as long as reprlib keeps them whole)
        most = _short.maxother
        if len(text) <= most + 2 or max(map(len, text[1:-1].split(", "))) <= most:
            return text
    return _short.repr(a)


class SpawnedTaskError(TaskError):
    """A spawned task failed: raised by ``result()`` in the task that waits for it.

    As :class:`~taskgraph.core.errors.TaskError` (``task``, ``rank``, ``size``,
    ``host``, ``error``, ``traceback``); the message carries the traceback too.
    ``original``: the call's own exception (of a chain of failed calls, the deepest
    one's), rebuilt from its pickle where it came from another rank (None if it could
    not be); ``__cause__`` is the exception the call raised (from another rank, the
    original, caused by a RemoteTraceback). Where the two classes combine, the error
    is an instance of the original's class too (``SpawnedTaskError(ZeroDivisionError)``,
    with the original's attributes), so ``except ZeroDivisionError`` catches it on every
    rank count, as with Ray and Dask."""

    original: BaseException | None = None

    def __reduce__(self):
        args = (self.task, self.rank, self.size, self.host, self.error, self.traceback)
        return (_rebuild, (*args, dump_original(self.original)))

    def __str__(self) -> str:
        text = BaseException.__str__(self)  # (not the original class's: KeyError quotes)
        if not self.traceback:
            return text
        return f"{text}\n{textwrap.indent(self.traceback.rstrip(), '  | ')}"


def spawned_error(failure: tuple, original: Any = None) -> SpawnedTaskError:
    """The error of a call that failed as ``failure`` (a SpawnedTaskError's arguments),
    of the class that is also ``original``'s (an exception, or only its class), with
    the original's attributes; a plain SpawnedTaskError where they do not combine."""
    err: SpawnedTaskError | None = None
    if original is not None:
        kind = original if isinstance(original, type) else type(original)
        try:
            err = _kind(kind)(*failure[:6])
        except Exception:  # noqa: BLE001 - an exotic class: the plain error still names it
            pass
    if err is None:
        err = SpawnedTaskError(*failure[:6])
    if isinstance(original, BaseException):
        err.original = original
        mine = err.__dict__
        for k, v in getattr(original, "__dict__", {}).items():
            mine.setdefault(k, v)  # (its own fields: ``e.code``; ours win a clash)
        if isinstance(original, OSError) and isinstance(err, OSError):  # (C fields)
            err.errno, err.strerror = original.errno, original.strerror
            err.filename, err.filename2 = original.filename, original.filename2
    return err


_KINDS: dict[type, type] = {}
# never combined: a StopIteration would end a loop over results without an error, and
# a RunError would be taken for the waiter's run stopping
_PLAIN_KINDS = (TaskError, RunError, StopIteration, StopAsyncIteration)


def _kind(cls: type) -> type:
    """The SpawnedTaskError class that is also a ``cls`` (made once per class)."""
    if not issubclass(cls, Exception) or issubclass(cls, _PLAIN_KINDS):
        return SpawnedTaskError
    if issubclass(cls, attempts.AttemptTimeout):  # (the parent's would be taken for its own)
        cls = TimeoutError
    kind = _KINDS.get(cls)
    if kind is None:
        try:
            name = f"SpawnedTaskError({cls.__name__})"
            kind = type(name, (SpawnedTaskError, cls), {"__module__": __name__})
        except TypeError:  # (C layouts that do not combine)
            kind = SpawnedTaskError
        _KINDS[cls] = kind
    return kind


def _run_error_at_root(exc: BaseException | None, failure: tuple) -> bool:
    """Whether a call that failed with ``exc`` (here) or ``failure`` (another rank's)
    failed by a RunError at the bottom of its chain."""
    if exc is not None:
        return isinstance(root_cause(exc), RunError)
    return str(failure[4]).startswith("RunError")


def root_cause(exc: BaseException) -> Any:
    """The exception at the bottom of a chain of failed spawned calls (or only its
    class, where the instance could not be rebuilt here)."""
    if not isinstance(exc, SpawnedTaskError):
        return exc
    if exc.original is not None:
        return exc.original
    kind = type(exc)
    return next((b for b in kind.__bases__ if b is not SpawnedTaskError), None)


def dump_original(original: Any) -> bytes | None:
    """An exception (or its class) pickled to travel to another rank, by cloudpickle (a
    script's own class comes back as itself): the instance (as :class:`_Remade`
    where its plain pickle does not load: its class takes other arguments than its
    ``args``) and, apart, its class."""
    if original is None:
        return None
    kind = original if isinstance(original, type) else type(original)
    parts: list[bytes | None] = []
    for obj in (original, kind):
        try:
            parts.append(pickling.dumps(obj))
        except Exception:  # noqa: BLE001 - an unpicklable argument: the class alone
            parts.append(None)
    if parts[0] is not None and not isinstance(original, type):
        try:
            pickle.loads(parts[0])
        except Exception:  # noqa: BLE001 - its __init__ takes other arguments
            try:
                parts[0] = pickling.dumps(_Remade(original))
            except Exception:  # noqa: BLE001 - the class alone, then
                parts[0] = None
    return pickle.dumps(tuple(parts))


class _Remade:
    """An exception pickled to be rebuilt without its ``__init__`` (one that takes
    other arguments than its ``args``, ``MyError(code, detail)``): its class, ``args``
    and attributes, so ``e.code`` reads the same on the rank that catches it."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __reduce__(self):
        exc = self.exc
        state = dict(getattr(exc, "__dict__", {}))
        if isinstance(exc, OSError):  # (C fields, not in its __dict__; None: never set)
            for k in ("errno", "strerror", "filename", "filename2"):
                if getattr(exc, k) is not None:
                    state[k] = getattr(exc, k)
        return (_remake, (type(exc), exc.args, state))


def _remake(kind: type[BaseException], args: tuple, state: dict) -> BaseException:
    exc = kind.__new__(kind, *args)
    if not isinstance(exc, kind):
        raise TypeError(f"{kind.__name__}.__new__ made a {type(exc).__name__}")
    exc.args = args
    for k, v in state.items():
        setattr(exc, k, v)
    return exc


def load_original(blob: bytes | None) -> Any:
    """What :func:`dump_original` made: the exception, else its class, else None."""
    if blob is None:
        return None
    try:
        parts = pickle.loads(blob)
    except Exception:  # noqa: BLE001 - not ours: nothing to rebuild
        return None
    for part in parts:
        if part is None:
            continue
        try:
            return pickle.loads(part)
        except Exception:  # noqa: BLE001 - its class takes other arguments, or is unknown
            continue
    return None


def _rebuild(task, rank, size, host, error, tb, blob) -> SpawnedTaskError:
    return spawned_error((task, rank, size, host, error, tb), load_original(blob))


class Frame:
    """A task running on a worker's stack that spawns: its ``name`` (label), its
    ``depth`` (a static task is 0, a child one more than its parent), the
    ``children`` it spawned and has not joined yet, and for taskgraph.run.unwind: the
    calls it ``awaits`` in its last wait (whose end ends it), whether it is
    ``unwinding`` and whether it has ``unwound`` (raised Unwind); ``handed``: [True]
    while a call its timed waits handed to a thread runs (see SpawnRunner._hand_over)."""

    __slots__ = ("awaits", "children", "depth", "handed", "name", "unwinding", "unwound")

    def __init__(self, name: str, depth: int):
        self.name = name
        self.depth = depth
        self.children: list[SpawnFuture] = []
        self.awaits: Sequence[SpawnFuture] = ()
        self.handed: list | None = None
        self.unwinding = False
        self.unwound = False

    def label(self) -> str:
        """A readable name of the task."""
        return self.name


class SpawnFuture(Frame):
    """The future of a spawned call ``fn(*args, **kwargs)``, made by :func:`spawn` in
    the executor ``owner``, ``depth`` calls below the static task it descends from.

    Fields guarded by the executor's lock: ``state`` (PENDING, RUNNING, DONE, FAILED),
    ``value``, ``exc`` (the exception, where it ran here), ``failure`` (the error as
    (task, rank, size, host, error, traceback)), ``observed`` (its error was raised
    to a waiter already), ``watch`` (None, or the queues of the
    :func:`~taskgraph.cluster.submit.as_completed` calls waiting for it: it is put on
    each as it ends); ``parent``: the frame that spawned it (None: submitted, or
    stolen from another rank); ``pinned``, ``remote`` and ``slot``: see
    taskgraph.run.steal."""

    __slots__ = (
        "args",
        "exc",
        "failure",
        "fn",
        "kwargs",
        "observed",
        "owner",
        "parent",
        "pinned",
        "remote",
        "slot",
        "state",
        "stopped",
        "submitted",
        "value",
        "watch",
    )

    def __init__(
        self,
        owner: Any,
        fn: Callable,
        args: tuple,
        kwargs: dict,
        depth: int,
        parent: Frame | None = None,
    ):
        super().__init__("", depth)
        self.owner = owner
        self.parent = parent
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.state = PENDING
        self.value: Any = None
        self.exc: BaseException | None = None
        self.failure: tuple | None = None
        self.observed = False
        self.stopped = False  # it failed by its run's stop: see stopped_under
        self.pinned = False  # it cannot be pickled: never stolen
        self.remote: tuple[int, int] | None = None  # stolen from (rank, key): result goes there
        self.submitted = False  # from outside the run's tasks (Executor.submit): no parent
        self.slot = -1  # its slot on the rank's board (taskgraph.run.board); -2: too large
        self.watch: list[deque] | None = None

    def put_on_end(self, queue: deque) -> bool:
        """Have this call put on ``queue`` as it ends: True, or False if it has ended."""
        with self.owner.lock:
            if self.state >= DONE:
                return False
            self.watch = [*(self.watch or ()), queue]
            return True

    def forget(self, queue: deque) -> None:
        """Put it on ``queue`` no more, if the run's lock is free now (a collector may
        finalize the waiter on a thread that holds it: then the queue stays, unread)."""
        lock = self.owner.lock
        if lock.acquire(blocking=False):
            try:
                self.watch = [q for q in self.watch or () if q is not queue] or None
            finally:
                lock.release()

    def ended(self) -> None:
        """It has ended: onto each queue that watches it. Lock held."""
        for queue in self.watch or ():
            queue.append(self)

    def label(self) -> str:
        """A readable name of the call: ``fib(19)``."""
        if not self.name:
            self.name = call_label(self.fn, self.args, self.kwargs)
        return self.name

    def done(self) -> bool:
        """Whether the call has ended (well or not), or never will: its run stopped
        first (``result()`` then raises RunError; ``tg.as_completed`` yields it)."""
        return self.state >= DONE or self.owner.stopping

    def result(self, timeout: float | None = None) -> Any:
        """The call's value, once it ended. Inside a task, the worker runs other
        spawned work meanwhile; raises :class:`SpawnedTaskError` if the call
        raised, RunError if the run stops first, and TimeoutError if it has not
        ended after ``timeout`` seconds (the call goes on). A wait with a timeout runs
        the calls it helps with (this one too) on a thread of their own, one at a
        time, so that it ends at its time."""
        if self.state < DONE:
            if timeout is None:
                refuse_own_wait(self)
            self.owner.wait_for(self, past(timeout))
            if self.state < DONE:
                raise TimeoutError(f"{self.label()} has not ended after {timeout} s")
        if self.state == FAILED:
            self.observed = True
            if self.exc.__class__ is Unwind:  # (dropped: its waiter unwinds, see _unwound)
                ctx = getattr(_tls, "ctx", None)
                if ctx is not None and ctx[2]:
                    raise unwind_now(ctx[2][-1])
                raise Unwind(f"{self.label()} was dropped")
            if self.stopped_under():
                net = self.owner.net
                raise RunError(
                    f"run {self.owner.graph.name!r} stopped on rank {net.rank}/{net.size} "
                    f"while {self.label()} ran"
                ) from self.error()
            raise self.error()
        if self.value.__class__ is attempts.Skipped:  # (on_failure="skip")
            raise self.value.exception(self.owner.net.host)
        return self.value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error once it ended (the :class:`SpawnedTaskError` that
        ``result()`` raises, a skipped call's TaskSkipped, or the RunError of a run that
        stopped first, as the notebook's futures give), None if it ended well; waits as
        ``result()`` does: TimeoutError after ``timeout`` seconds (as
        ``concurrent.futures`` and Dask futures do)."""
        try:
            if self.state < DONE:
                self.owner.wait_for(self, past(timeout))
                if self.state < DONE:
                    raise TimeoutError(f"{self.label()} has not ended after {timeout} s")
            self.result()
        except (TaskError, RunError) as exc:  # (an Unwind goes on up)
            return exc
        return None

    def stopped_under(self) -> bool:
        """Whether the call failed because its run stopped under it: a wait in it (or in
        a call below it) raised the run's RunError, as the run was stopping when it
        failed (:meth:`SpawnRunner.settle`). Its future then gives that, not a
        SpawnedTaskError a ``except tg.RunError`` misses (one call a cancel, a trial);
        a call's own RunError in a run going on stays its failure."""
        return self.state == FAILED and self.stopped

    def error(self) -> SpawnedTaskError:
        """The error to raise for a failed call, caused by its exception (see
        :class:`SpawnedTaskError`)."""
        failure = self.failure
        assert failure is not None
        if self.exc is not None:
            err = spawned_error(failure, root_cause(self.exc))
            err.__cause__ = self.exc
            return err
        original = load_original(failure[6]) if len(failure) > 6 else None
        err = spawned_error(failure, original)
        remote = RemoteTraceback(failure[5])
        if isinstance(original, BaseException):
            original.__cause__ = remote
            err.__cause__ = original
        else:
            err.__cause__ = remote
        return err

    def __repr__(self) -> str:
        state = ("pending", "running", "done", "failed")[self.state]
        return f"<spawned {self.label()} {state}>"

    def __reduce__(self):
        raise self.cannot_leave()

    def cannot_leave(self) -> TypeError:
        """The error of this future as a task's value or another rank's argument."""
        return TypeError(
            f"the future of {self.label()} cannot leave this rank (a task's value, an "
            "argument): it lives in the run that spawned it; return or pass its "
            "result() instead"
        )


def refuse_future(value: Any) -> None:
    """TypeError if a task's ``value`` is a spawned call's future: on one rank as on
    several, where it cannot be pickled."""
    if value.__class__ is SpawnFuture:
        raise value.cannot_leave()


def _failure(item: SpawnFuture, exc: BaseException, net: Any) -> tuple:
    """How ``item`` failed with ``exc``, as a SpawnedTaskError's arguments: the
    traceback is the call's own, or, when a child's error went through, the failed
    descendant's. A RecursionError that the formatting meets (the stack is nearly
    full) leaves the type alone."""
    try:
        if isinstance(exc, SpawnedTaskError):  # a child's: its text, without the traceback
            error, text = _elide(f"SpawnedTaskError: {TaskError.__str__(exc)}"), exc.traceback
        elif isinstance(exc, (TaskAbandoned, Unwind)):  # (one exception up every level:
            error, text = f"{type(exc).__name__}: {exc}", ""  # its traceback grows each)
        else:  # (nor a cause's: each level would hold every level below it, twice)
            error = f"{type(exc).__name__}: {exc}"
            text = "".join(traceback.format_exception(exc, chain=False))
        label = item.label()
    except RecursionError:
        error, text = type(exc).__name__, ""
        label = item.name or getattr(item.fn, "__name__", "a spawned call")
    return (label, net.rank, net.size, net.host, error, text)


CHAIN = " failed: SpawnedTaskError: task "  # where one level's error names the next
KEEP = 2  # levels of a chain of failed calls named at each end; the middle is counted
MIDDLE = re.compile(r"\.\.\. \((\d+) more spawned calls failed in turn\) \.\.\.")


def _elide(error: str) -> str:
    """A failed call's error naming a chain of failed descendants, with only the first
    and last ``KEEP`` levels named (a failure 150 calls deep read 9 KB otherwise)."""
    parts = error.split(CHAIN)
    if len(parts) <= 2 * KEEP + 1:
        return error
    # (each level elides its child's text: a level already elided counts what it left out)
    skipped = sum(int(m[1]) if (m := MIDDLE.fullmatch(p)) else 1 for p in parts[KEEP:-KEEP])
    middle = f"... ({skipped} more spawned calls failed in turn) ..."
    return CHAIN.join([*parts[:KEEP], middle, *parts[-KEEP:]])


def _context(what: str) -> tuple:
    ctx = getattr(_tls, "ctx", None)
    if ctx is None and context.in_pool_process:
        raise RuntimeError(
            f"{what} does not work in a process=True task: it runs in a process of its "
            "own, outside the run's workers; spawn from a task without process=True "
            "(the calls it spawns may take process=True)"
        )
    if ctx is None:
        raise RuntimeError(
            f"{what} works inside a running task only, on the task's own thread (not on "
            "a thread the task starts); outside one, build a graph (with tg.Graph() as "
            "g: ...) and run it"
        )
    return ctx


def refuse_own_wait(fut: SpawnFuture) -> None:
    """RuntimeError if this thread runs ``fut`` or a call it spawned, at any depth (on
    any worker of this rank): an untimed wait for it would never end (it hung, using no
    CPU, a trial). Timed waits end at their time, and ``as_completed`` may yield others."""
    if fut.state != RUNNING:
        return
    ctx = getattr(_tls, "ctx", None)
    if ctx is None or ctx[0] is not fut.owner or not ctx[2]:
        return
    frame: Frame | None = ctx[2][-1]
    while frame is not None:
        if frame is fut:
            raise RuntimeError(
                f"{running_here(fut.owner)} waits for {fut.label()}, which it runs inside "
                "(its own future, or a caller's): it would wait for ever"
            )
        frame = getattr(frame, "parent", None)  # (a static task's frame has none)


def running_here(ex: Any) -> str | None:
    """ "task T on rank r/s" if this thread runs a task (or spawned call) of the
    executor ``ex``; None otherwise."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None or ctx[0] is not ex:
        return None
    _, index, frames = ctx
    tid = ex.current[index]
    label = frames[-1].label() if frames else ex.graph.label(tid) if tid >= 0 else "?"
    return f"task {label} on rank {ex.net.rank}/{ex.net.size}"


_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


def plain(args: tuple, kwargs: dict) -> bool:
    """Whether every argument is a number, a string or a tuple of them (so no future:
    :func:`check_values` need look no further)."""
    if kwargs:
        return False
    for a in args:
        c = a.__class__
        if c not in _PLAIN and (c is not tuple or any(x.__class__ not in _PLAIN for x in a)):
            return False
    return True


def _is_future(x: Any) -> bool:
    return callable(getattr(x, "result", None)) and callable(getattr(x, "done", None))


def check_values(fn: Any, args: tuple, kwargs: dict, what: str) -> None:
    """TypeError naming the call if an argument (or an item of a list, tuple, set or
    dict value among them) is a future: calls made while a run goes take values (a
    future is a dependency only in a graph)."""
    if plain(args, kwargs):
        return  # (the common spawn: numbers, strings, tuples; this is on every tg.spawn)
    items = [*args, *kwargs.values()]
    for a in list(items):
        if isinstance(a, list | tuple | set | frozenset):
            items.extend(a)
        elif isinstance(a, dict):
            items.extend(a.values())
    if any(_is_future(a) for a in items):
        raise TypeError(
            f"{what}({call_label(fn, args, kwargs)}): an argument is a future; pass its "
            "value (fut.result(), or submit from tg.as_completed as futures end), or "
            "spawn the follow-up inside the call that makes the value"
        )


def read_only(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with each NumPy array among them a read-only view of it: a
    call that runs here shares its caller's arrays, one that another rank stole gets
    copies, so writing into one must fail on both (as a graph task's does)."""
    if not _has_arrays(args, kwargs):
        return args, kwargs
    views: dict[int, Any] = {}  # (one view per array: an array given twice stays one)
    return tuple(_view(a, views) for a in args), {k: _view(v, views) for k, v in kwargs.items()}


def _has_arrays(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, np.ndarray) for a in (*args, *kwargs.values()))


def _view(a: Any, views: dict[int, Any]) -> Any:
    if not isinstance(a, np.ndarray) or not a.flags.writeable:
        return a
    if id(a) not in views:
        views[id(a)] = readonly_view(a)
    return views[id(a)]


WROTE = "assignment destination is read-only"  # NumPy's words for a write into one


def _wrote_into(exc: BaseException, item: SpawnFuture) -> bool:
    """Whether ``exc`` is NumPy's refusal to write into a read-only array, in a call
    given one (see :func:`read_only`)."""
    try:
        if not isinstance(exc, ValueError) or isinstance(exc, TaskError) or WROTE not in str(exc):
            return False  # (a child's rewritten error names the child: not this call)
    except Exception:  # noqa: BLE001 - an exception whose text cannot be made
        return False
    return _has_arrays(item.args, item.kwargs)


def spawn(fn: Callable, /, *args: Any, **kwargs: Any) -> SpawnFuture:
    """Start ``fn(*args, **kwargs)`` as a task of this run; its future, at once.

    Call it inside a running task (a ``@tg.task`` function or a kernel). ``fn``: a
    ``@tg.task`` function or any callable (not ``async def``); ``args``, ``kwargs``: its
    arguments, read where the call runs (on another rank: copies made as it left,
    soon after this spawn; here: the objects themselves, so do not change one after
    spawning it). A NumPy array among them arrives as a read-only view, so a call that
    writes into it fails alike on every rank count. Wait with ``fut.result()`` or
    :func:`wait`; the calling task counts as done only once every call it spawned has
    ended. A call may run again from its start (it was interrupted so that a task it
    lay above could see a failure at once, and is still wanted): keep side effects
    that must not repeat out of spawned calls. RuntimeError outside a running task."""
    ex, index, frames = _context("tg.spawn")
    refuse_async(fn, "tg.spawn:")
    if not plain(args, kwargs):
        check_values(fn, args, kwargs, "tg.spawn")
        args, kwargs = read_only(args, kwargs)
    if not frames:  # the first spawn of the static task this worker runs
        frames.append(Frame(ex.graph.label(ex.current[index]), 0))
    elif frames[-1].unwinding:  # (a call it waits in failed: see taskgraph.run.unwind)
        raise unwind_now(frames[-1])
    return ex.push_spawned(frames[-1], fn, args, kwargs)


def wait(futures: Iterable[SpawnFuture], timeout: float | None = None) -> list:
    """The values of ``futures`` (spawned calls), in their order, once all have ended;
    raises a failed one's :class:`SpawnedTaskError` as soon as one has failed (the
    first in the list, of those failed by then). A task that catches it has handled
    every call of the list: another that fails, before or after, fails nothing more
    (as with Ray's ``get`` and Dask's ``gather``). TimeoutError if they have not all
    ended after ``timeout`` seconds (they go on)."""
    futures = list(futures)
    looked: dict[int, int] = {}  # run -> its failed calls when this wait last looked
    late = past(timeout)
    values = []
    try:
        for f in futures:
            if late is None and f.state == RUNNING:
                refuse_own_wait(f)
            while f.state < DONE:  # (until it ends, or one of them fails: raised at once,
                owner = f.owner  # not after the tree below the calls before it: an error
                failed = owner.calls_failed  # 6 levels down 729 calls came out 18 s late)
                if looked.get(id(owner)) != failed:
                    looked[id(owner)] = failed
                    for g in futures:
                        if g.state == FAILED:
                            g.result()  # (raises)
                if late is not None and late():
                    left = sum(g.state < DONE for g in futures)
                    raise TimeoutError(
                        f"{left} of {len(futures)} spawned calls have not ended after "
                        f"{timeout} s (the first: {f.label()})"
                    )
                ended = lambda o=owner, n=failed: o.calls_failed != n  # noqa: E731
                owner.wait_for(f, ended if late is None else Until(late.at, ended), futures)
            values.append(f.result())
    except TaskError:  # (SpawnedTaskError, or a skipped call's TaskSkipped; not RunError)
        for g in futures:  # (the parent's join raises none of theirs: see join)
            g.observed = True
        raise
    return values


def unwind_now(frame: Frame) -> Unwind:
    """The Unwind that ``frame``, marked unwinding, raises now (it has unwound)."""
    frame.unwound = True
    return Unwind(f"{frame.label()} unwinds")


class Until:
    """The end of a timed wait: true once ``cond()`` is (None: never) or the monotonic
    clock reaches ``at``. A wait that has one runs no call on its own stack: see
    :meth:`SpawnRunner._hand_over`."""

    __slots__ = ("at", "cond")

    def __init__(self, at: float, cond: Callable[[], bool] | None = None):
        self.at, self.cond = at, cond

    def __call__(self) -> bool:
        return (self.cond is not None and self.cond()) or time.monotonic() >= self.at


def past(timeout: float | None) -> Until | None:
    """Whether ``timeout`` seconds from now have passed (None: no limit)."""
    if timeout is None:
        return None
    return Until(time.monotonic() + timeout)


def take_out(pool: deque, fut: SpawnFuture) -> SpawnFuture | None:
    """``fut`` taken out of ``pool`` (None if it is not there): a waiter runs the call it
    waits for, however deep, as a fork-join pool's join does (a sibling's future,
    reached through a closure, waited for on a rank of one worker never ran)."""
    try:
        pool.remove(fut)
    except ValueError:
        return None
    return fut


def take_deeper(pool: deque, depth: int) -> SpawnFuture | None:
    """The newest spawned call in ``pool`` deeper than ``depth``, taken out (None if
    none): what a worker waiting in a task of that depth may run on its stack."""
    if not pool:
        return None
    if pool[-1].depth > depth:
        return pool.pop()
    for i in range(len(pool) - 2, -1, -1):
        if pool[i].depth > depth:
            item = pool[i]
            del pool[i]
            return item
    return None


class SpawnRunner:
    """The executor's spawned-task methods (a mixin of
    :class:`~taskgraph.run.executor.Executor`). Its fields, guarded by ``lock``:
    ``spool`` (the deque of PENDING spawned calls), ``spawn_waiting`` (threads in
    ``spawn_cv.wait``), ``wait_depths`` (the depths they wait in), ``spawned_running``
    (workers running a spawned call taken when idle), ``accepting`` (submitted calls are
    taken), ``submitted_left`` (those not ended); ``spawn_cv``
    shares ``lock``'s lock; ``_frames``: each worker's frame stack (its own thread
    only)."""

    def push_spawned(self: Any, parent: Frame, fn: Callable, args: tuple, kwargs: dict):
        """A call spawned by ``parent`` (the frame running on this thread), into the
        pool; its future."""
        fut = SpawnFuture(self, attempts.spawn_fn(fn), args, kwargs, parent.depth + 1, parent)
        self.check_call(fn, fut)
        parent.children.append(fut)
        with self.lock:
            if self.stopping:
                raise RunError(f"run {self.graph.name!r} is stopping: {fut.label()} not spawned")
            self.spool.append(fut)
            self.stats.spawned += 1
            if self.waiting:  # an idle worker (it takes the oldest)
                self.lock.notify()
            if self.spawn_waiting:
                self.spawn_cv.notify_all()
        steal = self.steal
        if steal is None:
            return fut
        laying = steal.board is not None and len(self.spool) > 1  # (a hint, without the lock)
        feeding = bool(steal.hungry) and steal.wants(fut.depth)
        if not (feeding or laying):
            return fut
        # not from under a timed attempt: its interrupt could land between taking a call
        # out of the pool and sending it (or laying it); the poller does it then
        timed = self.watch.timed_on(threading.get_ident(), _tls.ctx[1])
        if feeding and (timed or not steal.feed()):  # a rank waits: feed it from here
            self.wake.set()  # (else the poller offers)
        if laying and not timed:
            steal.lay_older()
        return fut

    def check_call(self: Any, fn: Any, fut: SpawnFuture) -> None:
        """GraphError at once if the call of ``fn`` (a ``@tg.task`` function, before
        :func:`~taskgraph.run.attempts.spawn_fn`) that ``fut`` holds asks for more
        cores, memory or GPUs than any rank of the run has; it names the call and
        what each rank has."""
        options = getattr(fn, "options", None)
        if options is None:  # (a plain callable: one core)
            return
        if options == DEFAULT_OPTIONS and not (fut.kwargs and "ranks" in fut.kwargs):
            return
        self.launcher.check(fn, fut.args, fut.kwargs, fut.label())

    def submit(self: Any, fn: Callable, args: tuple, kwargs: dict) -> SpawnFuture:
        """A call from outside the run's tasks (the notebook's ``run.submit``), into the
        pool as a child of no task (it may be stolen); its future. Any thread; the run
        does not end on this rank before it has ended. RunError once the run stops or
        no longer takes calls (see :meth:`close_submissions`)."""
        refuse_async(fn, "run.submit:")
        args, kwargs = read_only(args, kwargs)
        fut = SpawnFuture(self, attempts.spawn_fn(fn), args, kwargs, 1)
        self.check_call(fn, fut)
        fut.submitted = True
        with self.lock:
            if self.stopping or self.failure is not None:
                raise RunError(f"run {self.graph.name!r} has stopped: {fut.label()} not submitted")
            if not self.accepting and self.sched.done == self.sched.ntasks:
                raise RunError(
                    f"run {self.graph.name!r} has ended on rank {self.net.rank}: "
                    f"{fut.label()} not submitted (make the run with open=True to add "
                    "calls until it is closed)"
                )
            self.spool.append(fut)
            self.submitted_left += 1
            self.stats.spawned += 1
            if self.waiting:
                self.lock.notify()
            if self.spawn_waiting:
                self.spawn_cv.notify_all()
        steal = self.steal
        if steal is not None and steal.hungry:
            steal.feed()  # (an idle rank gets it now, if the network token is free)
        if steal is not None and steal.board is not None:
            steal.lay_older()
        self.wake.set()  # (the progress thread may be idle, and this rank a victim)
        return fut

    def close_submissions(self: Any) -> None:
        """The run takes no more submitted calls: it ends once they and its tasks have
        ended. Any thread, any number of times."""
        with self.lock:
            self.accepting = False
        self.wake.set()

    def wait_for(
        self: Any,
        fut: SpawnFuture,
        until: Callable[[], bool] | None = None,
        awaits: Sequence[SpawnFuture] | None = None,
    ) -> None:
        """Until ``fut`` ends (or ``until()`` is true): on a worker of this run, run
        spawned calls deeper than the frame it waits in meanwhile; else only wait.
        ``awaits``: the calls whose end (a failure too) ends the wait (None: ``fut``). A
        managed call (one with resources: taskgraph.run.launcher) gives its resources
        back while it waits. RunError if the run stops."""
        ctx = getattr(_tls, "ctx", None)
        frames = ctx[2] if ctx is not None and ctx[0] is self else None
        depth = frames[-1].depth if frames else 0
        if frames is not None and len(frames) > NEST_LIMIT and fut.state < DONE:
            net = self.net
            raise RecursionError(
                f"spawned calls nested {len(frames)} deep on one worker of rank {net.rank}/"
                f"{net.size} (at most {NEST_LIMIT}): {frames[-1].label()} cannot wait for "
                f"{fut.label()}"
            )
        held = attempts.give_back() if frames is not None and fut.state < DONE else None
        if held is not None:  # (a managed call waits: its resources go back meanwhile)
            try:
                self._wait_released(fut, frames, depth, held[1], until, awaits)
            finally:
                held[0][2] = False
            return
        self._wait_nested(fut, frames, depth, until, awaits)

    def is_worker_here(self: Any) -> bool:
        """Whether this thread is a worker of this run."""
        ctx = getattr(_tls, "ctx", None)
        return ctx is not None and ctx[0] is self

    def wait_any(
        self: Any,
        fut: SpawnFuture,
        seconds: float,
        awaits: Sequence[SpawnFuture] | None = None,
        timed: bool = False,
    ) -> None:
        """Until ``fut`` or any other spawned call of this rank ends, or ``seconds``
        pass: :func:`~taskgraph.cluster.submit.as_completed` in a task helps as
        ``result()`` does (it slept, and a rank of one worker never ran the calls);
        ``timed``: the seconds are the caller's timeout (see :class:`Until`)."""
        with self.lock:
            seen = self.calls_ended
        if timed:
            until: Any = Until(time.monotonic() + seconds, lambda: self.calls_ended != seen)
        else:
            deadline = time.perf_counter() + seconds
            until = lambda: self.calls_ended != seen or time.perf_counter() >= deadline  # noqa: E731
        self.wait_for(fut, until, awaits)

    def _wait_released(
        self: Any, fut: SpawnFuture, frames: list, depth: int, need: Any, until: Any, awaits
    ) -> None:
        """:meth:`_wait_here`, with the cores, memory and GPUs that the managed call
        waiting on this thread holds given back meanwhile (as a blocked ``ray.get``
        does): the calls it waits for may need them. Taken again, in turn, before it
        goes on."""
        gate = self.launcher.gate
        gate.release(need)
        try:
            self._wait_nested(fut, frames, depth, until, awaits)
        finally:
            # (not taken again when the run stops: its launcher ends with it)
            if not gate.acquire(need, lambda: bool(self.stopping)):
                raise RunError(
                    f"run {self.graph.name!r} stopped on rank {self.net.rank}/"
                    f"{self.net.size} while waiting for {fut.label()}"
                )

    def _wait_nested(
        self: Any, fut: SpawnFuture, frames: list | None, depth: int, until, awaits
    ) -> None:
        """:meth:`_wait_here`, on a new thread's stack if this one holds
        :func:`nest_segment` nested waits already (this thread blocks meanwhile: the
        worker is one thread at a time), so that a recursion NEST_LIMIT deep fits in
        the interpreter's recursion limit, which counts a thread's frames."""
        if frames is None or context.nested_here(frames) < nest_segment():
            return self._wait_here(fut, frames, depth, until, awaits)
        ctx, out = _tls.ctx, []
        ended = threading.Event()  # (not Thread.join: an interrupt landing in it marks
        # the thread ended while it runs on)

        def deeper() -> None:
            context.enter(ctx)
            try:
                self._wait_here(fut, frames, depth, until, awaits)
            except BaseException as exc:  # noqa: BLE001 - raised on the waiting thread
                out.append(exc)
            finally:
                ended.set()

        name = f"taskgraph-worker {ctx[1]} (waits {len(frames)} deep)"
        th = threading.Thread(target=deeper, name=name, daemon=True)
        th.start()
        landed: BaseException | None = None  # (an interrupt meant for this worker)
        while not ended.is_set():  # (in steps: an interrupt lands here, not after)
            try:
                ended.wait(0.05)
            except TaskAbandoned as exc:  # the run goes on without this worker: the
                landed = landed or exc  # deeper part of its stack stops too
                context.interrupt_thread(th)
            except BaseException as exc:  # noqa: BLE001 - a timed attempt's, below:
                landed = landed or exc  # raised once the deeper waits return (late)
        if landed is not None and not (out and isinstance(out[0], TaskAbandoned)):
            out[:] = [landed]
        if out:
            raise out.pop()
        return None

    def _wait_here(
        self: Any, fut: SpawnFuture, frames: list | None, depth: int, until, awaits=None
    ) -> None:
        """The loop of :meth:`wait_for`."""
        top = frames[-1] if frames else None  # (the frame that waits)
        if top is not None:
            top.awaits = (fut,) if awaits is None else awaits
        lock, pool = self.lock, self.spool
        rung = False  # (the progress thread was told this worker went idle)
        timed = until.__class__ is Until  # (its calls run on a thread of their own)
        try:  # (one Python frame a wait: nest_segment() of them fit a thread's stack)
            with lock:
                while True:
                    if top is not None and top.unwinding:  # (before its end: a dropped
                        raise unwind_now(top)  # call's end is no answer)
                    if fut.state >= DONE or (until is not None and until()):
                        return
                    if self.stopping:
                        raise RunError(
                            f"run {self.graph.name!r} stopped on rank {self.net.rank}/"
                            f"{self.net.size} while waiting for {fut.label()}"
                        )
                    if frames is None:  # not a worker of this run (the notebook's thread)
                        self.spawn_cv.wait(0.1)
                        continue
                    if timed and top is not None and top.handed and top.handed[0]:
                        # (one call at a time, over the frame's waits: as_completed's looks)
                        self.spawn_waiting += 1
                        try:
                            self.spawn_cv.wait(min(0.05, max(0.0, until.at - time.monotonic())))
                        finally:
                            self.spawn_waiting -= 1
                        continue
                    item = take_deeper(pool, depth)
                    if item is None and fut.state == PENDING and fut.owner is self:
                        item = take_out(pool, fut)  # (a call no deeper, reached by reference)
                    if item is not None and item.slot >= 0 and not self.steal.unpublish(item):
                        continue  # (a thief took it from the board: its result comes back)
                    if item is None and self.sched.ready and not timed:
                        worker = _tls.ctx[1]
                        if self.may_nest_static(worker, frames):
                            rung = False
                            self.run_static_nested(worker, frames)  # (a stop: the loop raises)
                            continue
                    if item is None:
                        self.spawn_waiting += 1
                        self.wait_depths.append(depth)  # (what a thief here may take)
                        if not rung and self.steal is not None:
                            # the rank may be idle now: its progress thread asks at once,
                            # not after the long sleep of a rank whose workers compute
                            # (rank 0 of a 2-rank UTS sat idle 4 ms at the start so)
                            rung = self.spawn_waiting + self.waiting >= self.nworkers
                            if rung:
                                self.wake.set()
                        left = until.at - time.monotonic() if timed else 0.1
                        try:  # (a timeout's interrupt may land in the wait)
                            self.spawn_cv.wait(min(0.1, max(0.0, left)))  # (a stop notifies)
                        finally:
                            self.wait_depths.remove(depth)
                            self.spawn_waiting -= 1
                        continue
                    item.state = RUNNING
                    rung = False
                    if timed and len(self._handed) < HANDED_LIMIT and self._hand_over(item, top):
                        continue
                    self._run_deeper(item, frames)  # (past the limit: late rather than stuck)
        finally:
            if top is not None:
                top.awaits = ()  # (kept, it would tie the frame and its calls in a cycle)

    def _hand_over(self: Any, item: SpawnFuture, top: Frame | None) -> bool:
        """Run ``item`` (taken, RUNNING), which a wait with a timeout would have run on
        its stack, on a thread of its own, as this worker (its trace lane): the wait
        ends at its time, not after the call (a 2 s call ran to its end inside a 0.2 s
        ``result(timeout=)``: a trial), and the call goes on if it does. The waiting
        frame ``top`` hands over no other call until it ends (``top.handed``: its
        timed waits, as_completed's looks, would start a thread a call); per frame,
        not per thread: a call this thread runs later may be one the handed call waits
        for. False if no thread could start. Lock held."""
        ctx = _tls.ctx
        own: list = []  # (its frame stack: a call deeper than the waiter's)
        handed = [True]

        def body() -> None:
            context.enter((self, ctx[1], own))
            try:
                self.run_spawned(item, own)
            except BaseException as exc:  # noqa: BLE001 - as an idle worker's call
                with self.lock:
                    if not self.stopping:
                        self._fail(None, exc)
            finally:
                with self.lock:
                    self.spawned_running -= 1
                    del self._handed[threading.current_thread()]
                    handed[0] = False
                    self.spawn_cv.notify_all()
                self.wake.set()  # (the rank may be quiet now: see Stealer.step)
                context.leave_worker()

        name = f"taskgraph-worker {ctx[1]} (a timed wait's call)"
        th = threading.Thread(target=body, name=name, daemon=True)
        self.spawned_running += 1
        self._handed[th] = own  # (its stack unwinds; it is interrupted if the run stops)
        try:
            th.start()
        except RuntimeError:  # (no thread to be had: run it on this stack, late)
            self.spawned_running -= 1
            del self._handed[th]
            return False
        if top is not None:
            top.handed = handed
        return True

    def _run_deeper(self: Any, item: SpawnFuture, frames: list) -> None:
        """Run ``item`` on this waiting worker's stack. Lock held on entry and exit. A
        timed attempt below it on this thread is not interrupted meanwhile (see
        :class:`~taskgraph.run.attempts.Watch`): the interrupt would land in ``item``."""
        lock, watch = self.lock, self.watch
        ident = threading.get_ident()
        worker = _tls.ctx[1]
        paused = watch.timed_on(ident, worker)
        if paused:
            watch.pause(ident, worker)
        lock.release()
        try:
            self.run_spawned(item, frames)
        finally:
            lock.acquire()
            late = paused and watch.resume(
                ident, worker, time.perf_counter(), self.tuning.stop_grace
            )
        if late:  # (the waiting attempt ran past its time while ``item`` ran)
            raise attempts.AttemptTimeout("timed out while running a spawned call")

    def run_spawned(self: Any, item: SpawnFuture, frames: list) -> None:
        """Run the spawned call ``item`` (taken, RUNNING) on this thread, join its
        children, and complete its future. Lock not held. An exception is kept in the
        future, a SystemExit or KeyboardInterrupt of the call's own too (its parent hears
        of it, named); TaskAbandoned (the run goes on without this worker) is raised
        again."""
        frames.append(item)
        value: Any = None
        exc: BaseException | None = None
        start = self.trace.clock()
        worker = _tls.ctx[1] if getattr(_tls, "ctx", None) is not None else 0
        opts = attempts.spawned_options(self, item.fn)
        try:
            if opts is None:
                value = item.fn(*item.args, **item.kwargs)
                if item.children:  # (only a call that spawned can return a future)
                    refuse_future(value)
            else:  # retries, a failure policy, a checkpoint: see taskgraph.run.attempts
                value = attempts.run_call(
                    self, worker, item.label(), item.fn, item.args, item.kwargs, opts
                )
        except BaseException as e:  # noqa: BLE001 - kept for the waiter
            exc = e
            if _wrote_into(e, item):  # (with the write's traceback: it says where)
                exc = ValueError(
                    f"{item.label()} wrote into a NumPy array it was given ({e}): a spawned "
                    "call takes values (on another rank it runs on a copy), so its arrays "
                    "are read-only; return a new array, or copy it first"
                ).with_traceback(e.__traceback__)
                exc.__cause__ = e
        try:
            self.join(item, failing=exc is not None)
        except BaseException as e:  # noqa: BLE001 - kept for the waiter
            if exc is None:
                value, exc = None, e
        finally:
            frames.pop()
        if item.unwound:  # (however it ended then: it raised Unwind, maybe swallowed)
            self._unwound(item)
            return
        if item.unwinding:  # (it ended before a spawn or a wait: its value stands)
            item.unwinding = False
        if opts is None:  # (a managed call counts itself)
            attempts.count_plain(self.tally, item, exc, self.net)
        state = TASK_DONE if exc is None else TASK_FAILED
        self.trace.spawned(worker, start, self.trace.clock(), item.label(), state)
        self.complete(item, value, exc)
        if isinstance(exc, TaskAbandoned):
            raise exc

    def _unwound(self: Any, item: SpawnFuture) -> None:
        """``item`` unwound (see taskgraph.run.unwind): back into the pool, to run again
        from its start, or dropped; its children of this run let go. Lock not held."""
        self.let_go_children(item)
        with self.lock:
            item.children = []
            item.unwinding = item.unwound = False
            again = unwind.requeue(item) and not self.stopping
            if again:
                self.tally.reruns += 1
                item.state, item.exc, item.value = PENDING, None, None
                self.spool.append(item)
                if self.waiting:
                    self.lock.notify()
                if self.spawn_waiting:
                    self.spawn_cv.notify_all()
                return
            item.observed = True  # (its waiter unwinds too: asked, it unwinds on)
        self.complete(item, None, Unwind(f"{item.label()} was dropped: its waiter unwinds"))

    def _unbury(self: Any, waiter: Frame, failed: SpawnFuture) -> None:
        """``failed``, a call ``waiter`` spawned, failed: if calls lie above ``waiter`` on
        a worker's stack, and its wait ends at this failure, they unwind (see
        taskgraph.run.unwind). Lock held."""
        if not any(f is failed for f in waiter.awaits):
            return  # (it waits for other calls: it would see nothing sooner)
        for stack in (*self._frames, *self._handed.values()):
            above = unwind.frames_to_unwind(list(stack), waiter, self._may_unwind)
            if above:
                for frame in above:
                    frame.unwinding = True
                self.spawn_cv.notify_all()
                return

    def _may_unwind(self: Any, frame: Frame) -> bool:
        """Whether ``frame`` is a plain spawned call (no options: no retry or timeout
        would see the unwinding as its own failure)."""
        return isinstance(frame, SpawnFuture) and attempts.spawned_options(self, frame.fn) is None

    def join(self: Any, frame: Frame, failing: bool = False) -> None:
        """Wait for every child of ``frame`` to end; raise the error of the first
        failed one its parent never asked for. Once ``frame`` fails (``failing``: it
        raised; or such a child failed meanwhile) its children still in this rank's
        pool are dropped, not run, and those running are not waited for: none will be
        asked for (see :meth:`let_go_children`)."""
        children = frame.children
        failing = failing or any(c.state == FAILED and not c.observed for c in children)
        for c in children:
            while c.state < DONE and not failing:
                seen = self.calls_failed
                self.wait_for(c, lambda n=seen: self.calls_failed != n, children)
                if self.calls_failed != seen:
                    failing = any(x.state == FAILED and not x.observed for x in children)
        if frame.unwinding and any(c.exc.__class__ is Unwind for c in children):
            raise unwind_now(frame)  # (a child was dropped: the frame's own end is no answer)
        if failing:
            self.let_go_children(frame)
        frame.children = []
        for c in children:
            if c.state == FAILED and not c.observed:
                c.observed = True
                raise c.error()

    def let_go_children(self: Any, frame: Frame) -> None:
        """The failed ``frame``'s children that have not ended: those still in this
        rank's pool leave it, FAILED, never run; those running (on another worker, or
        a thief: a subtree 8 s long kept an error from the run on 3 ranks) are not
        waited for, and the rank's tasks count as done only once they have ended (see
        the executor's ``orphans``). None of their errors is anyone's to raise."""
        net = self.net
        why = f"RunError: not run: {frame.label()} failed first"
        with self.lock:
            left = [c for c in frame.children if c.state < DONE]
            if not left:
                return
            drop = {id(c) for c in left if c.state == PENDING}
            if drop:
                kept = [x for x in self.spool if id(x) not in drop]
                self.spool.clear()  # (in place: waiters hold this deque)
                self.spool.extend(kept)
            for c in left:
                c.observed = True
                if id(c) in drop and (c.slot < 0 or self.steal.unpublish(c)):
                    c.state = FAILED
                    c.failure = (c.label(), net.rank, net.size, net.host, why, "")
                    self.calls_ended += 1
                    self.calls_finished += 1
                    c.ended()
                else:  # (running: here, or on a thief that took it, from the board too)
                    self.orphans.add(id(c))
            self.spawn_cv.notify_all()

    def join_root(self: Any, index: int) -> None:
        """The static task worker ``index`` ran spawned calls: join them."""
        frames = self._frames[index]
        try:
            self.join(frames[0])
        finally:
            frames.clear()

    def complete(self: Any, item: SpawnFuture, value: Any, exc: BaseException | None) -> None:
        """Record how the call ``item`` ended (its result goes back to the rank it was
        stolen from, if it was) and wake its waiters. Lock not held."""
        failure = None
        try:
            if exc is not None:
                failure = _failure(item, exc, self.net)
            if item.remote is not None:
                if exc is not None and failure is not None:  # (its waiter rebuilds it)
                    failure = (*failure, dump_original(root_cause(exc)))
                self.steal.queue_result(item, value, failure)
        except BaseException as e:  # its waiter must hear of it, never hang
            failure = failure or (item.name, self.net.rank, self.net.size, self.net.host,
                                  f"{type(e).__name__} while it ended", "")  # fmt: skip
            if not isinstance(e, Exception):
                self.settle(item, None, exc, failure)
                raise
        self.settle(item, value, exc, failure)

    def settle(self: Any, item: SpawnFuture, value: Any, exc, failure: tuple | None) -> None:
        """The call ``item`` ended: with ``value``, or ``failure`` (and ``exc``, where it
        ran here). Lock not held."""
        with self.lock:
            if failure is None:
                item.value = value
                item.state = DONE
            else:
                item.exc, item.failure = exc, failure
                item.state = FAILED
                # (decided now: every run ends stopping, after its calls well or not)
                item.stopped = bool(self.stopping) and _run_error_at_root(exc, failure)
            self.calls_ended += 1
            if item.remote is None:  # (a stolen one counts where it was spawned)
                self.calls_finished += 1
            if failure is not None:
                self.calls_failed += 1
                if item.parent is not None and not item.observed:
                    self._unbury(item.parent, item)
            if item.watch is not None:
                item.ended()
            if self.orphans and id(item) in self.orphans:
                self.orphans.discard(id(item))
                if not self.orphans:
                    self.wake.set()  # (the rank's tasks may be done now)
            if self.spawn_waiting:
                self.spawn_cv.notify_all()
            if item.submitted:
                item.observed = True  # (its error is the submitter's to see: the run goes on)
                self.submitted_left -= 1
                self.spawn_cv.notify_all()  # (a thread outside the run may wait in result())
                if not self.submitted_left:
                    self.wake.set()

    def run_spawned_idle(self: Any, index: int) -> bool:
        """An idle worker runs the oldest spawned call (nearest the root: the most
        work). Lock held on entry and exit; False if the worker should stop."""
        item = self.spool.popleft()
        if item.slot >= 0 and not self.steal.unpublish(item):
            return True  # (a thief took it from the board: its result comes back)
        item.state = RUNNING
        self.spawned_running += 1
        self.lock.release()
        try:
            self.run_spawned(item, self._frames[index])
        except BaseException as exc:  # noqa: BLE001 - an interrupt: the worker stops
            self.lock.acquire()
            self.spawned_running -= 1
            if index not in self._abandoned:
                self._fail(None, exc)
            return False
        self.lock.acquire()
        self.spawned_running -= 1
        return True

    def drop_spawned(self: Any) -> None:
        """The run stops: wake every thread waiting in a spawned call. Lock held."""
        self.spool.clear()
        self.spawn_cv.notify_all()
