"""The executor's tuning: time limits, polling and back-off constants, and the
network settings of :mod:`taskgraph.core.config`, in one frozen :class:`Tuning`.

The module constants are the defaults; :meth:`Tuning.from_config` reads them (and
config) when an executor is made, so a test may patch a constant for one run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import config

POLLED_SLEEP = 4e-3  # the progress thread's longest sleep while a worker polls
LONG_TASK = 4e6  # flops: a worker starting a longer task hands polling to that thread
# mean task time under which one worker runs the tasks and the others park: two workers
# taking turns at tiny tasks pass the lock and the GIL around (benchmarks/micro.py)
SHORT_TASK = 50e-6
# ... where every task is a kernel that runs without the GIL: two workers then overlap
# one's kernel with the other's bookkeeping (benchmarks/micro.py)
SHORT_KERNEL = 20e-6
PARK = 200e-6  # a parked worker looks again this often, and helps with a task this old
# seconds a worker still in its task when the run stops (a failure, a cancel, a
# timeout) is given before it is interrupted and abandoned
STOP_GRACE = 1.5  # (below 2: every rank idle within 2 s of a cancel, the figure)
# seconds a timed attempt under a failure policy is given after its interrupt before
# its thread is abandoned (stuck in a C call), and the policy goes on
ABANDON = 0.5
# while every worker of a rank computes, its progress thread polls this often at first,
# backing off to 10x: transfers then overlap the kernels, and a rank with one core per
# worker keeps its cycles for them (a faster start took 16 % of a core at 2 x 1)
BUSY_POLL = 2e-3
# where the progress thread leaves the workers' cores alone while they compute
# (poll_while_computing), a worker ending a task polls up to this many times in a row
BOUNDARY_POLLS = 8
WATCH = 0.05  # the progress thread looks at least this often for tasks past their timeout


@dataclass(frozen=True)
class Tuning:
    """Every number the executor's loops run by (seconds, bytes, counts).

    ``max_sends``/``max_recvs``: sends and receives in flight at once;
    ``recv_budget``: bytes of receives posted ahead; ``poll_max``: longest back-off
    sleep while idle; ``spin`` (+ ``spin_per_byte`` per byte posted): how long an idle
    worker polls back to back after a message; ``polled_sleep``, ``long_task``,
    ``short_task``, ``park``, ``stop_grace``, ``watch``, ``busy_poll``: see the module
    constants."""

    max_sends: int
    recv_budget: int
    max_recvs: int
    poll_max: float
    spin: float
    spin_per_byte: float
    polled_sleep: float = POLLED_SLEEP
    busy_poll: float = BUSY_POLL
    long_task: float = LONG_TASK
    short_task: float = SHORT_TASK
    park: float = PARK
    stop_grace: float = STOP_GRACE
    watch: float = WATCH

    @classmethod
    def from_config(cls, fns=(), workers: int = 1) -> Tuning:
        """The tuning of a rank whose tasks call ``fns``, run by ``workers`` threads
        (the short-task limit depends on both: :func:`short_task_limit`)."""
        return cls(
            max_sends=config.max_sends(),
            recv_budget=config.recv_budget(),
            max_recvs=config.max_recvs(),
            poll_max=config.poll_max(),
            spin=config.spin(),
            spin_per_byte=config.spin_per_byte(),
            polled_sleep=POLLED_SLEEP,
            busy_poll=BUSY_POLL,
            long_task=LONG_TASK,
            short_task=short_task_limit(fns) if workers > 1 else SHORT_TASK,
            park=PARK,
            stop_grace=STOP_GRACE,
            watch=WATCH,
        )


def poll_while_computing(spare_cores: bool, single_copy_node: bool, stealing: bool) -> bool:
    """Whether a rank's progress thread polls while every worker computes (else it
    sleeps, looking at its watch's pace, and each worker polls once between tasks).

    Polling then helps where it costs nothing (``spare_cores``: the rank has a core
    more than its workers), where a large message moves only while both ranks call
    MPI (not ``single_copy_node``: chunked copies, or a peer on another node), and where
    a steal request waits for the answer (``stealing``). Otherwise its wake-ups take
    the workers' own cores: 10 % of a 2 x 1 Cholesky on the Intel VM, for transfers
    that one call lands anyway (docs/performance.md#cholesky-on-intel)."""
    return spare_cores or not single_copy_node or stealing


def short_task_limit(fns) -> float:
    """The mean task time under which one worker of a rank runs the tasks while the
    others park, for a rank whose tasks call ``fns``: ``SHORT_KERNEL`` if every one
    is a kernel that runs without the GIL (``nogil``), else ``SHORT_TASK``."""
    return SHORT_KERNEL if all(getattr(fn, "nogil", False) for fn in fns) else SHORT_TASK


def timeouts_by_function(fns, default: float | None) -> dict:
    """Each function's time limit in seconds: its own ``timeout`` attribute (from
    ``@tg.task(timeout=)`` or ``tg.kernel(timeout=)``), else ``default``; functions
    without a limit are left out."""
    out = {}
    for fn in fns:
        limit = getattr(fn, "timeout", None)
        if limit is None:
            limit = default
        if limit is not None:
            out[fn] = float(limit)
    return out
