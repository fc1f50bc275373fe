"""The exceptions a user can meet, in one place.

Build-time problems (a malformed graph, a wrong shape) raise :class:`GraphError`
before anything runs. Run-time failures raise :class:`TaskError` on every rank:
it names the task, its arguments, the rank where it failed and the host, and
carries the original traceback as its ``__cause__`` (a :class:`RemoteTraceback`
when the failure happened on another rank).
"""

from __future__ import annotations

import inspect
from typing import Any


class TaskgraphError(Exception):
    """Base class of every error raised by taskgraph."""


class GraphError(TaskgraphError, ValueError):
    """The graph is malformed: a cycle, a wrong shape or dtype, a tile out of range."""


class PlanError(TaskgraphError, ValueError):
    """The graph cannot be placed on the given ranks."""


class NotPositiveDefiniteError(TaskgraphError, ArithmeticError):
    """A Cholesky factorisation met a leading minor that is not positive definite.

    ``order``: the order of that minor (1-based, within the tile); ``message``: the
    text (default: says the order)."""

    def __init__(self, order: int, message: str | None = None):
        self.order = order
        super().__init__(
            message or f"the leading minor of order {order} of the tile is not positive definite"
        )


class RemoteTraceback(TaskgraphError):
    """The formatted traceback (``text``) of an exception raised on another rank."""

    def __init__(self, text: str):
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return "\n\n" + self.text


class TaskError(TaskgraphError, RuntimeError):
    """A task failed (its function raised) or the run was aborted because of it.

    ``task``: the task's label; ``rank``, ``size``: where it failed, of how many
    ranks; ``host``: that rank's host; ``error``: the exception as ``Type: text``;
    ``traceback``: the formatted traceback from that rank.
    """

    def __init__(
        self,
        task: str,
        rank: int,
        size: int,
        host: str,
        error: str,
        traceback: str = "",
    ):
        self.task = task
        self.rank = rank
        self.size = size
        self.host = host
        self.error = error
        self.traceback = traceback
        super().__init__(f"task {task} on rank {rank}/{size} ({host}) failed: {error}")

    def __reduce__(self):
        return (
            type(self),
            (self.task, self.rank, self.size, self.host, self.error, self.traceback),
        )


class RunError(TaskgraphError, RuntimeError):
    """A run failed for a reason that is not one task's error (a lost rank, a cancel)."""


class ExecutableError(TaskgraphError, RuntimeError):
    """An executable task failed: it exited non-zero, ran past its timeout, or could not
    start. The message names the command, the exit code and the tail of its stderr;
    ``result``: the :class:`~taskgraph.dsl.exe.ExeResult` (None if it never started)."""

    def __init__(self, message: str, result=None):
        self.result = result
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.result))


_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def refuse_async(fn: Any, what: str) -> None:
    """TypeError naming ``fn`` if it is an ``async def`` function: tasks and spawned
    calls run on worker threads, where a coroutine would come back unrun as the value
    (or fail to pickle on its way to another rank)."""
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_flags & _ASYNC:
        raise TypeError(
            f"{what} {getattr(fn, '__name__', fn)!s}: an async def function is not a task; "
            "write it as a plain def: it runs on a worker thread, and waits for what it "
            "spawns with fut.result() or tg.wait(futs), running other work meanwhile"
        )
