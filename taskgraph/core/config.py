"""Configuration: every ``TASKGRAPH_*`` environment variable is read here, and only here.

=============================  ==============================================  =========
variable                       meaning                                         default
=============================  ==============================================  =========
TASKGRAPH_MPI                  ``1``: use MPI; ``0``: never import mpi4py      auto [1]_
TASKGRAPH_MPIEXEC              the ``mpiexec`` command to launch ranks with    [2]_
TASKGRAPH_WORKERS              worker threads per rank                         cores/ranks
TASKGRAPH_BLAS_THREADS         BLAS threads per worker                         1
TASKGRAPH_MAX_SENDS            sends in flight per rank                        64
TASKGRAPH_RECV_BUDGET_MB       MiB of receives posted ahead per rank           1
TASKGRAPH_MAX_RECVS            receives posted ahead per rank (more: probed)   16
TASKGRAPH_POLL_MAX_US          longest sleep between polls of the network      250
TASKGRAPH_SPIN_US              keep polling this long after the last message   300
TASKGRAPH_SPIN_US_PER_MIB      ... and this much longer per MiB awaited        500
TASKGRAPH_CMA                  ``0``: MPICH copies large messages through      auto [3]_
                               shared memory; ``1``: one copy (CMA) always
TASKGRAPH_BIND                 ``0``: leave ranks unbound; ``auto``: bind       auto [4]_
                               each rank on a node to a share of its CPUs
TASKGRAPH_TRACE_DIR            where scripts' ``run.show()`` writes traces     .
TASKGRAPH_QUICK                ``1``: small sizes for notebooks and examples   0
=============================  ==============================================  =========

.. [1] MPI is used when the process was started by an MPI launcher (mpiexec, srun).
.. [2] the ``mpiexec`` beside the running Python (the ``mpich`` wheel puts it there),
       else the first on ``PATH``.
.. [3] one copy when this process may read another's memory (see
       :func:`taskgraph.run.singlecopy.wants_single_copy`), unless the MPI settings say
       otherwise (``MPIR_CVAR_CH4_CMA_ENABLE``).
.. [4] only where the launcher bound none of the node's ranks and there are at least
       as many CPUs as ranks (see :mod:`taskgraph.core.affinity`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .affinity import node_cpus

# variables that MPI launchers (MPICH/hydra, Open MPI, PMIx, SLURM's srun) set in ranks
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def use_mpi() -> bool:
    raw = os.environ.get("TASKGRAPH_MPI", "").strip().lower()
    if raw in ("0", "no", "false", "off"):
        return False
    if raw in ("1", "yes", "true", "on"):
        return True
    return any(v in os.environ for v in _LAUNCHER_VARS)


def mpiexec() -> str:
    raw = os.environ.get("TASKGRAPH_MPIEXEC", "").strip()
    if raw:
        return raw
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError(
            "no mpiexec found: `pip install mpich` (or load your site's MPI), "
            "or set TASKGRAPH_MPIEXEC"
        )
    return found


def cores() -> int:
    """CPUs this process may use, counted before its rank was bound to a share."""
    return len(node_cpus())


def workers(ranks_here: int) -> int:
    return max(1, _int("TASKGRAPH_WORKERS", max(1, cores() // max(1, ranks_here))))


def blas_threads() -> int:
    return max(1, _int("TASKGRAPH_BLAS_THREADS", 1))


def max_sends() -> int:
    return max(1, _int("TASKGRAPH_MAX_SENDS", 64))


def recv_budget() -> int:
    return max(1, _int("TASKGRAPH_RECV_BUDGET_MB", 1)) << 20


def max_recvs() -> int:
    return max(1, _int("TASKGRAPH_MAX_RECVS", 16))


def poll_max() -> float:
    return max(1, _int("TASKGRAPH_POLL_MAX_US", 250)) * 1e-6


def spin() -> float:
    return max(0, _int("TASKGRAPH_SPIN_US", 300)) * 1e-6


def spin_per_byte() -> float:
    """Seconds more to keep polling per byte of the receives posted: a large
    message takes long to arrive, and a rank asleep when it comes delays it."""
    return max(0, _int("TASKGRAPH_SPIN_US_PER_MIB", 500)) * 1e-6 / (1 << 20)


def cma() -> bool | None:
    """True or False when ``TASKGRAPH_CMA`` says so, None for auto."""
    raw = os.environ.get("TASKGRAPH_CMA", "").strip().lower()
    if raw in ("0", "no", "false", "off"):
        return False
    if raw in ("1", "yes", "true", "on"):
        return True
    if raw in ("", "auto"):
        return None
    raise ValueError(f"TASKGRAPH_CMA={raw!r}: use 0, 1 or auto")


def bind() -> bool:
    """False when ``TASKGRAPH_BIND`` says to leave ranks unbound."""
    raw = os.environ.get("TASKGRAPH_BIND", "").strip().lower()
    if raw in ("0", "no", "false", "off"):
        return False
    if raw in ("", "auto", "1", "yes", "true", "on"):
        return True
    raise ValueError(f"TASKGRAPH_BIND={raw!r}: use 0 or auto")


def trace_dir() -> str:
    return os.environ.get("TASKGRAPH_TRACE_DIR", "").strip() or "."


def quick() -> bool:
    return os.environ.get("TASKGRAPH_QUICK", "").strip() in ("1", "yes", "true")
