"""How one call of a ``@tg.task`` function starts on a rank: its resources taken, the
launch throttle honoured, run on a worker thread or in a process of the rank's pool.

(The lead's stub: calls at once, on this thread.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Launcher:
    """One rank's launcher, made by the executor (``ex.launcher``)."""

    def __init__(self, ex: Any):
        self.ex = ex

    def call(self, fn: Callable, args: tuple, kwargs: dict, label: str, worker: int) -> Any:
        """Run ``fn(*args, **kwargs)`` (``fn``: a TaskFunction or a plain callable) for
        worker ``worker``; its value."""
        call = getattr(fn, "fn", fn)
        return call(*args, **kwargs)

    def close(self) -> None:
        """The run ended: stop whatever this launcher started."""
