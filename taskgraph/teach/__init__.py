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

How the two graphs are compared (:func:`compare`, in :mod:`taskgraph.teach.compare`):

* tasks are matched by (kernel name, tiles), the k-th such call with the k-th:
  reference tasks with no match are *missing*, the student's with no match *extra*,
  and a pair with the same kernel and written tile is one task with *wrong tiles*;
* for matched tasks, the mark of every argument must equal the reference's (*access*);
* every edge of the reference's transitive reduction must be a path in the student's
  graph: if the opposite path exists the tasks run in the wrong *order*, otherwise a
  *missing dependency*; every student edge must be a path in the reference, or it is
  a *needless dependency* (an explicit ``add_dependency``, or a mark that writes
  where reading is enough); updates that commute (``gemm_nn`` into one tile) may come
  in any order;
* a cycle is named, with the explicit dependencies on it to remove.
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
