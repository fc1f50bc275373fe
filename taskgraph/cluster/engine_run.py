"""A graph running on ipyparallel engines, seen from the notebook: :class:`EngineRun`.

Made by :meth:`taskgraph.cluster.engines.EngineCluster.run`, which sends the plan to every
engine in one message (:func:`taskgraph.cluster.engine_side.run_graph`). The engines
publish progress and event batches while they run (:meth:`EngineRun.batches`) and a
heartbeat that tells a stuck engine (a call into C that never returns) from a slow one.
Values stay on the engines until asked for: ``run.result(future)`` fetches one from the
rank that holds it, once, and keeps it on the handle.

Plain data (:mod:`taskgraph.dsl.datadeps`) go to the engines with the plan, values
included: the notebook's are the truth at the start. When the run ends well, engine
rank 0's summary carries the final value of each datum the run wrote, and the notebook
copies it into its own arrays and objects when it reads the summaries (``wait()``).
Runs settle in the order they were made: a later run's final values are never
overwritten by an earlier run read afterwards.

Each engine's summary carries its rank's tally of the calls' outcomes (successes,
retries, checkpoint hits, failures with their errors, skipped calls); ``run.summary()``
merges them as a batch job's ranks do (:meth:`~taskgraph.run.attempts.Summary.merge`).

Several runs may be in flight at once: the engines start each run and take the next
request at once (:func:`~taskgraph.cluster.engine_side.run_graph`), and each run's
summary arrives as data published under its request (``summary``). A run waits
("queued") only for an earlier run still going that writes data it uses, or uses data
it writes (:mod:`taskgraph.cluster.overlap`); the engines decide the same.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import ChainMap
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..core import pickling
from ..core.errors import GraphError, RemoteTraceback, RunError, TaskError, refuse_async
from ..dsl.datadeps import Data, settle, written_data
from ..dsl.graph import Graph
from ..dsl.options import NO_RUN_OPTIONS, RunOptions
from ..plan.planner import Plan
from ..run.attempts import Summary
from ..run.dynamic import call_label, check_values
from ..run.executor import Stats
from ..trace.events import Trace
from . import engine_side
from .handle import RunHandle
from .overlap import footprint, must_wait
from .submit import EngineFuture, Outbox

if TYPE_CHECKING:
    from .engines import EngineCluster

STUCK_GRACE = 5.0  # seconds past a task's limit before its silent engine is called stuck

# runs of this process that write plain data and have not settled, in the order made
_unsettled: list[EngineRun] = []
_settling = threading.RLock()  # (a live view may ask for a run's state from its thread)


_LARGEST = ("seconds", "peak_sends", "steal_latency_median_us")  # (not summed over engines)


class EngineRun(RunHandle):
    """A graph running on the engines; returned at once by :meth:`EngineCluster.run`.

    States (:meth:`state`): ``"queued"`` while an earlier run of the cluster still
    going writes data this one uses, or uses data this one writes (only then: other runs
    in flight run at once), ``"running"``, then ``"done"`` or ``"failed"``. Values stay
    on the engines until ``result(future)`` asks for one. Once the cluster is closed
    (or restarted) the handle answers from what it heard: a run that had not ended is
    ``"failed"`` (cut off), and a value not fetched by then is gone (RunError).

    Parameters
    ----------
    cluster : the engine cluster.
    graph : the graph to run.
    workers : worker threads per engine (None: the engine's default).
    blas_threads : BLAS threads per worker (None: the default).
    plan : a plan made already (None: planned here).
    trace : record events.
    task_timeout : seconds any task may run unless it has a ``timeout`` of its own.
    earlier : the cluster's runs made before this one and still going (this one waits
        for those it overlaps).
    open : the run takes :meth:`submit` calls until :meth:`close` (or ``wait()``).
    """

    where = "engines"

    def __init__(
        self,
        cluster: EngineCluster,
        graph: Graph,
        workers: int | None,
        blas_threads: int | None,
        plan: Plan | None,
        trace: bool = True,
        task_timeout: float | None = None,
        earlier: list[EngineRun] | None = None,
        open: bool = False,
        options: RunOptions = NO_RUN_OPTIONS,
    ):
        super().__init__(cluster, graph, plan)
        self.open = open
        self._closed = False  # (an open run) no more submitted calls
        self._submitted = 0  # calls submitted so far (their keys, round-robin ranks)
        self._outbox = Outbox(self._send_calls)
        self.id = uuid.uuid4().hex[:12]
        self.task_timeout = task_timeout
        self.footprint = footprint(graph)
        self._waits_for = [
            r for r in earlier or () if not r.done() and must_wait(r.footprint, self.footprint)
        ]
        self._own_graph()
        _settle_ended_runs()  # (their holds off the data: their values go with this plan)
        try:
            payload = pickling.dumps(
                (self.plan, workers, blas_threads, trace, task_timeout, open, options)
            )
        except Exception as exc:  # (cloudpickle's own error named no task)
            raise unsendable(graph, exc) from exc
        self.payload_bytes = len(payload)
        self.t0 = time.perf_counter()
        # (the client that hears this run's engines: another, or none, once the cluster closes)
        self._client = cluster.client
        forget = []
        while cluster._forgotten:
            forget.append(cluster._forgotten.popleft())
        self.ar = cluster.view.apply_async(engine_side.run_graph, payload, self.id, forget)
        self._settled = False
        self._writes: list[Data] = self._hold_written()  # after the payload: it has the values
        self._seen: list[set[str]] = [set() for _ in range(cluster.size)]
        self._kept: list[dict] = []  # every batch, for the trace
        self._trace: Trace | None = None
        self._cancelled: str | None = None  # the reason, once cancelled
        self._heard: dict[int, tuple[object, float]] = {}  # rank -> (heartbeat, when seen)
        self.summaries: list[dict] | None = None
        self._error: Exception | None = None  # the run's, once the engines answered
        self.wall_seconds = 0.0

    def done(self) -> bool:
        """Whether the run is over on every engine (done or failed): each published its
        summary, or the request that starts it failed, or the cluster was closed (or
        restarted) since: nothing more will come of it."""
        return self._ended_everywhere() or self._engines_gone()

    def _ended_everywhere(self) -> bool:
        """Whether every engine published its summary, or the request that starts the
        run failed."""
        if not self.ar.ready():
            return False
        if not self.ar.successful():
            return True
        return all("summary" in per_engine for per_engine in self._data())

    def _engines_gone(self) -> bool:
        """Whether the cluster was closed or restarted since the run was made."""
        return self.cluster.client is not self._client

    def _gone(self) -> str:
        """What became of the cluster whose engines are gone: "closed" or "restarted"."""
        return "closed" if self.cluster.client is None else "restarted"

    def _cut_off(self) -> str:
        """What ``wait()`` says of a run whose engines went before it ended."""
        name, how = self.graph.name, self._gone()
        return f"run {name!r} was cut off: the cluster was {how} before it ended"

    def _data(self) -> list[Mapping]:
        """What each engine published under this run's request, by rank."""
        return [self._data_of(rank) for rank in range(len(self.ar.msg_ids))]

    def _data_of(self, rank: int) -> Mapping:
        """What the engine of ``rank`` published under this run's request. ipyparallel
        files it in the request's record, drops that record once the request has
        answered (and the engine answers as soon as the run has started), and files
        what comes later in a new one: a short run's summary can land in either."""
        first = self.ar.metadata
        first = first[rank] if isinstance(first, list) else first
        later = self._client.metadata.get(self.ar.msg_ids[rank])  # (.get: adds none)
        if later is None or later is first:
            return first["data"]
        return ChainMap(later["data"], first["data"])  # (not a copy: a look per future)

    # -- submitted calls -------------------------------------------------------------

    def submit(self, fn, /, *args, **kwargs) -> EngineFuture:
        """Add the call ``fn(*args, **kwargs)`` to the running run; its future, at once.

        The calls go to the engines in turn (round-robin: the first batch is spread
        without waiting for steals, and a graph of kernels alone, which never steals,
        spreads too); an idle engine may still steal them (where the graph has plain
        ``@tg.task`` functions). A failed call fails its future, not the run. RunError
        if the run was closed or has ended; a run ending meanwhile fails the future
        (see :class:`~taskgraph.cluster.submit.EngineFuture`)."""
        if self._closed or self._cancelled is not None or self.done():
            what = "was closed" if self._closed and not self.done() else "has ended"
            raise RunError(
                f"run {self.graph.name!r} {what}: {call_label(fn, args, kwargs)} not submitted"
            )
        refuse_async(fn, "run.submit:")
        check_values(fn, args, kwargs, "run.submit")
        label = call_label(fn, args, kwargs)
        try:
            blob = pickling.dumps((f"s{self._submitted:08d}", fn, args, kwargs))
        except Exception as exc:  # (it names the call, as a batch rank does)
            raise TypeError(f"run.submit: {label} cannot be sent to the engines: {exc}") from exc
        n, self._submitted = self._submitted, self._submitted + 1
        key, rank = f"s{n:08d}", n % self.cluster.size
        batch = self._outbox.put(rank, blob)
        return EngineFuture(self, key, rank, label, batch)

    def _send_calls(self, rank: int, calls: list[bytes]):
        """The request that takes ``calls`` to the engine of ``rank`` (see Outbox)."""
        engine = self.cluster.client[self.cluster.engine_ids[rank]]
        return engine.apply_async(engine_side.submit_calls, self.id, calls)

    def close(self) -> None:
        """No more :meth:`submit` calls: an open run ends once its tasks and the calls
        submitted have ended. Any number of times; ``wait()`` closes too."""
        if self._closed or not self.open:
            return
        self._closed = True
        if self._engines_gone():  # (nothing to tell them)
            return
        self._outbox.flush()  # (then the close: each engine takes requests in the order sent)
        self.cluster.view.apply_async(engine_side.close_run, self.id)

    def _ended_without(self, label: str) -> RunError:
        """The error of a submitted call whose run ended before it did."""
        errors = [d["summary"]["error"] for d in self._data() if d.get("summary", {}).get("error")]
        why = f": {errors[0]}" if errors else ""
        if self._cancelled is not None:
            why += f" ({self._cancelled})"
        return RunError(f"run {self.graph.name!r} ended before {label} did{why}")

    def queued(self) -> bool:
        """Whether the run waits for an earlier run of the cluster that it overlaps."""
        self._waits_for = [r for r in self._waits_for if not r.done()]
        return bool(self._waits_for) and not self.done()

    def state(self) -> str:
        """``"queued"``, ``"running"``, ``"done"`` or ``"failed"``."""
        if self.done():
            try:
                self._conclude()
            except Exception:  # noqa: BLE001 - wait() raises it; here it is a state
                return "failed"
            return "done"
        return "queued" if self.queued() else "running"

    def wait(self, timeout: float | None = None) -> EngineRun:
        """Block until the run ends everywhere; raise its error (TaskError, RunError).

        ``timeout``: seconds, then TimeoutError (the run goes on). An engine stuck in a
        task past its time limit raises RunError naming the task and rank. Ctrl-C
        cancels the run, waits up to 10 s for it to stop, and raises KeyboardInterrupt;
        a second Ctrl-C meanwhile stops only the waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.close()
        try:
            while not self.done():
                if self.ar.ready():
                    time.sleep(0.05)  # (started: its summary comes as published data)
                else:
                    self.ar.wait(0.2)
                if self.done():
                    break
                if not self.cluster.alive():
                    raise RunError(self.cluster._dead_message())
                self._check_stuck()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run of {self.graph.name!r} still going after {timeout} s")
        except KeyboardInterrupt:
            self.cancel("interrupted (KeyboardInterrupt)")
            try:
                deadline = time.monotonic() + 10
                while not self.done() and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                raise
        self._conclude()
        return self

    def _limit(self, tid: int) -> float | None:
        own = getattr(self.graph.tasks[tid].fn, "timeout", None)
        return own if own is not None else self.task_timeout

    def _check_stuck(self) -> None:
        """RunError if an engine is stuck in a task: its heartbeat shows the task past
        its time limit plus ``STUCK_GRACE``, or the heartbeat itself stopped for that
        long (a call into C that holds the interpreter) while every task has a limit."""
        if self.queued():
            return
        data = self._data()
        now = time.monotonic()
        longest = self._longest_limit()
        for rank, per_engine in enumerate(data):
            beat = per_engine.get("alive") if isinstance(per_engine, Mapping) else None
            if beat is None:  # stuck before its first heartbeat: silent since it started
                beat = (None, [])
            heard = self._heard.get(rank)
            if heard is None or heard[0] != beat:
                self._heard[rank] = heard = (beat, now)
            silent = now - heard[1]
            running: list[tuple[int, float]] = beat[1]
            for tid, seconds in running:
                limit = self._limit(tid)
                if limit is not None and seconds + silent > limit + STUCK_GRACE:
                    self._report_stuck([tid], rank, limit, silent)
            if longest is not None and silent > longest + STUCK_GRACE:
                tids = [tid for tid, _ in running] or self._unfinished(rank)
                self._report_stuck(tids, rank, longest, silent)

    def _longest_limit(self) -> float | None:
        """The longest time limit of the graph's tasks (None if one has none)."""
        limits = [self._limit(t.id) for t in self.graph.tasks]
        return None if not limits or None in limits else max(limits)  # type: ignore[type-var]

    def _unfinished(self, rank: int) -> list[int]:
        """Tasks of ``rank`` whose end has not been reported."""
        self.batches()
        ended = {t for b in self._kept if b["rank"] == rank for t in b["events"]["tasks"]["id"]}
        placement = self.plan.placement
        return [t.id for t in self.graph.tasks if placement[t.id] == rank and t.id not in ended]

    def _report_stuck(self, tids: list[int], rank: int, limit: float, silent: float) -> None:
        names = ", ".join(self.graph.label(t) for t in tids[:3]) + (" ..." if len(tids) > 3 else "")
        what = (
            f"task {names} on rank {rank}/{self.cluster.size} ran past its time limit of "
            f"{limit:g} s and was not stopped"
            + (f"; the engine has not answered for {silent:.0f} s" if silent > 1 else "")
            + " (a call that never returns)"
        )
        self.cancel(what)
        self.cluster._stuck = what
        raise RunError(f"{what}: cluster.restart() starts fresh engines")

    def _hold_written(self) -> list[Data]:
        """The plain data this run writes, held (see :meth:`Data.hold`) until it settles."""
        items = [self.graph.data[d].item for d in written_data(self.graph)]
        writes = [item for item in items if item is not None]
        for item in writes:
            item.hold(1)
        if writes:
            _unsettled.append(self)
        return writes

    def _conclude(self) -> None:
        """Read the engines' summaries (once, after those of the runs made before this
        one); raise the run's error (every time)."""
        with _settling:
            if not self._settled:
                if self in _unsettled:
                    for earlier in _unsettled[: _unsettled.index(self)]:
                        if earlier.done():  # (the engines ran it before this one)
                            earlier._settle()
                self._settle()
        if self._error is not None:
            raise self._error

    def _settle(self) -> None:
        """Read the summaries; the notebook's data take the final values of a run that
        ended well; the run's holds are let go. ``_settling`` held."""
        if self._settled:
            return
        self._settled = True
        try:
            if self.summaries is None and self._error is None:
                self._read_summaries()
        except Exception as exc:  # noqa: BLE001 - kept; _conclude raises it
            self._error = exc
        finally:
            for item in self._writes:
                item.hold(-1)
            if self in _unsettled:
                _unsettled.remove(self)
            self._merge_records()

    def _merge_records(self) -> None:
        """Fold the records ipyparallel made after the request answered (see
        :meth:`_data_of`) into the request's own, and drop them: nothing follows a
        summary, and the client would keep them for the whole session."""
        if not self.ar.ready():
            return
        records = self._client.metadata
        for rank, msg_id in enumerate(self.ar.msg_ids):
            first = self.ar.metadata
            first = first[rank] if isinstance(first, list) else first
            later = records.get(msg_id)
            if later is not None and later is not first:
                first["data"].update(later["data"])
                records.pop(msg_id, None)

    def _read_summaries(self) -> None:
        if not self._ended_everywhere():  # (done: the engines are gone, with the summaries)
            raise RunError(self._cut_off())
        try:
            self.ar.get()
        except Exception as exc:  # an engine died or the engine function failed
            if not self._engines_gone() and not self.cluster.alive():
                raise RunError(self.cluster._dead_message()) from exc
            raise
        summaries = [per_engine["summary"] for per_engine in self._data()]
        self.summaries = summaries
        self.wall_seconds = time.perf_counter() - self.t0
        self.seconds = max(s["seconds"] for s in self.summaries)
        self.compile_seconds = max(s["compile_seconds"] for s in self.summaries)
        errors = [s["error"] for s in self.summaries if s["error"] is not None]
        if errors:
            err = errors[0]
            if self._cancelled is not None and isinstance(err, RunError):
                if self._cancelled in str(err):  # (the engines were told the reason)
                    raise err
                raise RunError(f"{err} ({self._cancelled})") from err
            cause = RemoteTraceback(err.traceback) if isinstance(err, TaskError) else None
            raise err from cause
        for summary in summaries:  # (engine rank 0's: the final values of what it wrote)
            for d, value in (summary.get("data") or {}).items():
                item = self.graph.data[d].item
                if item is not None:
                    settle(item, value)

    def cancel(self, reason: str | None = None) -> None:
        """Stop the run on every engine (the cluster's other runs go on); ``wait()``
        then raises RunError naming ``reason`` (default "cancelled by the user"). A
        queued run is stopped as it starts; cancelling again changes nothing."""
        if self._cancelled is not None or self.done():
            return
        self._cancelled = reason or "cancelled by the user"
        # (after the request that starts the run: each engine takes requests in order)
        self.cluster.view.apply_async(engine_side.cancel_run, self.id, self._cancelled)

    def _fetch(self, tid: int):
        """The value of task ``tid`` from the engine of the rank that holds it."""
        if self.summaries is None:
            self.wait()
        if self._engines_gone():
            raise RunError(
                f"the value of task {self.graph.label(tid)} of run {self.graph.name!r} was "
                f"not fetched before the cluster was {self._gone()}: the values on its "
                "engines are gone (a value read with result() before close() is kept)"
            )
        return self.cluster.fetch(self.id, tid, self.plan.placement[tid])

    @property
    def stats(self) -> Stats:
        """What the run did, over every engine: counts summed; ``seconds``,
        ``peak_sends`` and ``steal_latency_median_us`` the largest; zeros until the run
        ends."""
        total = Stats()
        for summary in self.summaries or ():
            for name, value in summary["stats"].items():
                mine = getattr(total, name, 0)
                both = max(mine, value) if name in _LARGEST else mine + value
                setattr(total, name, both)
        return total

    def _summary(self) -> Summary | None:
        """Every engine's tally merged, once their summaries are read (None before, or
        if they never came: the engines died)."""
        if self.summaries is None:
            return None
        tallies = [s["tally"] for s in self.summaries if s.get("tally") is not None]
        merged = Summary.merge(self.graph.name, tallies)
        merged.ended_well = not any(s.get("error") for s in self.summaries)
        return merged

    # -- live events -----------------------------------------------------------------

    def batches(self) -> list[dict]:
        """Progress and event batches that arrived since the last call, in order."""
        out = []
        for rank, per_engine in enumerate(self._data()):
            for key in sorted(per_engine):
                if key.startswith("b") and key not in self._seen[rank]:
                    self._seen[rank].add(key)
                    out.append(per_engine[key])
        self._kept += out
        return out

    @property
    def trace(self) -> Trace:
        """Every rank's events of this run, merged (waits for the run to end; an open
        run is closed first, with a warning)."""
        self._close_to_read("trace")
        if self._trace is None:
            error = None
            try:
                self.wait()
            except (TaskError, RunError) as exc:
                error = str(exc)
            if not self._engines_gone():
                self.ar.wait_for_output(10)
            self.batches()
            trace = Trace.for_graph(self.graph, self.cluster.size)
            for batch in self._kept:
                trace.ingest(batch)
            trace.finish(error)
            self._trace = trace
        return self._trace

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks in all) over every rank, from the latest batches; (0, 0) in
        a run of submitted calls only (its one task is the runtime's)."""
        if self.graph.internal:
            return 0, 0
        if self.summaries is not None:  # the ranks' final counts
            return sum(s["stats"]["tasks"] for s in self.summaries), self.graph.ntasks
        return sum(b["done"] for b in self._latest().values()), self.graph.ntasks

    def calls_ended(self) -> int:
        """Spawned and submitted calls ended so far over every rank, from the latest
        batches."""
        return sum(b.get("calls", 0) for b in self._latest().values())

    def _latest(self) -> dict[int, dict]:
        """Each rank's latest progress batch."""
        latest: dict[int, dict] = {}
        for per_engine in self._data():
            keys = [k for k in per_engine if k.startswith("b")]
            if keys:
                b = per_engine[max(keys)]  # (b<seq>, zero-padded: the latest sorts last)
                latest[b["rank"]] = b
        return latest


def _settle_ended_runs() -> None:
    """Settle the runs that ended and that nobody waited for."""
    with _settling:
        for run in list(_unsettled):
            if run.done():
                run._settle()


def unsendable(graph: Graph, exc: Exception) -> GraphError:
    """The error for a graph that cannot be pickled for the engines: the first task
    whose function or arguments cannot be, named (``exc``: the pickler's error)."""
    for t in graph.tasks:
        for what, obj in (("function", t.fn), ("arguments", (t.args, t.kwargs))):
            try:
                pickling.dumps(obj)
            except Exception as err:  # noqa: BLE001 - any pickling error names the task
                return GraphError(
                    f"task {graph.label(t.id)}: its {what} cannot be sent to the engines "
                    f"({type(err).__name__}: {err}); pass values that pickle, or make "
                    "them inside the task"
                )
    return GraphError(f"graph {graph.name!r} cannot be sent to the engines: {exc}")


__all__ = ["STUCK_GRACE", "EngineRun"]
