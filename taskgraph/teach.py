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

How the two graphs are compared (:func:`compare`):

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

import html
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .cluster.job import current_cluster
from .core import config
from .core.errors import GraphError, TaskgraphError
from .dsl.graph import Graph
from .dsl.tasks import Ref
from .dsl.tiled import TiledMatrix

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

MAX_PER_KIND = 5  # findings of one kind shown before "... and N more"
_VERB = {1: "only reads", 2: "overwrites without reading", 3: "reads and overwrites"}
_MARK = {1: "r", 2: "w", 3: "rw"}


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
        return not any(f.severity == "error" for f in self.findings)

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def kinds(self) -> set[str]:
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


# -- the references ---------------------------------------------------------------------


def reference_lu(A, name: str = "lu-reference") -> Graph:
    """Right-looking tiled LU without pivoting of A (in place: unit L below, U above)."""
    from taskgraph.kernels.teaching import gemm_nn, getrf_nopiv, trsm_lower_unit, trsm_upper_right

    with Graph(name) as g:
        for k in range(A.nt):
            getrf_nopiv(A[k, k].rw)
            for j in range(k + 1, A.nt):
                trsm_lower_unit(A[k, k].r, A[k, j].rw)
            for i in range(k + 1, A.mt):
                trsm_upper_right(A[k, k].r, A[i, k].rw)
            for i in range(k + 1, A.mt):
                for j in range(k + 1, A.nt):
                    gemm_nn(A[i, k].r, A[k, j].r, A[i, j].rw)
    return g


def reference_jacobi(U, V, steps: int, name: str = "jacobi-reference") -> Graph:
    """``steps`` Jacobi sweeps on a periodic grid, U -> V -> U ... (ping-pong)."""
    from taskgraph.kernels.teaching import jacobi_step

    mt, nt = U.mt, U.nt
    with Graph(name) as g:
        src, dst = U, V
        for _ in range(steps):
            for i in range(mt):
                for j in range(nt):
                    jacobi_step(
                        src[i, j].r,
                        src[(i - 1) % mt, j].r,
                        src[(i + 1) % mt, j].r,
                        src[i, (j - 1) % nt].r,
                        src[i, (j + 1) % nt].r,
                        dst[i, j].w,
                    )
            src, dst = dst, src
    return g


def lu_nopiv_numpy(a: np.ndarray) -> np.ndarray:
    """LU without pivoting in float64, unblocked: L (unit, below) and U in one array."""
    f = np.array(a, dtype=np.float64)
    for k in range(f.shape[0] - 1):
        f[k + 1 :, k] /= f[k, k]
        f[k + 1 :, k + 1 :] -= np.outer(f[k + 1 :, k], f[k, k + 1 :])
    return f


def jacobi_numpy(u: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` Jacobi sweeps of the 5-point average on a periodic grid, in float64."""
    u = np.array(u, dtype=np.float64)
    for _ in range(steps):
        u = 0.25 * (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1))
    return u


# -- the checkers -------------------------------------------------------------------------


def check_lu(
    lu: Callable,
    *,
    n: int | None = None,
    tile: int | None = None,
    cluster=None,
    dtype=np.float64,
    seed: int = 0,
    timeout: float = 60,
) -> Feedback:
    """Check ``lu(A) -> Graph``, a tiled LU without pivoting of A in place.

    The checker makes a random diagonally dominant n x n matrix (``TASKGRAPH_QUICK=1``:
    64 with tiles of 16; else 192 with tiles of 32) on ``cluster`` (this process when
    None), builds and runs the student's graph, and compares graph and numbers with
    :func:`reference_lu` and :func:`lu_nopiv_numpy`.
    """
    _check_callable(lu, "lu")
    n, tile = _sizes(n, tile, quick=(64, 16), full=(192, 32))
    cluster = _cluster(cluster)
    rng = np.random.default_rng(seed)
    a = (rng.random((n, n)) + n * np.eye(n)).astype(dtype)
    A = TiledMatrix.from_numpy(a, tile=tile, name="A", cluster=cluster)
    fb = Feedback("LU without pivoting", ranks=cluster.size)
    g = _build(fb, lu, (A,), [A])
    if g is None:
        return fb
    fb.findings += compare(g, reference_lu(A), commuting=("gemm_nn",))
    if _run(fb, cluster, g, timeout):
        expected = lu_nopiv_numpy(a)
        _numbers(fb, A, _collect(A), expected, _tolerance(dtype, n))
    return fb


def check_jacobi(
    jacobi: Callable,
    *,
    n: int | None = None,
    tile: int | None = None,
    steps: int | None = None,
    cluster=None,
    dtype=np.float64,
    seed: int = 0,
    timeout: float = 60,
) -> Feedback:
    """Check ``jacobi(U, V, steps) -> Graph``: ``steps`` sweeps, ping-pong between U and V.

    ``steps`` is even, so the answer is back in U. The grid is periodic (it wraps
    around); ``TASKGRAPH_QUICK=1``: 64 x 64 in tiles of 16, 4 steps; else 128 x 128
    in tiles of 32, 6 steps.
    """
    _check_callable(jacobi, "jacobi")
    n, tile = _sizes(n, tile, quick=(64, 16), full=(128, 32))
    steps = steps if steps is not None else (4 if config.quick() else 6)
    if steps < 2 or steps % 2:
        raise ValueError(f"steps must be even and at least 2 (the answer is in U), not {steps}")
    cluster = _cluster(cluster)
    u = np.random.default_rng(seed).random((n, n)).astype(dtype)
    U = TiledMatrix.from_numpy(u, tile=tile, name="U", cluster=cluster)
    V = TiledMatrix.zeros((n, n), tile, dtype, name="V", cluster=cluster)
    fb = Feedback("2-D Jacobi with halo exchange", ranks=cluster.size)
    g = _build(fb, jacobi, (U, V, steps), [U, V])
    if g is None:
        return fb
    fb.findings += compare(g, reference_jacobi(U, V, steps))
    if _run(fb, cluster, g, timeout):
        _numbers(fb, U, _collect(U), jacobi_numpy(u, steps), 50 * float(np.finfo(dtype).eps))
    return fb


def _check_callable(fn, what: str) -> None:
    if not callable(fn) or isinstance(fn, Graph):
        raise TypeError(
            f"pass the function that builds the graph (check_{what}({what})), "
            f"not {type(fn).__name__}"
        )


def _sizes(n, tile, *, quick, full) -> tuple[int, int]:
    dn, dt = quick if config.quick() else full
    n, tile = n or dn, tile or dt
    if n < 1 or tile < 1:
        raise ValueError(f"n ({n}) and tile ({tile}) must be positive")
    return n, tile


def _cluster(cluster):
    return cluster if cluster is not None else current_cluster()


def _tolerance(dtype, n: int) -> float:
    return 100 * n * float(np.finfo(dtype).eps)


def _collect(M) -> np.ndarray:
    out = M.gather() if M.remote else M.to_numpy()
    assert out is not None
    return out


def _build(fb: Feedback, fn: Callable, args: tuple, matrices: list) -> Graph | None:
    """Call the student's function; turn whatever goes wrong into findings."""
    name = getattr(fn, "__name__", "your function")
    try:
        g = fn(*args)
    except GraphError as exc:
        fb.findings.append(_graph_error(str(exc)))
        return None
    except Exception as exc:  # noqa: BLE001 - a bug in an answer is feedback, not a crash
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
        fb.findings.append(
            Finding(
                "build",
                f"{name}() raised {type(exc).__name__}: {exc}{where}",
                "fix this error first; the checker calls your function on fresh matrices",
            )
        )
        return None
    if not isinstance(g, Graph):
        fb.findings.append(
            Finding(
                "build",
                f"{name}() returned {type(g).__name__}, not a tg.Graph",
                "build the tasks inside `with tg.Graph() as g:` and end with `return g`",
            )
        )
        return None
    fb.graph = g
    mine = {m.uid for m in matrices}
    others = [m.name for m in g.matrices() if m.uid not in mine]
    if others:
        given = ", ".join(m.name for m in matrices)
        fb.findings.append(
            Finding(
                "build",
                f"your graph works on matrix {', '.join(others)}, not only on {given}",
                f"use the matrices your function is given ({given}); do not make new ones",
            )
        )
    return g


def _graph_error(text: str) -> Finding:
    if "is marked ." in text:
        fix = text.rsplit(": ", 1)[-1]
        return Finding(
            "access",
            text,
            f"{fix}: a kernel declares how it uses each tile, and the marks at the call "
            "(.r, .w, .rw) must agree with it",
        )
    return Finding("build", text, "the graph could not be built: fix the call it names")


def _run(fb: Feedback, cluster, g: Graph, timeout: float) -> bool:
    """Run the student's graph unless it cannot run; False if it did not run to the end."""
    if any(f.kind in ("cycle", "build") for f in fb.findings):
        return False
    try:
        run = cluster.run(g)
    except TaskgraphError as exc:
        fb.findings.append(Finding("run", f"the graph cannot run: {exc}", "fix the graph first"))
        return False
    fb.run = run
    try:
        run.wait(timeout)
    except TimeoutError:
        run.cancel()
        fb.findings.append(Finding("run", f"the run took longer than {timeout} s", "was it stuck?"))
        return False
    except TaskgraphError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fb.findings.append(
            Finding("run", f"a task failed: {first}", "the task named here raised; see its error")
        )
        return False
    return True


def _numbers(fb: Feedback, M, got: np.ndarray, expected: np.ndarray, tol: float) -> None:
    scale = float(np.linalg.norm(expected)) or 1.0
    worst, where = -1.0, (0, 0)
    for i in range(M.mt):
        for j in range(M.nt):
            diff = M.block(got, i, j).astype(np.float64) - M.block(expected, i, j)
            e = float(np.linalg.norm(diff)) / scale
            if not np.isfinite(e):
                e = np.inf
            if e > worst:
                worst, where = e, (i, j)
    fb.error, fb.tolerance = worst, tol
    fb.worst_tile = f"{M.name}[{where[0]},{where[1]}]"
    if worst > tol:
        structural = [f for f in fb.errors() if f.kind not in ("numeric",)]
        hint = (
            "fix the findings above first: they explain the numbers"
            if structural
            else f"look at the tasks that write {fb.worst_tile}, and at the order of your loops"
        )
        fb.findings.append(
            Finding(
                "numeric",
                f"the result differs from NumPy's: relative error {worst:.2e} > {tol:.1e}, "
                f"largest in tile {fb.worst_tile}",
                hint,
            )
        )


# -- comparing graphs ----------------------------------------------------------------------


def _refs(g: Graph, tid: int) -> list[Ref]:
    return [a for a in g.tasks[tid].args if isinstance(a, Ref)]


def _keys(g: Graph) -> list[tuple]:
    """(kernel, data keys, occurrence) of every task: how tasks are matched."""
    seen: Counter = Counter()
    out = []
    for t in g.tasks:
        base = (t.name, tuple(g.data[r.data].key or ("value",) for r in _refs(g, t.id)))
        out.append((*base, seen[base]))
        seen[base] += 1
    return out


def _dag(g: Graph):
    import networkx as nx

    d = nx.DiGraph()
    d.add_nodes_from(range(g.ntasks))
    d.add_edges_from((p, t.id) for t in g.tasks for p in t.preds)
    return d


def _modes(g: Graph, tid: int) -> dict:
    out: dict = {}
    for r in _refs(g, tid):
        out[g.data[r.data].key] = out.get(g.data[r.data].key, 0) | r.mode
    return out


def _call(g: Graph, tid: int) -> str:
    """How to write the task: ``trsm_lower_unit(A[0,0].r, A[0,1].rw)``."""
    parts = [f"{g.data[r.data].label()}.{_MARK[r.mode]}" for r in _refs(g, tid)]
    return f"{g.tasks[tid].name}({', '.join(parts)})"


def compare(student: Graph, reference: Graph, *, commuting: Sequence[str] = ()) -> list[Finding]:
    """Findings that tell ``student`` from ``reference`` (both built on the same matrices)."""
    import networkx as nx

    findings: list[Finding] = []
    skeys, rkeys = _keys(student), _keys(reference)
    r_of = {k: t for t, k in enumerate(rkeys)}
    s_of = {k: t for t, k in enumerate(skeys)}
    missing = [r_of[k] for k in rkeys if k not in s_of]
    extra = [s_of[k] for k in skeys if k not in r_of]
    findings += _task_findings(student, reference, missing, extra)
    match = {s_of[k]: r_of[k] for k in skeys if k in r_of}
    for s, r in match.items():
        findings += _access_findings(student, reference, s, r)
    sdag = _dag(student)
    if not nx.is_directed_acyclic_graph(sdag):
        findings.append(_cycle_finding(student, sdag))
        return _cap(findings)
    sreach = nx.transitive_closure_dag(sdag)
    rdag = _dag(reference)
    rreach = nx.transitive_closure_dag(rdag)
    r_to_s = {r: s for s, r in match.items()}
    for a, b in nx.transitive_reduction(rdag).edges:
        sa, sb = r_to_s.get(a), r_to_s.get(b)
        if sa is None or sb is None or sreach.has_edge(sa, sb):
            continue
        if _commute(reference, a, b, commuting):
            continue
        findings.append(_order_finding(student, reference, sa, sb, a, b, sreach.has_edge(sb, sa)))
    for t in student.tasks:
        for p in t.preds:
            rp, rt = match.get(p), match.get(t.id)
            if rp is None or rt is None or rreach.has_edge(rp, rt) or rreach.has_edge(rt, rp):
                continue
            if _commute(reference, rp, rt, commuting):
                continue
            findings.append(_needless_finding(student, reference, p, t.id, rp, rt))
    return _cap(findings)


def _commute(g: Graph, a: int, b: int, commuting: Sequence[str]) -> bool:
    """Two updates of one tile by a commuting kernel, sharing nothing else they write."""
    ta, tb = g.tasks[a], g.tasks[b]
    if ta.name not in commuting or tb.name != ta.name:
        return False
    return {d for d, _ in ta.writes} == {d for d, _ in tb.writes}


def _task_findings(student, reference, missing, extra) -> list[Finding]:
    out: list[Finding] = []
    paired: set[int] = set()
    for s in extra:  # same kernel and written tiles as a missing task: wrong tiles
        written = {student.data[d].key for d, _ in student.tasks[s].writes}
        for r in missing:
            if r in paired or reference.tasks[r].name != student.tasks[s].name:
                continue
            if {reference.data[d].key for d, _ in reference.tasks[r].writes} == written:
                paired.add(r)
                given, wanted = _refs(student, s), _refs(reference, r)
                differ = [
                    str(i + 1)
                    for i, (a, b) in enumerate(zip(given, wanted))
                    if student.data[a.data].key != reference.data[b.data].key
                ] or ["count"]
                out.append(
                    Finding(
                        "wrong-tiles",
                        f"task {student.label(s)} uses the wrong tiles "
                        f"(argument {', '.join(differ)})",
                        f"it should be {_call(reference, r)}",
                    )
                )
                break
        else:
            name = student.tasks[s].name
            known = name in {t.name for t in reference.tasks}
            out.append(
                Finding(
                    "extra-task",
                    f"task {student.label(s)} is not part of the algorithm",
                    "remove it, or check its loop bounds"
                    if known
                    else f"this exercise does not use {name}: use the kernels it names",
                )
            )
    by_kernel: dict[str, list[int]] = defaultdict(list)
    for r in missing:
        if r not in paired:
            by_kernel[reference.tasks[r].name].append(r)
    for name, tids in by_kernel.items():
        examples = ", ".join(_call(reference, r) for r in tids[:3])
        more = f" and {len(tids) - 3} more" if len(tids) > 3 else ""
        what = f"{len(tids)} {name} task{'s are' if len(tids) > 1 else ' is'}"
        out.append(
            Finding(
                "missing-task",
                f"{what} missing: {examples}{more}",
                f"add the {name} call{'s' if len(tids) > 1 else ''} to your loops, "
                f"e.g. {_call(reference, tids[0])}",
            )
        )
    return out


def _access_findings(student, reference, s: int, r: int) -> list[Finding]:
    out = []
    for i, (sr, rr) in enumerate(zip(_refs(student, s), _refs(reference, r))):
        if sr.mode != rr.mode:
            tile = student.data[sr.data].label()
            name = student.tasks[s].name
            out.append(
                Finding(
                    "access",
                    f"task {student.label(s)} marks {tile} (argument {i + 1}) as "
                    f".{_MARK[sr.mode]}, but {name} {_VERB[rr.mode]} it",
                    f"mark it .{_MARK[rr.mode]} (declare {name} with that mode): with a wrong "
                    "mark the graph misses or invents dependencies",
                )
            )
    return out


def _shared(g: Graph, a: int, b: int) -> list[tuple[str, int, int]]:
    """(tile, mode in a, mode in b) for data both tasks touch, one of them writing."""
    ma, mb = _modes(g, a), _modes(g, b)
    out = []
    for key in ma.keys() & mb.keys():
        if (ma[key] | mb[key]) & 2:
            label = next(g.data[r.data].label() for r in _refs(g, a) if g.data[r.data].key == key)
            out.append((label, ma[key], mb[key]))
    return out


def _order_finding(student, reference, sa, sb, a, b, reversed_: bool) -> Finding:
    """The reference runs a before b (they share a tile); the student's graph does not."""
    first, then = student.label(sa), student.label(sb)
    shared = _shared(reference, a, b)
    tile, ma, mb = shared[0] if shared else ("their tiles", 3, 3)
    if ma & 2 and mb & 1:
        what = f"reads {tile} before {first} wrote it"
    elif ma & 1:
        what = f"overwrites {tile} before {first} read it"
    else:
        what = f"writes {tile} before {first} did"
    if reversed_:
        return Finding(
            "order",
            f"task {then} {what}",
            f"call {first} before {then}: check the order of the calls in your loops",
        )
    mark = {student.data[r.data].label(): r.mode for r in _refs(student, sa)}.get(tile, 0)
    writes_there = bool(mark & 2)
    hint = (
        f"{first} must mark {tile} as .{_MARK[ma]}: a task that writes a tile must say so"
        if ma & 2 and not writes_there
        else f"nothing orders {then} after {first}: check the marks of {tile} in both"
    )
    return Finding("missing-dependency", f"task {then} {what} (no dependency)", hint)


def _needless_finding(student, reference, p, t, rp, rt) -> Finding:
    first, then = student.label(p), student.label(t)
    shared = _shared(student, p, t)
    if not shared:
        return Finding(
            "needless-dependency",
            f"task {then} waits for {first}, though they share no tile",
            f"remove g.add_dependency({first}, {then}): the marks already give every "
            "dependency the algorithm needs, and this one only serialises the two tasks",
        )
    tile = shared[0][0]
    return Finding(
        "needless-dependency",
        f"task {then} waits for {first} because of {tile}, which the algorithm does not need",
        f"mark {tile} .r where a task only reads it: a write mark serialises {first} and {then}",
    )


def _cycle_finding(g: Graph, dag) -> Finding:
    import networkx as nx

    cycle = [u for u, _ in nx.find_cycle(dag)]
    names = " -> ".join(g.label(t) for t in [*cycle, cycle[0]])
    explicit = [(u, v) for u, v in zip(cycle, cycle[1:] + cycle[:1]) if not _shared(g, u, v)]
    hint = (
        "remove "
        + ", ".join(f"g.add_dependency({g.label(u)}, {g.label(v)})" for u, v in explicit)
        + ": it points backwards, so no task of the cycle can ever start"
        if explicit
        else "a dependency points backwards: no task of the cycle can ever start"
    )
    return Finding("cycle", f"the graph has a cycle: {names}", hint)


def _cap(findings: list[Finding]) -> list[Finding]:
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
