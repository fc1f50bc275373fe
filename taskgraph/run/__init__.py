"""Run: one rank's execution of its plan (:mod:`~taskgraph.run.executor`) and the
MPI communication under it (:mod:`~taskgraph.run.comm`).
"""
