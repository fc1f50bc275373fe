"""Binding the ranks on one node to cores of their own.

MPICH's ``mpiexec`` (the ``mpich`` wheel's, and hydra generally) starts ranks unbound,
and Linux then sometimes runs two ranks' polling threads on one core for the whole of
a run: in a 2-rank ping-pong of 1,000 8-byte hops on 2 cores, 9 runs in 30 took about
30 ms instead of 5.3 (a hop of 30 us instead of 5), and none did with
``mpiexec -bind-to core``. So when every rank on a node was given the same CPUs (the
launcher bound none of them), each rank takes an even share of them, with all of its
threads; when the launcher bound ranks itself (Open MPI does by default, ``srun`` with
``--cpu-bind``), when there are fewer CPUs than ranks (oversubscribed: the OS shares
them better), or with ``TASKGRAPH_BIND=0``, nothing changes.

:func:`share` is the decision (pure); :func:`bind` carries it out, and
:func:`node_cpus` still answers with the CPUs the rank had before, so that "cores on
this node" keeps its meaning (workers per rank, "oversubscribed" labels). Code that
measures the whole node from one rank (the demo's GEMM peak) does it inside
:func:`whole_node`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

_before: frozenset[int] | None = None  # this process's CPUs before bind(), if it bound


def share(local_rank: int, cpus_by_rank: Sequence[frozenset[int]]) -> list[int] | None:
    """The CPUs local rank ``local_rank`` should keep, given every local rank's CPUs
    now, or None to leave the binding as it is."""
    size = len(cpus_by_rank)
    if size < 2 or any(c != cpus_by_rank[0] for c in cpus_by_rank):
        return None  # alone on the node, or the launcher bound the ranks already
    cpus = sorted(cpus_by_rank[0])
    if len(cpus) < size:
        return None  # more ranks than CPUs: let the OS share them out
    lo, hi = local_rank * len(cpus) // size, (local_rank + 1) * len(cpus) // size
    return cpus[lo:hi]


def current() -> frozenset[int]:
    """This thread's CPUs (all of them where the OS cannot say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return frozenset(range(os.cpu_count() or 1))


def node_cpus() -> frozenset[int]:
    """The CPUs this rank had before :func:`bind` (its current ones if it never bound)."""
    return _before if _before is not None else current()


def _set_all_threads(cpus: frozenset[int] | Sequence[int]) -> None:
    """Every thread of this process onto ``cpus`` (threads started later inherit the
    mask of the thread that starts them). BLAS pools started at import are threads
    too: left out, they would run beside the ranks' workers on any core."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def bind(cpus: Sequence[int]) -> None:
    """Keep this process (all its threads) on ``cpus``."""
    global _before
    if not hasattr(os, "sched_setaffinity"):
        return
    if _before is None:
        _before = current()
    _set_all_threads(cpus)


@contextlib.contextmanager
def whole_node() -> Iterator[None]:
    """Every thread of this process on all of :func:`node_cpus` meanwhile."""
    if _before is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    bound = current()
    _set_all_threads(_before)
    try:
        yield
    finally:
        _set_all_threads(bound)
