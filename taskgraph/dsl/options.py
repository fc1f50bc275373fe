"""What a task asks of the runtime, and what a run asks of every task in it.

:class:`TaskOptions` are a ``@tg.task`` function's: its failure policy (``retries``,
``on_failure``, ``timeout``) and its resources (``cores``, ``memory``, ``gpus``,
``ranks``, ``process``). :class:`RunOptions` are a run's (``cluster.run(g, ...)``):
defaults for the failure policy, a checkpoint directory, and a launch throttle. Both
are checked when made, so a wrong value fails before anything runs, naming the task.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..core.errors import GraphError

POLICIES = ("fail", "skip", "ignore")
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9}
_UNITS |= {"t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory(memory: Any, what: str) -> int:
    """``memory`` in bytes: an int, or a string such as ``"512MB"``, ``"2 GiB"``;
    GraphError naming ``what`` otherwise."""
    if isinstance(memory, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", memory)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise GraphError(f"{what}: memory {memory!r} is not a size (e.g. 512MB, 2GiB)")
        return int(float(m.group(1)) * _UNITS[unit])
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise GraphError(f"{what}: memory must be bytes (an int >= 0) or a size such as '2GB'")
    return memory


def whole(value: Any, least: int) -> TypeGuard[numbers.Integral]:
    """Whether ``value`` is an integer (NumPy's too, not a bool) of at least ``least``."""
    return (
        isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least
    )


def checked_count(value: Any, name: str, what: str, least: int) -> int:
    """``value`` as an int (NumPy's too); GraphError naming ``what`` and ``name``
    unless it is an integer of at least ``least``."""
    if not whole(value, least):
        raise GraphError(f"{what}: {name} must be an int >= {least}, not {value!r}")
    return int(value)


def _policy(value: Any, what: str) -> str:
    if value not in POLICIES:
        raise GraphError(f"{what}: on_failure must be one of {', '.join(POLICIES)}, not {value!r}")
    return value


def checked_seconds(value: Any, name: str, what: str) -> float | None:
    """``value`` as float seconds (None stays None); GraphError unless it is positive."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise GraphError(f"{what}: {name} must be a positive number of seconds, not {value!r}")
    return float(value)


def checked_sizes(what: str, workers: Any, blas_threads: Any, **seconds: Any) -> None:
    """GraphError naming the first bad one of ``what``'s per-rank sizes (``Cluster``'s,
    ``cluster.run``'s; None: the default) and its ``seconds`` (timeouts): they were
    taken as given, 0 and -1 included."""
    for name, value in (("workers", workers), ("blas_threads", blas_threads)):
        if value is not None:
            checked_count(value, name, what, 1)
    for name, value in seconds.items():
        checked_seconds(value, name, what)


@dataclass(frozen=True)
class TaskOptions:
    """A task's failure policy and resources.

    ``retries``: attempts after the first failed one; ``on_failure``: when the last
    attempt fails, ``"fail"`` the run (the default), ``"skip"`` (its dependents are
    cancelled, the rest goes on) or ``"ignore"`` (dependents get the exception as
    their input); ``timeout``: seconds an attempt may run; ``cores``, ``memory``
    (bytes), ``gpus``: what one attempt holds on its rank while it runs; ``ranks``:
    the MPI ranks of an executable task (it holds ``ranks`` x ``cores`` cores);
    ``process``: run in a process of the rank's pool, not a worker thread (for
    functions that hold the GIL)."""

    retries: int = 0
    on_failure: str = "fail"
    timeout: float | None = None
    cores: int = 1
    memory: int = 0
    gpus: int = 0
    ranks: int = 1
    process: bool = False

    @classmethod
    def make(cls, what: str, base: TaskOptions | None = None, **kw: Any) -> TaskOptions:
        """Options from keyword arguments (those left out: ``base``'s, else the
        defaults), checked; GraphError naming ``what`` (``"task f"``)."""
        unknown = set(kw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise GraphError(f"{what}: no such task option {', '.join(sorted(unknown))}")
        o = dataclasses.replace(base or DEFAULT, **kw)
        return cls(
            retries=checked_count(o.retries, "retries", what, 0),
            on_failure=_policy(o.on_failure, what),
            timeout=checked_seconds(o.timeout, "timeout", what),
            cores=checked_count(o.cores, "cores", what, 1),
            memory=parse_memory(o.memory, what),
            gpus=checked_count(o.gpus, "gpus", what, 0),
            ranks=checked_count(o.ranks, "ranks", what, 1),
            process=bool(o.process),
        )

    @property
    def slots(self) -> int:
        """The cores one attempt holds: ``ranks`` x ``cores``."""
        return self.ranks * self.cores


DEFAULT = TaskOptions()


@dataclass(frozen=True)
class RunOptions:
    """A run's options (``cluster.run(g, ...)``).

    ``retries``, ``on_failure``: the failure policy of every task that leaves its own
    at the default; ``checkpoint``: a directory where each finished task's value is
    kept durably, so that the same run made again skips what is done; ``launch_rate``:
    at most this many task starts a second, over the whole run (each rank takes its
    share); ``max_launching``: at most this many tasks starting at once on a rank."""

    retries: int | None = None
    on_failure: str | None = None
    checkpoint: str | None = None
    launch_rate: float | None = None
    max_launching: int | None = None

    @classmethod
    def make(cls, **kw: Any) -> RunOptions:
        """Checked options; GraphError naming the bad one."""
        o = cls(**kw)
        what = "cluster.run"
        if o.retries is not None:
            checked_count(o.retries, "retries", what, 0)
        if o.on_failure is not None:
            _policy(o.on_failure, what)
        if o.launch_rate is not None:
            checked_seconds(o.launch_rate, "launch_rate", what)  # (a positive number)
        if o.max_launching is not None:
            checked_count(o.max_launching, "max_launching", what, 1)
        if o.checkpoint is not None:
            return dataclasses.replace(o, checkpoint=str(o.checkpoint))
        return o

    @functools.cached_property  # (asked on every spawned call: computed once)
    def active(self) -> bool:
        """Whether any option is set (a run without any keeps the static fast path)."""
        return any(v is not None for v in dataclasses.astuple(self))


NO_RUN_OPTIONS = RunOptions()


def options_of(fn: Any) -> TaskOptions:
    """The options of a ``@tg.task`` function (DEFAULT for anything else)."""
    o = getattr(fn, "options", None)
    return o if isinstance(o, TaskOptions) else DEFAULT


def effective(task: TaskOptions, run: RunOptions) -> TaskOptions:
    """A task's options in a run: the run's ``retries`` and ``on_failure`` where the
    task left its own at the default."""
    change: dict[str, Any] = {}
    if run.retries is not None and task.retries == DEFAULT.retries:
        change["retries"] = run.retries
    if run.on_failure is not None and task.on_failure == DEFAULT.on_failure:
        change["on_failure"] = run.on_failure
    return dataclasses.replace(task, **change) if change else task
