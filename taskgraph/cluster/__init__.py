"""Clusters: the public ``tg.Cluster`` factory (:mod:`~taskgraph.cluster.base`), the
job's own ranks (:mod:`~taskgraph.cluster.job`, :mod:`~taskgraph.cluster.jobrun`),
ipyparallel engines (:mod:`~taskgraph.cluster.engines`, the functions they run:
:mod:`~taskgraph.cluster.engine_side`), and how ranks are launched and watched.
"""

from .base import Cluster
from .engine_run import EngineRun
from .engines import EngineCluster
from .handle import RunHandle
from .job import IdleRun, JobCluster, Run, compile_kernels, current_cluster

__all__ = [
    "Cluster",
    "EngineCluster",
    "EngineRun",
    "IdleRun",
    "JobCluster",
    "Run",
    "RunHandle",
    "compile_kernels",
    "current_cluster",
]
