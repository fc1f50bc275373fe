"""What the attempt rows of a run say, as RADICAL-Pilot draws a many-task run.

Pure functions of merged attempt rows (``[rank, worker, label, task, attempt, state,
ready, launched, started, ended, cores]``, see :mod:`taskgraph.trace.recorder`): the
attempts as a table, the overheads of each attempt, the state of every core over time,
and the state counts. :class:`~taskgraph.trace.events.Trace` calls them.

The stamps of an attempt split its life into RADICAL-Pilot's steps::

    ready ──wait──> launched ──launch──> started ──run──> ended
    (could start)   (scheduled: cores     (its code runs)   (done, failed or retried)
                     taken, launch began)

A rank has ``slots`` cores (its core count where known, else its worker count: one
slot per worker). An attempt holding ``cores=c`` occupies ``c`` slots from
``launched`` to ``ended``: ``launching`` until ``started``, then ``running``. A slot
holding nothing is ``overhead`` (runtime overhead) while an attempt on its rank was
ready but not yet launched (the runtime, its throttle or its packing kept the core
empty), else ``idle`` (no work to give it).
"""

from __future__ import annotations

from typing import Any

LAUNCHING, RUNNING, IDLE, OVERHEAD = "launching", "running", "idle", "overhead"
CORE_STATES = (LAUNCHING, RUNNING, IDLE, OVERHEAD)
FIELDS = (
    "rank",
    "worker",
    "label",
    "task",
    "attempt",
    "state",
    "ready",
    "launched",
    "started",
    "ended",
    "cores",
)
STEPS = ("wait", "launch", "run", "total")  # ready->launched->started->ended; ready->ended


def median(xs: list[float]) -> float:
    """The median of ``xs`` (0.0 for none)."""
    s = sorted(xs)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def attempts_table(rows: list[list]) -> list[dict]:
    """One dict per attempt row, keyed by :data:`FIELDS`."""
    return [dict(zip(FIELDS, row)) for row in rows]


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def overheads(rows: list[list]) -> dict:
    """Per attempt that ran: seconds waiting (ready -> launched), launching (launched ->
    started), running (started -> ended) and in all (ready -> ended); and the median of
    each over those attempts. ``{"rows": [...], "median": {...}, "count": n}``."""
    out = []
    for r in rows:
        ready, launched, started, ended = r[6:10]
        if started is None or ended is None:
            continue  # skipped, or taken from a checkpoint: never ran
        launched = started if launched is None else launched
        ready = launched if ready is None else ready
        steps = (_span(ready, launched), _span(launched, started), _span(started, ended))
        out.append(
            {
                "rank": r[0],
                "label": r[2],
                "attempt": r[4],
                "state": r[5],
                "wait": steps[0],
                "launch": steps[1],
                "run": steps[2],
                "total": _span(ready, ended),
            }
        )
    med = {k: median([row[k] for row in out]) for k in STEPS}
    return {"rows": out, "median": med, "count": len(out)}


def _assign(spans: list[tuple[float, float, float, int]], slots: int) -> list[list[tuple]]:
    """Each slot's (launched, started, ended) spans: an attempt takes the ``cores``
    slots free the longest at its launch (the lowest first among those free)."""
    lanes: list[list[tuple]] = [[] for _ in range(slots)]
    free_at = [float("-inf")] * slots
    for launched, started, ended, cores in sorted(spans):
        # free ones first, lowest index; else (oversubscribed) the soonest free
        busy = [free_at[i] > launched + 1e-9 for i in range(slots)]
        free = sorted(range(slots), key=lambda i: (busy[i], free_at[i] if busy[i] else 0.0, i))
        for i in free[: min(max(1, cores), slots)]:
            lanes[i].append((launched, started, ended))
            free_at[i] = max(free_at[i], ended)
    return lanes


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _gap(a: float, b: float, waiting: list[tuple[float, float]]) -> list[list]:
    """A free stretch ``[a, b)`` of a slot: overhead where work waited, else idle."""
    out: list[list] = []
    t = a
    for wa, wb in waiting:
        lo, hi = max(a, wa), min(b, wb)
        if hi <= lo:
            continue
        if lo > t:
            out.append([t, lo, IDLE])
        out.append([lo, hi, OVERHEAD])
        t = hi
    if b > t:
        out.append([t, b, IDLE])
    return out


def _lane(spans: list[tuple], end: float, waiting: list[tuple[float, float]]) -> list[list]:
    """One slot's ``[start, end, state]`` pieces over ``[0, end)``."""
    out: list[list] = []
    t = 0.0
    for launched, started, ended in spans:
        launched = max(launched, t)  # (a slot given twice at once: its later call waits)
        out += _gap(t, launched, waiting)
        if started > launched:
            out.append([launched, min(started, max(ended, launched)), LAUNCHING])
        if ended > max(started, launched):
            out.append([max(started, launched), ended, RUNNING])
        t = max(t, ended)
    out += _gap(t, end, waiting)
    return [p for p in out if p[1] > p[0]]


def core_states(rows: list[list], slots: list[int], end: float) -> dict:
    """The state of every core over ``[0, end)``: ``slots[r]`` cores on rank ``r``
    (see the module's note). ``{"lanes": [{"rank", "slot", "spans": [[t0, t1,
    state], ...]}], "seconds": {state: total}, "utilisation": running / (cores x
    end)}``."""
    lanes = []
    seconds = dict.fromkeys(CORE_STATES, 0.0)
    for rank, nslots in enumerate(slots):
        mine = [r for r in rows if r[0] == rank]
        spans = [
            (r[7] if r[7] is not None else r[8], r[8], r[9], r[10])
            for r in mine
            if r[8] is not None and r[9] is not None
        ]
        waiting = _union([(r[6], r[7]) for r in mine if r[6] is not None and r[7] is not None])
        for slot, lane in enumerate(_assign(spans, max(1, nslots))):
            pieces = _lane(lane, end, waiting)
            for a, b, st in pieces:
                seconds[st] += b - a
            lanes.append({"rank": rank, "slot": slot, "spans": pieces})
    total = sum(max(1, n) for n in slots) * end
    return {
        "lanes": lanes,
        "seconds": seconds,
        "utilisation": seconds[RUNNING] / total if total > 0 else 0.0,
    }


def state_counts(rows: list[list], tasks: int, running: int | None) -> dict[str, Any]:
    """Calls pending, running, done (``checkpointed``: of them, taken from the
    checkpoint), failed, skipped, and the retries so far. ``tasks``: the static tasks
    of the graph (a static task is pending until its last attempt's row comes; a
    submitted call is known only once it ends); ``running``: attempts started and not
    ended, as the ranks report them (None: unknown)."""
    final: dict[tuple, str] = {}
    retries = 0
    for r in rows:
        if r[5] == "retried":
            retries += 1
            continue
        key = (r[3],) if r[3] >= 0 else (r[0], r[1], r[2], id(r))
        final[key] = r[5]
    states = list(final.values())
    settled_static = sum(1 for k in final if len(k) == 1)
    done = states.count("done") + states.count("checkpoint-hit")
    return {
        "pending": max(0, tasks - settled_static - (running or 0)),
        "running": running,
        "done": done,
        "checkpointed": states.count("checkpoint-hit"),
        "failed": states.count("failed"),
        "skipped": states.count("skipped"),
        "retries": retries,
    }
