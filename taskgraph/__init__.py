"""taskgraph: build task graphs in Python, run them on MPI ranks, watch them run.

import taskgraph as tg
from taskgraph.kernels import potrf, trsm, syrk, gemm

A = tg.TiledMatrix.random_spd(4096, tile=512)
with tg.Graph("cholesky") as g:
    for k in range(A.nt):
        potrf(A[k, k].rw)
        ...
tg.Cluster().run(g).wait()
"""

from . import teach
from .cluster import Cluster, JobCluster, Run, compile_kernels, current_cluster
from .cluster.submit import EngineFuture, as_completed, wait
from .core.errors import (
    ExecutableError,
    GraphError,
    NotPositiveDefiniteError,
    PlanError,
    RemoteTraceback,
    RunError,
    TaskError,
    TaskgraphError,
)
from .dsl.access import Access, Mode
from .dsl.datadeps import Data, r, rw, w
from .dsl.exe import ExeResult, exe, shell
from .dsl.graph import Graph, task
from .dsl.kernel import Kernel, kernel
from .dsl.tasks import Future, TaskRef
from .dsl.tiled import Tile, TiledMatrix, TiledVector
from .plan.planner import Plan, RankPlan, make_plan
from .run.attempts import TaskSkipped
from .run.dynamic import SpawnedTaskError, SpawnFuture, spawn
from .trace.events import Trace, TraceError

__version__ = "0.1.0"

__all__ = [
    "Access",
    "Cluster",
    "Data",
    "EngineFuture",
    "ExeResult",
    "ExecutableError",
    "JobCluster",
    "Future",
    "Graph",
    "GraphError",
    "Kernel",
    "Mode",
    "NotPositiveDefiniteError",
    "Plan",
    "PlanError",
    "RankPlan",
    "RemoteTraceback",
    "Run",
    "RunError",
    "SpawnFuture",
    "SpawnedTaskError",
    "TaskError",
    "TaskRef",
    "TaskSkipped",
    "TaskgraphError",
    "Tile",
    "TiledMatrix",
    "TiledVector",
    "Trace",
    "TraceError",
    "as_completed",
    "compile_kernels",
    "current_cluster",
    "exe",
    "kernel",
    "make_plan",
    "r",
    "rw",
    "shell",
    "spawn",
    "task",
    "teach",
    "w",
    "wait",
]
