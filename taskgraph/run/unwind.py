"""Letting a buried waiter see its failed call at once (the decisions are pure).

A worker that waits in a task runs other spawned calls on its stack meanwhile (see
taskgraph.run.dynamic). So when a call fails, the task waiting for it may lie under
calls it took while it waited, and would raise only once they all ended: 40 s after
the raise in a tree of 0.2 s leaves on 2 ranks. Instead the frames above it unwind:
each raises :class:`Unwind` at its next spawn or wait (a leaf running then ends
first), and the call that a frame outside the unwinding part still waits for goes
back to the pool, to run again from its start if it is still wanted (the waiter may
catch the error and ask for it); the others, whose waiters unwind too, are dropped.

A call that has raised Unwind counts as unwound however it then ended (it may have
swallowed it): it runs again with none of its first run's children; one that ends
before its next spawn or wait keeps its value. A dropped call asked for, or met in
the implicit join, raises Unwind, never an answer. Nothing unwinds for a waiter whose
wait is for other calls than the failed one (``result()``, ``tg.wait``, the join,
``as_completed``: the calls it waits for are noted): it would see the failure no
sooner.

Only plain spawned calls unwind: a static task, or a call with options (retries, a
timeout, resources), stays, and the waiter sees the error once it ends, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Unwind(BaseException):
    """Raised at a spawn or a wait of a call above a task whose call failed, so that
    the task sees the failure now (a BaseException: a task's ``except Exception``
    lets it through)."""


def frames_to_unwind(stack: list, waiter: Any, plain: Callable[[Any], bool]) -> list:
    """The frames above ``waiter`` on a worker's ``stack`` (bottom first) that unwind
    so that ``waiter`` sees its failed call at once: none if ``waiter`` is not on the
    stack or is its top, or a frame above it cannot unwind (not ``plain``)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is waiter:
            above = stack[i + 1 :]
            return above if all(plain(f) for f in above) else []
    return []


def requeue(call: Any) -> bool:
    """Whether an unwound ``call`` goes back to the pool (its waiter goes on: it may
    still ask for it) or is dropped (its waiter unwinds too, or has)."""
    parent = call.parent
    return parent is None or not parent.unwinding
