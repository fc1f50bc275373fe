"""The merged trace of a run (:class:`Trace`): every rank's events, built live from
the batches of each rank's :class:`~taskgraph.trace.recorder.Recorder` or loaded from a
file; its figures (utilisation, critical path, spawned calls and steals) and exports
(Chrome/Perfetto, HTML report).
"""

from __future__ import annotations

import graphlib
import json
from typing import Any

import numpy as np

from ..core.files import write_atomic
from . import cores as corelib
from .chrome import chrome_events
from .recorder import TASK_DONE, TASK_FAILED, Recorder
from .report import write_report

__all__ = ["TASK_DONE", "TASK_FAILED", "FORMAT", "Recorder", "Trace", "TraceError"]


def _attempt_rows(rank: int, at: dict, shift: float) -> list[list]:
    """A batch's attempt columns as merged rows (times moved by ``shift``)."""

    def moved(xs: list) -> list:
        return [None if x is None else x + shift for x in xs]

    cols = (at["ready"], at["launched"], at["started"], at["ended"])
    return [
        [rank, w, label, task, n, st, r, la, s, e, c]
        for w, label, task, n, st, r, la, s, e, c in zip(
            at["worker"],
            at["label"],
            at["task"],
            at["attempt"],
            at["state"],
            *(moved(xs) for xs in cols),
            at["cores"],
        )
    ]


# -- the merged trace of a run -------------------------------------------------------

FORMAT = "taskgraph-trace/1"


class TraceError(ValueError):
    """A trace file is missing or is not a taskgraph trace."""


class Trace:
    """Every rank's events of one run, merged; built live from batches or loaded.

    ``ingest(batch)`` takes the batches ranks publish (see :meth:`Recorder.batch`);
    ``state()`` is what the widget draws; ``summary()`` the figures as data;
    ``to_chrome(path)`` / ``Trace.load(path)`` write and read it back.

    ``title`` names the run; ``nranks`` ranks ran it; per task (by id) ``labels`` says
    what it is and ``kernel_of`` indexes its function's name in ``kernels``; ``preds``,
    each task's predecessors, lets the critical path be found (None: no critical path).
    """

    def __init__(
        self,
        title: str,
        nranks: int,
        labels: list[str],
        kernel_of: list[int],
        kernels: list[str],
        preds: list[list[int]] | None = None,
    ):
        self.title = title
        self.nranks = nranks
        self.labels = labels
        self.kernel_of = kernel_of
        self.kernels = kernels
        self.preds = preds
        self.tasks: list[list] = []  # [rank, worker, start, end, kernel, task, state]
        self.messages: list[list] = []  # [src, dst, bytes, tag, posted, done]
        self.spawned: list[list] = []  # [rank, worker, start, end, name, state]
        self.steals: list[list] = []  # [thief, victim, name, requested, arrived, pushed]
        # [rank, worker, label, task, attempt, state, ready, launched, started, ended, cores]
        self.attempt_rows: list[list] = []
        self.begun = [0] * nranks  # attempts launched on each rank, as it last said
        self.looking = [0.0] * nranks  # seconds each rank had a steal request out
        self._half: dict[tuple, list] = {}  # one side of a message seen so far
        self.sent = np.zeros((nranks, nranks), np.int64)
        self.sent_count = np.zeros((nranks, nranks), np.int64)
        self.workers = [0] * nranks
        self.waits = [[[0.0, 0.0]] for _ in range(nranks)]
        self.wall = [0.0] * nranks
        self.kernel_done = [0] * len(kernels)
        self.kernel_seconds = [0.0] * len(kernels)
        self.kernel_total = [0] * len(kernels)
        for k in kernel_of:
            self.kernel_total[k] += 1
        self.status = "empty" if not labels else "running"
        self.error: str | None = None
        self.elapsed = 0.0  # the run's time so far, compiling kernels before it left out
        self.compile_seconds = 0.0
        self.rebased = 0  # times the time base moved earlier (rows already shown moved)
        self._host_of: dict[int, str] = {}
        self._end_of: dict[int, float] = {}  # each rank's time so far, on the merged base
        self.critical: dict = {"length": 0.0, "makespan": 0.0, "tasks": []}
        self._clock: tuple[str, float] | None = None  # (host, time zero) of the base rank
        self.ranks_seen: set[int] = set()  # ranks whose batches were ingested
        # a batch run's: rank 0 wrote a file, or another rank waits for it (cluster.Run)
        self.file_sync: Any = None  # called with a path
        self.runtime_graph = False  # its tasks are the runtime's: their rows are left out

    @classmethod
    def for_graph(cls, graph, nranks: int) -> Trace:
        """An empty trace for a run of ``graph`` on ``nranks`` ranks, labelled from it.
        A graph of the runtime's own (``cluster.run(open=True)`` without one) shows no
        task: its calls are the run (its start task read 1/1 in the live view)."""
        if graph.internal:
            trace = cls(graph.name, nranks, [], [], [])
            trace.runtime_graph = True
            trace.status = "running"
            return trace
        kernels: dict[str, int] = {}
        kernel_of = [kernels.setdefault(t.name, len(kernels)) for t in graph.tasks]
        labels = [graph.label(t.id) for t in graph.tasks]
        preds = [list(t.preds) for t in graph.tasks]
        return cls(graph.name, nranks, labels, kernel_of, list(kernels), preds)

    # -- building ----------------------------------------------------------------------

    def ingest(self, batch: dict) -> tuple[list[list], list[list]]:
        """Add one rank's batch; returns the new task rows and message rows."""
        rank = batch["rank"]
        self.ranks_seen.add(rank)
        self.workers[rank] = batch["workers"]
        self.waits[rank] = batch["waits"]
        self.wall[rank] = batch["wall"]
        self.compile_seconds = max(self.compile_seconds, batch.get("compile", 0.0))
        self.looking[rank] = batch.get("looking", 0.0)
        self.begun[rank] = batch.get("begun", self.begun[rank])
        shift = self._shift(batch)
        # (not the batch's "elapsed": an engine counts from before it compiled kernels)
        self._end_of[rank] = batch["wall"] + shift
        self.elapsed = max(self.elapsed, self._end_of[rank])
        ev = batch["events"]["tasks"]
        rows = []
        tasks = (
            ()
            if self.runtime_graph
            else zip(  # (the runtime's task is not shown)
                ev["id"], ev["worker"], ev["start"], ev["end"], ev["state"]
            )
        )
        for tid, w, s, e, st in tasks:
            k = self.kernel_of[tid]
            rows.append([rank, w, s + shift, e + shift, k, tid, st])
            if st == TASK_DONE:
                self.kernel_done[k] += 1
                self.kernel_seconds[k] += e - s
        self.tasks += rows
        msgs = []
        m = batch["events"]["messages"]
        for peer, nbytes, tag, posted, done, d in zip(
            m["peer"], m["bytes"], m["tag"], m["posted"], m["done"], m["dir"]
        ):
            src, dst = (rank, peer) if d > 0 else (peer, rank)
            if d > 0:
                self.sent[src, dst] += nbytes
                self.sent_count[src, dst] += 1
            posted, done = posted + shift, done + shift
            key = (src, dst, tag)
            other = self._half.pop(key, None)
            if other is None:
                self._half[key] = [d, posted, done, nbytes]
                continue
            send, recv = ((posted, done), other[1:3]) if d > 0 else (other[1:3], (posted, done))
            row = [src, dst, nbytes, tag, send[0], recv[1]]
            msgs.append(row)
        self.messages += msgs
        self._ingest_dynamic(rank, batch["events"], shift)
        return rows, msgs

    def _ingest_dynamic(self, rank: int, events: dict, shift: float) -> None:
        """The spawned calls and steals of ``rank``'s batch (none in a static run)."""
        sp = events.get("spawned")
        if sp and sp["name"] and self.status == "empty":  # calls submitted to an empty graph
            self.status = "running"
        if sp:
            self.spawned += [
                [rank, w, s + shift, e + shift, name, st]
                for w, s, e, name, st in zip(
                    sp["worker"], sp["start"], sp["end"], sp["name"], sp["state"]
                )
            ]
        st = events.get("steals")
        if st:
            self.steals += [
                [rank, victim, name, req + shift, arr + shift, pushed]
                for victim, name, req, arr, pushed in zip(
                    st["victim"], st["name"], st["requested"], st["arrived"], st["pushed"]
                )
            ]
        at = events.get("attempts")
        if at:
            if self.status == "empty":  # calls submitted to an empty graph
                self.status = "running"
            self.attempt_rows += _attempt_rows(rank, at, shift)

    def _shift(self, batch: dict) -> float:
        """Seconds to add to a rank's times. Ranks on one host share its monotonic clock,
        so their times go onto one base exactly: the earliest start of a rank seen
        there, so that no time is negative (a rank that left the start barrier first
        may run all its tasks before another starts its clock); when an earlier one
        comes, the rows already merged move (:meth:`_rebase`). Ranks on other hosts
        keep the alignment of the start barrier (tens of µs to a few ms)."""
        host, t0 = batch.get("host"), batch.get("t0")
        if not host or t0 is None:
            return 0.0
        self._host_of[batch["rank"]] = host
        if self._clock is None:
            self._clock = (host, t0)
        base_host, base_t0 = self._clock
        if host != base_host:
            return 0.0
        if t0 < base_t0:
            self._rebase(host, base_t0 - t0)
            self._clock = (host, t0)
            base_t0 = t0
        return t0 - base_t0

    def _rebase(self, host: str, delta: float) -> None:
        """The time base of ``host`` moved ``delta`` seconds earlier: the merged times of
        its ranks grow by ``delta``."""
        on = {r for r, h in self._host_of.items() if h == host}
        for row in self.tasks:
            if row[0] in on:
                row[2] += delta
                row[3] += delta
        for row in self.messages:
            if row[0] in on:
                row[4] += delta
            if row[1] in on:
                row[5] += delta
        for row in self.spawned:
            if row[0] in on:
                row[2] += delta
                row[3] += delta
        for row in self.steals:  # (both times are the thief's)
            if row[0] in on:
                row[3] += delta
                row[4] += delta
        for row in self.attempt_rows:
            if row[0] in on:
                row[6:10] = [None if x is None else x + delta for x in row[6:10]]
        for (src, dst, _), half in self._half.items():
            if (src if half[0] > 0 else dst) in on:
                half[1] += delta
                half[2] += delta
        for r in on & self._end_of.keys():
            self._end_of[r] += delta
        self.elapsed = max(self._end_of.values(), default=0.0)
        self.rebased += 1

    def finish(self, error: str | None = None) -> None:
        """The run ended (well, or with ``error``): settle status and critical path."""
        if error is not None:
            self.status, self.error = "failed", error
        elif self.labels or self.spawned or self.attempt_rows or self.runtime_graph:
            self.status = "done"
        self.critical = self._critical_path()

    def _critical_path(self) -> dict:
        makespan = self.makespan
        if not self.tasks or self.preds is None:
            return {"length": 0.0, "makespan": makespan, "tasks": []}
        dur = {row[5]: row[3] - row[2] for row in self.tasks if row[6] == TASK_DONE}
        if not dur:  # (no task ended well: a failed or cancelled run's first tasks)
            return {"length": 0.0, "makespan": makespan, "tasks": []}
        best: dict[int, float] = {}
        via: dict[int, int] = {}
        preds = self.preds
        order = graphlib.TopologicalSorter({t: [p for p in preds[t] if p in dur] for t in dur})
        for t in order.static_order():
            prev = [p for p in preds[t] if p in best]
            p = max(prev, key=lambda q: best[q], default=None)
            best[t] = dur[t] + (best[p] if p is not None else 0.0)
            if p is not None:
                via[t] = p
        end = max(best, key=lambda t: best[t])
        path = [end]
        while path[-1] in via:
            path.append(via[path[-1]])
        return {"length": best[end], "makespan": makespan, "tasks": path[::-1]}

    # -- what it shows ------------------------------------------------------------------

    @property
    def makespan(self) -> float:
        """Seconds from the run's start to the last task's end (or the longest rank)."""
        ends = [row[3] for row in self.tasks] + [r[9] for r in self.attempt_rows if r[9]]
        return max(ends + [max(self.wall, default=0.0)], default=0.0)

    def lanes(self) -> list[dict]:
        """The timeline's rows: one per rank and worker, with its label."""
        return [
            {"rank": r, "worker": w, "label": f"rank {r} · worker {w}"}
            for r in range(self.nranks)
            for w in range(max(1, self.workers[r]))
        ]

    def utilisation(self) -> list[dict]:
        """Per rank, seconds (summed over workers) of compute, comm, stealing (looking
        for work on other ranks), idle and overhead."""
        compute = self._compute()
        out = []
        for r in range(self.nranks):
            workers = max(1, self.workers[r])
            wall = self.wall[r] * workers
            comm = float(sum(w[0] for w in self.waits[r]))
            idle = float(sum(w[1] for w in self.waits[r]))
            # a rank asks only when every worker waits: each idle through the request
            stealing = min(idle, self.looking[r] * workers)
            idle -= stealing
            overhead = max(0.0, wall - compute[r] - comm - stealing - idle)
            wall = max(wall, compute[r] + comm + stealing + idle)
            out.append(
                {
                    "rank": r,
                    "compute": compute[r],
                    "comm": comm,
                    "stealing": stealing,
                    "idle": idle,
                    "overhead": overhead,
                    "wall": wall,
                }
            )
        return out

    def _compute(self) -> list[float]:
        """Per rank, seconds its workers ran tasks. Spawned calls run nested in the
        task that waits for them, on its worker: a worker's busy time is the union of
        its task and spawned rows, so that none counts twice."""
        compute = [0.0] * self.nranks
        if not self.spawned:  # tasks never overlap on a worker
            for row in self.tasks:
                compute[row[0]] += row[3] - row[2]
            return compute
        lanes: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for rows in (self.tasks, self.spawned):
            for row in rows:
                lanes.setdefault((row[0], row[1]), []).append((row[2], row[3]))
        for (rank, _), spans in lanes.items():
            end = float("-inf")
            for s, e in sorted(spans):
                if e > end:
                    compute[rank] += e - max(s, end)
                    end = e
        return compute

    def dynamic(self) -> dict:
        """Spawned calls that ran (and failed), steals and their median latency (seconds
        from request to the call's arrival; 0.0 with none), and calls pushed to an idle
        rank unasked, with theirs (from the push; see taskgraph.run.steal)."""
        steals = [row[4] - row[3] for row in self.steals if not row[5]]
        pushes = [row[4] - row[3] for row in self.steals if row[5]]
        return {
            "spawned": len(self.spawned),
            "spawned_failed": sum(1 for row in self.spawned if row[5] == TASK_FAILED),
            "steals": len(steals),
            "steal_latency_median": corelib.median(steals),
            "pushes": len(pushes),
            "push_latency_median": corelib.median(pushes),
        }

    # -- a many-task run's attempts (see taskgraph.trace.cores) ------------------------

    def attempts(self) -> list[dict]:
        """One dict per attempt of a managed call: rank, worker, label, task (-1: a
        spawned or submitted call), attempt, state, the ready/launched/started/ended
        stamps (seconds since the start; None where not reached) and cores."""
        return corelib.attempts_table(self.attempt_rows)

    def overheads(self) -> dict:
        """Per attempt that ran, seconds ready -> launched (``wait``: scheduled),
        launched -> started (``launch``), started -> ended (``run``) and in all
        (``total``), with the median of each: ``{"rows", "median", "count"}``."""
        return corelib.overheads(self.attempt_rows)

    def core_utilisation(self, cores: list[int] | None = None) -> dict:
        """Each core over time in RADICAL-Pilot's states (launching, running, idle,
        runtime overhead): ``cores[r]`` slots on rank ``r`` (default: its workers);
        see :func:`taskgraph.trace.cores.core_states`."""
        slots = cores if cores is not None else [max(1, w) for w in self.workers]
        return corelib.core_states(self.attempt_rows, slots, self.makespan)

    def state_counts(self) -> dict:
        """Managed calls pending, running, done, failed, skipped, and the retries
        (see :func:`taskgraph.trace.cores.state_counts`)."""
        ran = sum(1 for r in self.attempt_rows if r[8] is not None)
        running = max(0, sum(self.begun) - ran) if any(self.begun) else None
        if self.status in ("done", "failed"):
            running = 0  # (an ended run runs nothing, whether or not launches were counted)
        return corelib.state_counts(self.attempt_rows, len(self.labels), running)

    def progress(self) -> dict:
        """Tasks done of all, the rate, elapsed and remaining seconds, and per kernel."""
        done = sum(self.kernel_done)
        total = len(self.labels)
        rate = done / self.elapsed if self.elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 and self.status == "running" else None
        return {
            "done": done,
            "total": total,
            "percent": 100.0 * done / total if total else 100.0,
            "elapsed": self.elapsed,
            "compile": self.compile_seconds,
            "rate": rate,
            "eta": eta,
            "kernels": [
                {"name": n, "done": d, "total": t, "seconds": s}
                for n, d, t, s in zip(
                    self.kernels, self.kernel_done, self.kernel_total, self.kernel_seconds
                )
            ],
        }

    def state(self) -> dict:
        """The widget's state (see taskgraph/trace/static/PROTOCOL.md)."""
        return {
            "title": self.title,
            "status": self.status,
            "error": self.error,
            "progress": self.progress(),
            "lanes": self.lanes(),
            "kernels": self.kernels,
            "matrix": {"bytes": self.sent.tolist(), "messages": self.sent_count.tolist()},
            "util": self.utilisation(),
            "critical": self.critical,
            "makespan": self.makespan,
            "dynamic": self.dynamic(),
            **self._ensemble_state(),
        }

    def _ensemble_state(self) -> dict:
        """The state counts, only for a run with managed calls (a static run's state
        stays as it was)."""
        if not self.attempt_rows and not any(self.begun):
            return {}
        return {"ensemble": self.state_counts()}

    def event_rows(
        self,
        tasks: list[list],
        msgs: list[list],
        spawned: list[list] | None = None,
        steals: list[list] | None = None,
    ) -> dict:
        """``tasks`` (task rows) and ``msgs`` (message rows), as :meth:`ingest` returns
        them, and ``spawned`` and ``steals`` (rows of :attr:`spawned` and :attr:`steals`),
        in the protocol's event message form. The dynamic keys appear only with rows, so
        a static run's messages stay as they were."""
        lane_of = {}
        for i, lane in enumerate(self.lanes()):
            lane_of[lane["rank"], lane["worker"]] = i
        out: dict[str, Any] = {
            "kind": "events",
            "tasks": [
                [lane_of.get((r, w), 0), s, e, k, t, st, self.labels[t]]
                for r, w, s, e, k, t, st in tasks
            ],
            "messages": [[s, d, t0, t1, b] for s, d, b, _tag, t0, t1 in msgs],
        }
        if spawned:
            out["spawned"] = [
                [lane_of.get((r, w), 0), s, e, st, name] for r, w, s, e, name, st in spawned
            ]
        if steals:  # ranks, not lanes: a steal goes between ranks, as a message does
            out["steals"] = [list(row) for row in steals]
        return out

    def summary(self) -> dict:
        """The figures of the run, as data."""
        util = self.utilisation()
        return {
            "title": self.title,
            "status": self.status,
            "error": self.error,
            "ranks": self.nranks,
            "tasks": len(self.tasks),
            "failed_tasks": sum(1 for row in self.tasks if row[6] == TASK_FAILED),
            "makespan": self.makespan,
            "compile_seconds": self.compile_seconds,
            "critical_path": self.critical["length"],
            "critical_path_fraction": (
                self.critical["length"] / self.makespan if self.makespan else 0.0
            ),
            "kernels": self.progress()["kernels"],
            "bytes": self.sent.tolist(),
            "messages": self.sent_count.tolist(),
            "utilisation": util,
            **self.dynamic(),
        }

    # -- files ----------------------------------------------------------------------------

    @property
    def only_another_rank(self) -> bool:
        """True for ``run.trace`` on a rank other than 0 of a batch job: it holds that
        rank's own events only, while rank 0's holds every rank's. Such a trace writes
        no file (see :meth:`to_chrome`)."""
        return bool(self.ranks_seen) and 0 not in self.ranks_seen

    def to_dict(self) -> dict:
        """The whole trace as JSON-ready data (what :meth:`to_chrome` embeds)."""
        return {
            "format": FORMAT,
            "title": self.title,
            "nranks": self.nranks,
            "labels": self.labels,
            "kernel_of": self.kernel_of,
            "kernels": self.kernels,
            "tasks": self.tasks,
            "messages": self.messages,
            "sent": self.sent.tolist(),
            "sent_count": self.sent_count.tolist(),
            "workers": self.workers,
            "waits": self.waits,
            "wall": self.wall,
            "status": self.status,
            "error": self.error,
            "elapsed": self.elapsed,
            "compile_seconds": self.compile_seconds,
            "critical": self.critical,
            "spawned": self.spawned,
            "steals": self.steals,
            "looking": self.looking,
            **({"attempts": self.attempt_rows, "begun": self.begun} if self.attempt_rows else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        """The trace that :meth:`to_dict` made ``d`` from; :class:`TraceError` if ``d``
        is not one."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TraceError(f"not a taskgraph trace (expected format {FORMAT!r})")
        try:
            t = cls(d["title"], d["nranks"], d["labels"], d["kernel_of"], d["kernels"])
            t.tasks, t.messages = d["tasks"], d["messages"]
            t.sent = np.asarray(d["sent"], np.int64).reshape(t.nranks, t.nranks)
            t.sent_count = np.asarray(d["sent_count"], np.int64).reshape(t.nranks, t.nranks)
            t.workers, t.waits, t.wall = d["workers"], d["waits"], d["wall"]
            t.status, t.error, t.elapsed = d["status"], d["error"], d["elapsed"]
            t.critical = d["critical"]
            t.compile_seconds = d.get("compile_seconds", 0.0)  # (older files have none)
            t.spawned = d.get("spawned", [])
            t.steals = [[*row, False][:6] for row in d.get("steals", [])]  # (older: no "pushed")
            t.looking = d.get("looking", [0.0] * t.nranks)
            t.attempt_rows = d.get("attempts", [])
            t.begun = d.get("begun", [0] * t.nranks)
            for row in t.tasks:
                if row[6] == TASK_DONE:
                    t.kernel_done[row[4]] += 1
                    t.kernel_seconds[row[4]] += row[3] - row[2]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise TraceError(f"malformed taskgraph trace: {type(exc).__name__}: {exc}") from None
        return t

    def to_chrome(self, path) -> str:
        """Write Chrome trace-event JSON to ``path`` (opens in Perfetto), with this trace
        inside to reload (:meth:`load`); returns ``path`` as a string.

        In a batch job every rank runs the script, so every rank may call this on the
        same path: only rank 0, whose trace holds every rank's events, writes; on the
        other ranks (:attr:`only_another_rank`) this writes nothing and returns the
        path. (A rank's own events are in ``run.executor.trace``.) The file is written
        to a temporary name beside ``path`` and renamed, so it is never half-written;
        an OSError (a read-only or full directory) names ``path`` and leaves any old
        file as it was.
        """
        if self.only_another_rank:
            self._synced(path)
            return str(path)

        events = chrome_events(self, TASK_FAILED)
        doc = {"traceEvents": events, "displayTimeUnit": "ms", "taskgraph": self.to_dict()}
        try:
            return write_atomic(path, json.dumps(doc))
        finally:
            self._synced(path)

    def _synced(self, path) -> None:
        if self.file_sync is not None:
            self.file_sync(str(path))

    save = to_chrome

    @classmethod
    def load(cls, path) -> Trace:
        """Read the trace that :meth:`to_chrome` wrote to ``path`` back;
        :class:`TraceError` if there is none."""

        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise TraceError(f"no trace file at {path}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceError(f"{path} is not a readable JSON trace: {exc}") from None
        if not isinstance(doc, dict) or "taskgraph" not in doc:
            raise TraceError(f"{path} is JSON but not a taskgraph trace (no 'taskgraph' key)")
        return cls.from_dict(doc["taskgraph"])

    def to_html(self, path) -> str:
        """Write a standalone report to ``path`` (no network needed) with the same views
        as the widget; returns ``path`` as a string. Written by rank 0 only, whole or
        not at all, as :meth:`to_chrome`."""
        if self.only_another_rank:
            self._synced(path)
            return str(path)
        try:
            return write_report(self, path)
        finally:
            self._synced(path)

    def __repr__(self) -> str:
        return (
            f"<Trace {self.title!r}: {len(self.tasks)} task events on {self.nranks} ranks, "
            f"{len(self.messages)} messages, {self.status}>"
        )
