"""What a graph would do on N ranks, from the plan alone: nothing runs.

``graph.preview(ranks=4)`` places the graph on 4 ranks (each matrix keeps its kind of
distribution, re-dealt over 4 ranks) and reports what the plan predicts:

* tasks per rank, and the flops each rank would compute;
* messages and bytes from each rank to each rank;
* the DAG, drawn layer by layer (a task's layer is its longest distance from a
  source), each task coloured by the rank that would run it.

In a notebook the preview displays itself as HTML with an SVG drawing; elsewhere
``print(preview)`` gives the same figures as text.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..dsl.graph import use_previewer
from .planner import make_plan

# one colour per rank (cycled), readable on white
RANK_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

DRAW_LIMIT = 1500  # tasks; a bigger DAG is summarised, not drawn


def owner_for(nranks: int):
    """``tile -> rank`` as each tile's matrix would deal it over ``nranks`` ranks."""
    owners: dict[int, Callable[[int, int], int]] = {}

    def owner(tile) -> int:
        m = tile.matrix
        fn = owners.get(m.uid)
        if fn is None:
            fn = owners[m.uid] = m.owners_on(nranks)
        return fn(tile.i, tile.j)

    return owner


@dataclass
class Preview:
    """The predicted placement and traffic of a graph on ``nranks`` ranks."""

    graph: object
    plan: object
    nranks: int
    tasks: list[int]  # per rank
    flops: list[float]  # per rank
    messages: np.ndarray  # count, [src, dst]
    bytes: np.ndarray  # [src, dst]

    @property
    def total_messages(self) -> int:
        return int(self.messages.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.bytes.sum())

    def summary(self) -> dict:
        return {
            "graph": getattr(self.graph, "name", "graph"),
            "ranks": self.nranks,
            "tasks": sum(self.tasks),
            "tasks_per_rank": list(self.tasks),
            "flops_per_rank": list(self.flops),
            "messages": self.messages.tolist(),
            "bytes": self.bytes.tolist(),
            "total_messages": self.total_messages,
            "total_bytes": self.total_bytes,
        }

    def __str__(self) -> str:
        lines = [
            f"preview of {getattr(self.graph, 'name', 'graph')} on {self.nranks} ranks: "
            f"{sum(self.tasks)} tasks, {self.total_messages} messages, "
            f"{_mib(self.total_bytes)} between ranks"
        ]
        for r in range(self.nranks):
            lines.append(
                f"  rank {r}: {self.tasks[r]} tasks, {self.flops[r] / 1e9:.2f} GFLOP, sends "
                + ", ".join(
                    f"{int(self.messages[r, d])} msg / {_mib(int(self.bytes[r, d]))} to {d}"
                    for d in range(self.nranks)
                    if d != r and self.messages[r, d]
                )
                if self.messages[r].sum()
                else f"  rank {r}: {self.tasks[r]} tasks, {self.flops[r] / 1e9:.2f} GFLOP, "
                "sends nothing"
            )
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = html.escape(str(self).splitlines()[0])
        rows = "".join(
            "<tr><th>rank "
            + str(r)
            + f'<span style="color:{colour(r)}"> ■</span></th><td>{self.tasks[r]}</td>'
            + "".join(
                f"<td>{int(self.messages[r, d])} / {_mib(int(self.bytes[r, d]))}</td>"
                if d != r
                else "<td>–</td>"
                for d in range(self.nranks)
            )
            + "</tr>"
            for r in range(self.nranks)
        )
        cols = "".join(f"<th>to {d}</th>" for d in range(self.nranks))
        table = (
            '<table style="border-collapse:collapse;font:12px sans-serif" cellpadding="3">'
            f"<tr><th></th><th>tasks</th>{cols}</tr>{rows}</table>"
            "<div style='font:11px sans-serif;color:#555'>messages / bytes, "
            "from the plan alone</div>"
        )
        return f"<div><b>{head}</b>{table}{self.svg()}</div>"

    def svg(self, width: int = 900) -> str:
        """The DAG layer by layer, each task coloured by its rank ('' if too big)."""
        g = self.graph
        n = len(g.tasks)  # type: ignore[attr-defined]
        if n == 0:
            return "<div>(empty graph)</div>"
        if n > DRAW_LIMIT:
            return f"<div style='font:11px sans-serif'>({n} tasks: too many to draw)</div>"
        layers = layer_of(g)
        depth = max(layers) + 1
        rows: list[list[int]] = [[] for _ in range(depth)]
        for t, lay in enumerate(layers):
            rows[lay].append(t)
        widest = max(len(r) for r in rows)
        dx = max(6.0, min(28.0, (width - 20) / max(widest, 1)))
        dy = 28.0
        pos: dict[int, tuple[float, float]] = {}
        for lay, row in enumerate(rows):
            x0 = 10 + (width - 20 - dx * len(row)) / 2
            for k, t in enumerate(row):
                pos[t] = (x0 + dx * (k + 0.5), 14 + dy * lay)
        placement = self.plan.placement  # type: ignore[attr-defined]
        edges = []
        for t, succ in enumerate(g.successors()):  # type: ignore[attr-defined]
            x1, y1 = pos[t]
            for s in succ:
                x2, y2 = pos[s]
                cross = placement[t] != placement[s]
                edges.append(
                    f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                    f'stroke="{"#d33" if cross else "#bbb"}" stroke-width="'
                    f'{"1.2" if cross else "0.6"}"/>'
                )
        r = max(2.0, min(7.0, dx / 3))
        nodes = [
            f'<circle cx="{pos[t][0]:.1f}" cy="{pos[t][1]:.1f}" r="{r:.1f}" '
            f'fill="{colour(placement[t])}"><title>{html.escape(g.label(t))} '  # type: ignore[attr-defined]
            f"on rank {placement[t]}</title></circle>"
            for t in range(n)
        ]
        height = int(28 + dy * (depth - 1))
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'class="taskgraph-preview">{"".join(edges)}{"".join(nodes)}</svg>'
            "<div style='font:11px sans-serif;color:#555'>tasks by layer, coloured by rank; "
            "red edges cross ranks (messages)</div>"
        )


def colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def layer_of(graph) -> list[int]:
    """Each task's longest distance (in edges) from a task with no predecessor."""
    layers = [0] * len(graph.tasks)
    succ = graph.successors()
    for t in graph.order():
        for s in succ[t]:
            if layers[s] < layers[t] + 1:
                layers[s] = layers[t] + 1
    return layers


def preview(graph, ranks: int | None = None) -> Preview:
    """Plan ``graph`` on ``ranks`` ranks (default: its matrices' rank count) and
    report the predicted placement and traffic."""
    mats = graph.matrices()
    if ranks is None:
        ranks = mats[0].nranks if mats else 1
    if ranks < 1:
        raise ValueError(f"preview needs at least one rank, got {ranks}")
    plan = make_plan(graph, ranks, owner=owner_for(ranks))
    tasks = [0] * ranks
    flops = [0.0] * ranks
    for t, c in enumerate(graph.costs()):
        r = plan.placement[t]
        tasks[r] += 1
        flops[r] += c
    msgs = np.zeros((ranks, ranks), np.int64)
    nbytes = np.zeros((ranks, ranks), np.int64)
    for m in plan.messages:
        msgs[m.src, m.dst] += 1
        nbytes[m.src, m.dst] += m.nbytes
    return Preview(graph, plan, ranks, tasks, flops, msgs, nbytes)


def _mib(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024**2:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024**2:.1f} MiB"


use_previewer(preview)  # g.preview() (the graph layer cannot import this one)
