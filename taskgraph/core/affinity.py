"""Binding the ranks on one node to cores of their own.

MPICH's ``mpiexec`` (the ``mpich`` wheel's, and hydra generally) starts ranks unbound,
and Linux then sometimes runs two ranks' polling threads on one core for the whole of
a run: in a 2-rank ping-pong of 1,000 8-byte hops on 2 cores, 9 runs in 30 took 5-6
times as long as the fastest (a hop of ~30 us instead of 5), and none did with
``mpiexec -bind-to core`` or with the binding below (``python -m benchmarks
binding``). So when every rank on a node was given the same CPUs (the launcher bound
none of them, or bound them all to the same CPUs, e.g. all to one socket), each rank
takes an even share of them, whole cores together, with all of its threads; when the
launcher bound ranks to different CPUs itself (Open MPI does by default, ``srun`` with
``--cpu-bind``), when there are fewer CPUs than ranks (oversubscribed: the OS shares
them better), under a CPU quota smaller than the CPUs (a container's CFS limit: the
CPUs are time-shared with other users, whose ranks would be bound to the same ones),
or with ``TASKGRAPH_BIND=0``, nothing changes. Two jobs started at once on one node
would bind their ranks to the same CPUs, as Open MPI's default binding does: set
``TASKGRAPH_BIND=0`` for them.

:func:`share` is the decision (pure); :func:`bind` carries it out, and
:func:`node_cpus` still answers with the CPUs the rank had before, so that "cores on
this node" keeps its meaning (workers per rank, "oversubscribed" labels). Code that
measures the whole node from one rank (the demo's GEMM peak) does it inside
:func:`whole_node`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

_before: frozenset[int] | None = None  # this process's CPUs before bind(), if it bound


def share(
    local_rank: int,
    cpus_by_rank: Sequence[frozenset[int]],
    quota: float | None = None,
    key: Callable[[int], tuple] | None = None,
) -> list[int] | None:
    """The CPUs local rank ``local_rank`` should keep, given every local rank's CPUs
    now and the CPU quota (in CPUs, None if none), or None to leave them as they are.
    ``key`` orders the CPUs before they are cut into shares (:func:`topology_key`:
    by socket and core, so that a rank gets whole cores and a socket's are kept
    together; by number without it)."""
    size = len(cpus_by_rank)
    if size < 2 or any(c != cpus_by_rank[0] for c in cpus_by_rank):
        return None  # alone on the node, or the launcher bound the ranks already
    cpus = sorted(cpus_by_rank[0], key=key or (lambda c: (0, 0, c)))
    if len(cpus) < size:
        return None  # more ranks than CPUs: let the OS share them out
    if quota is not None and quota < len(cpus):
        return None  # time-shared CPUs: other containers' ranks would get the same ones
    lo, hi = local_rank * len(cpus) // size, (local_rank + 1) * len(cpus) // size
    return cpus[lo:hi]


def topology_key(root: Path = Path("/sys/devices/system/cpu")) -> Callable[[int], tuple]:
    """Orders CPUs by (socket, core, number), read from sysfs: where hyperthread
    siblings are numbered apart (0 and 48), or sockets alternate, cutting the list by
    number would give two ranks the two halves of the same cores."""

    def read(cpu: int, name: str) -> int:
        try:
            return int((root / f"cpu{cpu}" / "topology" / name).read_text())
        except (OSError, ValueError):
            return 0

    return lambda cpu: (read(cpu, "physical_package_id"), read(cpu, "core_id"), cpu)


def parse_cpu_max(text: str) -> float | None:
    """CPUs' worth of a cgroup v2 ``cpu.max`` ("200000 100000": 2.0; "max ...": None)."""
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def parse_cfs(quota: str, period: str) -> float | None:
    """CPUs' worth of a cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: None)."""
    q = int(quota.strip())
    return None if q < 0 else q / int(period.strip())


def cpu_quota() -> float | None:
    """The CPU time this process's cgroup may use, in CPUs; None without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    root = Path("/sys/fs/cgroup")
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        with contextlib.suppress(OSError, ValueError, ArithmeticError):
            if controllers == "":  # cgroup v2
                for d in (root / rel, root):
                    if (d / "cpu.max").exists():
                        return parse_cpu_max((d / "cpu.max").read_text())
            elif "cpu" in controllers.split(","):  # cgroup v1
                for d in (root / controllers / rel, root / "cpu" / rel, root / "cpu"):
                    if (d / "cpu.cfs_quota_us").exists():
                        return parse_cfs(
                            (d / "cpu.cfs_quota_us").read_text(),
                            (d / "cpu.cfs_period_us").read_text(),
                        )
    return None


def rank_cores(local_rank: int, cpus_by_rank: Sequence[frozenset[int]]) -> int:
    """The CPUs local rank ``local_rank`` has to itself, given every local rank's CPUs
    before binding: its own, shared evenly with the ranks that have the same ones."""
    mine = cpus_by_rank[local_rank]
    sharing = sum(1 for cpus in cpus_by_rank if cpus == mine)
    return max(1, len(mine) // sharing)


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
    too: left out, they would run beside the ranks' workers on any core. The calling
    thread first, and its failure raises (OSError)."""
    os.sched_setaffinity(0, cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def can_bind() -> bool:
    return hasattr(os, "sched_setaffinity")


def bind(cpus: Sequence[int]) -> bool:
    """Keep this process (all its threads) on ``cpus``; False if this OS cannot, or
    this process may not (then nothing changed)."""
    global _before
    if not can_bind():
        return False
    before = current()
    try:
        _set_all_threads(cpus)
    except OSError:
        _set_all_threads(before)
        return False
    if _before is None:
        _before = before
    return True


@contextlib.contextmanager
def whole_node() -> Iterator[None]:
    """Every thread of this process on all of :func:`node_cpus` meanwhile."""
    if _before is None or not can_bind():
        yield
        return
    bound = current()
    _set_all_threads(_before)
    try:
        yield
    finally:
        _set_all_threads(bound)
