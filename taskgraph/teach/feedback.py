"""The answer a checker gives: a :class:`Feedback` made of :class:`Finding` s.

A wrong answer never raises (a notebook keeps running from top to bottom); it is a
list of findings, each a short message and a hint saying what to fix, at most
``MAX_PER_KIND`` of one kind (then one finding says how many more).
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from ..core.errors import TaskgraphError
from ..dsl.graph import Graph

MAX_PER_KIND = 5  # findings of one kind shown before "... and N more"


class ExerciseError(TaskgraphError):
    """Raised by :meth:`Feedback.raise_for_errors` when an answer has errors."""


@dataclass
class Finding:
    """One thing wrong (or worth knowing) about an answer."""

    kind: str  # build, cycle, missing-task, extra-task, wrong-tiles, access, order,
    # missing-dependency, needless-dependency, run, numeric, more
    message: str
    hint: str = ""
    severity: str = "error"  # or "note"
    count: int = 1  # how many problems it stands for ("... and 7 more" stands for 7)

    def __str__(self) -> str:
        mark = "✗" if self.severity == "error" else "·"
        text = f"  {mark} [{self.kind}] {self.message}"
        return text + (f"\n      hint: {self.hint}" if self.hint else "")


@dataclass(repr=False)
class Feedback:
    """What a checker found: ``ok``, the findings with hints, and the numbers."""

    exercise: str
    findings: list[Finding] = field(default_factory=list)
    error: float | None = None  # largest relative error of a tile, if the graph ran
    tolerance: float = 0.0
    worst_tile: str | None = None
    ranks: int = 1
    graph: Graph | None = None
    run: object = None  # the run of the student's graph, for run.show()

    @property
    def ok(self) -> bool:
        """Whether the answer has no error (notes may remain)."""
        return not any(f.severity == "error" for f in self.findings)

    def errors(self) -> list[Finding]:
        """The findings that are errors, not notes."""
        return [f for f in self.findings if f.severity == "error"]

    def kinds(self) -> set[str]:
        """The kinds of the findings (``"order"``, ``"access"``, ...)."""
        return {f.kind for f in self.findings}

    def _numbers(self) -> str:
        if self.error is None:
            return "numerical check: not run"
        where = f", largest in tile {self.worst_tile}" if self.worst_tile else ""
        return (
            f"numerical check: relative error {self.error:.2e} "
            f"(tolerance {self.tolerance:.1e}){where}"
        )

    def _head(self) -> str:
        size = f"{self.graph.ntasks} tasks, " if self.graph is not None else ""
        where = f"{size}{self.ranks} rank{'s' if self.ranks > 1 else ''}"
        if self.ok:
            return f"{self.exercise}: passed ✓ ({where})"
        n = sum(f.count for f in self.errors())
        return f"{self.exercise}: {n} problem{'s' if n > 1 else ''} to fix ({where})"

    def __str__(self) -> str:
        return "\n".join([self._head(), *map(str, self.findings), self._numbers()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.ok else "#cf222e"
        items = "".join(
            f"<li><b>[{html.escape(f.kind)}]</b> {html.escape(f.message)}"
            + (f"<br><i>hint: {html.escape(f.hint)}</i>" if f.hint else "")
            + "</li>"
            for f in self.findings
        )
        return (
            f'<div class="taskgraph-feedback"><div style="color:{colour};font-weight:bold">'
            f"{html.escape(self._head())}</div>"
            + (f"<ul>{items}</ul>" if items else "")
            + f"<div>{html.escape(self._numbers())}</div></div>"
        )

    def raise_for_errors(self) -> Feedback:
        """Raise :class:`ExerciseError` (with every finding) unless the answer is ok."""
        if not self.ok:
            raise ExerciseError(str(self))
        return self


def cap(findings: list[Finding]) -> list[Finding]:
    """At most MAX_PER_KIND findings of one kind, then one that says how many more."""
    count: Counter = Counter()
    out = []
    for f in findings:
        count[f.kind] += 1
        if count[f.kind] <= MAX_PER_KIND:
            out.append(f)
    for kind, n in count.items():
        if n > MAX_PER_KIND:
            out.append(
                Finding(kind, f"... and {n - MAX_PER_KIND} more like these", count=n - MAX_PER_KIND)
            )
    return out
