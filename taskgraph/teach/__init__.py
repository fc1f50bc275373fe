"""Auto-checked exercises: the student writes a graph, the checker answers with hints.

A student writes a function that builds a task graph on the matrices it is given
(``lu(A) -> Graph``, ``jacobi(U, V, steps) -> Graph``); a checker calls it on fresh
small matrices, compares the graph with a reference graph it builds itself, runs it
(in this process, or on the cluster it is given), and compares the numbers with NumPy::

    student function ──► student graph ──┐
                                          ├─► compare(): tasks, marks, dependencies
    checker ──────────► reference graph ─┘
    student graph ──► cluster.run() ──► gather ──► relative error vs NumPy, worst tile

The answer is a :class:`Feedback`: ``ok``, and a list of :class:`Finding` s, each a
short message and a hint saying what to fix. A wrong answer never raises (a notebook
keeps running from top to bottom); only misuse of the checker does.

How the two graphs are compared is in :mod:`taskgraph.teach.compare`: tasks matched
by kernel and tiles, marks, dependencies against the reference's transitive reduction,
and cycles named. The answer (:class:`Feedback`) is in :mod:`taskgraph.teach.feedback`,
the checkers and their references in :mod:`taskgraph.teach.exercises`.
"""

from __future__ import annotations

from .compare import compare
from .exercises import (
    check_jacobi,
    check_lu,
    jacobi_numpy,
    lu_nopiv_numpy,
    reference_jacobi,
    reference_lu,
)
from .feedback import ExerciseError, Feedback, Finding

__all__ = [
    "ExerciseError",
    "Feedback",
    "Finding",
    "check_jacobi",
    "check_lu",
    "compare",
    "jacobi_numpy",
    "lu_nopiv_numpy",
    "reference_jacobi",
    "reference_lu",
]
