"""Pure ordering helpers on a recorded task list: successors, a topological order,
bottom levels, the critical path and the cycle that blocks an order.

They take the tasks (anything with ``id``, ``preds`` and ``cost``) and return new
lists; nothing here records tasks or keeps state, so a test can call each on a few
hand-made tasks. :class:`taskgraph.dsl.graph.Graph` caches their answers::

    tasks ──► successors ──► topological_order ──► bottom_levels ──► critical_path
                                  │ (stuck tasks)
                                  └──► find_cycle
"""

from __future__ import annotations

from collections.abc import Sequence

from .tasks import Task


def successors(tasks: Sequence[Task]) -> list[list[int]]:
    """Each task's successors, in task order: the inverse of ``preds``."""
    succ: list[list[int]] = [[] for _ in tasks]
    for t in tasks:
        for p in t.preds:
            succ[p].append(t.id)
    return succ


def topological_order(tasks: Sequence[Task], succ: list[list[int]]) -> tuple[list[int], set[int]]:
    """(a topological order of the tasks it can reach, the tasks left on or after a
    cycle); the second is empty when the graph has no cycle."""
    indeg = [len(t.preds) for t in tasks]
    ready = [t for t, n in enumerate(indeg) if n == 0]
    order = []
    while ready:
        t = ready.pop()
        order.append(t)
        for s in succ[t]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    stuck = {t for t, n in enumerate(indeg) if n > 0} if len(order) < len(tasks) else set()
    return order, stuck


def find_cycle(tasks: Sequence[Task], stuck: set[int]) -> list[int]:
    """One cycle among ``stuck`` tasks (from :func:`topological_order`), as task ids
    in the order their edges go."""
    import networkx as nx

    sub = nx.DiGraph()
    sub.add_edges_from((p, t) for t in stuck for p in tasks[t].preds if p in stuck)
    return [u for u, _ in nx.find_cycle(sub)]


def bottom_levels(tasks: Sequence[Task], order: list[int], costs: list[float]) -> list[float]:
    """The cost of the heaviest path from each task to the end of the graph,
    ``order`` being a topological order of ``tasks``."""
    level = [0.0] * len(tasks)  # the heaviest successor's level, until t is reached
    for t in reversed(order):
        lv = level[t] = costs[t] + level[t]
        for p in tasks[t].preds:
            if level[p] < lv:
                level[p] = lv
    return level


def critical_path(
    tasks: Sequence[Task], level: list[float], succ: list[list[int]]
) -> tuple[float, list[int]]:
    """(length, task ids) of the heaviest path, from the tasks' bottom ``level`` s;
    ties go to the lower task id."""
    if not tasks:
        return 0.0, []
    t = max((t for t in range(len(tasks)) if not tasks[t].preds), key=lambda t: (level[t], -t))
    path = [t]
    while succ[t]:
        t = max(succ[t], key=lambda s: (level[s], -s))
        path.append(t)
    return level[path[0]], path
