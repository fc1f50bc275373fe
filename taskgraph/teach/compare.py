"""Comparing a student's graph with a reference graph built on the same matrices.

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

from collections import Counter, defaultdict
from collections.abc import Sequence

from ..dsl.graph import Graph
from ..dsl.tasks import Ref
from .feedback import Finding, cap

_VERB = {1: "only reads", 2: "overwrites without reading", 3: "reads and overwrites"}
_MARK = {1: "r", 2: "w", 3: "rw"}


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
        return cap(findings)
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
    return cap(findings)


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
