"""Which run and worker this thread works for: set by the worker loop, read by
``tg.spawn`` and the waits (:mod:`taskgraph.run.dynamic`), and carried over to the
thread a timed attempt runs on (:mod:`taskgraph.run.attempts`)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

tls = threading.local()  # .ctx: (executor, worker index, frame stack), or None; .base:
# the frames of that stack that lie on other threads' stacks (see nested_here)
in_pool_process = False  # this process runs process=True tasks (taskgraph.run.procpool)


class TaskAbandoned(BaseException):
    """Raised in a worker thread whose task ran past its timeout, or was still running
    when its run stopped: the run has ended without it (a BaseException, so that a task's
    own ``except Exception`` does not swallow it)."""


def enter_worker(ex: Any, index: int, frames: list) -> None:
    """This thread is worker ``index`` of ``ex``; ``frames``: its frame stack."""
    tls.ctx = (ex, index, frames)
    tls.base = 0


def leave_worker() -> None:
    """This thread no longer works for a run."""
    tls.ctx = None


def current() -> tuple | None:
    """(executor, worker index, frames) of this thread, or None."""
    return getattr(tls, "ctx", None)


def enter(ctx: tuple | None) -> None:
    """This thread works as ``ctx`` says (a :func:`current` of another thread), on a
    stack of its own: the frames its worker has now lie on the other's."""
    tls.ctx = ctx
    tls.base = len(ctx[2]) if ctx is not None else 0


def nested_here(frames: list) -> int:
    """How many of ``frames`` (this thread's worker's stack) lie on this thread's stack."""
    return len(frames) - getattr(tls, "base", 0)


def interrupt_thread(thread: threading.Thread) -> bool:
    """Raise :class:`TaskAbandoned` in ``thread`` (``PyThreadState_SetAsyncExc``).

    A pure-Python loop sees it within a few bytecodes, a ``time.sleep`` when the sleep
    ends; a call into C that never returns (a kernel, a blocking read) never sees it.
    True if the exception was set."""
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return False
    setexc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    n = setexc(ctypes.c_ulong(ident), ctypes.py_object(TaskAbandoned))
    if n > 1:  # (never for one thread id, but the C API asks for the undo)
        setexc(ctypes.c_ulong(ident), None)
    return n == 1
