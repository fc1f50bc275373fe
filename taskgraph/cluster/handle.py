"""The handle every ``cluster.run(graph)`` returns: :class:`RunHandle`.

A run keeps its own values: two runs of one graph (with different inputs) each answer
``run.result(future)`` with theirs. ``future.result()`` reads the graph's latest run
(``graph.last_run``, set when a run is made). The job's runs
(:class:`~taskgraph.cluster.jobrun.Run`) and the engines' runs
(:class:`~taskgraph.cluster.engine_run.EngineRun`) subclass it. When a run ends well,
the plain data it wrote (``tg.rw(x)``) hold their final values on every rank, every
engine and in the notebook by the time ``wait()`` returns (:mod:`taskgraph.dsl.datadeps`)::

    queued ──(the earlier run ended)──► running ──► done | failed
"""

from __future__ import annotations

import html
import warnings
from typing import Any

from ..core.errors import GraphError, RunError
from ..dsl.graph import Graph
from ..plan.planner import Plan, make_plan
from ..run.attempts import Skipped, Summary, say_summary
from ..run.executor import Stats
from ..trace.events import Trace


class RunHandle:
    """A graph running on a cluster; returned at once by ``cluster.run(graph)``.

    ``wait()`` blocks and raises the run's error, ``done()`` polls, ``state()`` says
    ``"queued"``, ``"running"``, ``"done"`` or ``"failed"``, ``cancel(reason)`` stops
    it on every rank, ``result(future)`` gives a value of this run, ``trace`` its
    events, ``stats`` what it did, ``show()`` draws it live. ``seconds`` and
    ``compile_seconds``: how long it ran and compiled (the slowest rank's).

    Parameters
    ----------
    cluster : the cluster it runs on.
    graph : the graph it runs.
    plan : the plan it follows (made from ``graph`` and the cluster's size if None).
    """

    where = "ranks"  # what __repr__ calls the cluster's members
    open = False  # made with ``open=True``: takes ``submit`` calls until closed
    _closed = True  # (a subclass's open run: False until close())
    _submitted = 0  # calls submitted through this handle (here, on this rank)

    def __init__(self, cluster: Any, graph: Graph, plan: Plan | None = None):
        self.cluster = cluster
        self.graph = graph
        self.plan = plan if plan is not None else make_plan(graph, cluster.size)
        self.seconds = 0.0
        self.compile_seconds = 0.0
        self._stats = Stats()
        # tasks with a value (``@tg.task`` calls; a kernel writes tiles instead)
        self._valued = frozenset(t.id for t in graph.tasks if not hasattr(t.fn, "modes"))
        self.values: dict[int, object] = {}  # this run's, by task id

    def _own_graph(self) -> None:
        """Make this run the graph's latest: ``future.result()`` reads it. Called by a
        subclass once ``values`` is in place, when the run is made."""
        self.graph.last_run = self

    # -- state -----------------------------------------------------------------------

    def close(self) -> None:
        """No more ``submit`` calls: an open run ends once its tasks and calls have."""
        raise NotImplementedError

    def _close_to_read(self, what: str) -> None:
        """Close an open run that ``what`` (``trace``, ``summary()``, ``result()``) must
        wait for the end of, and say so: a look at it ended an ensemble with no word (a
        trial)."""
        if self.closed or self.done():
            return
        if self._submitted:  # (not where none was: a batch job's other ranks, a review)
            warnings.warn(
                f"run.{what} waits for the end of open run {self.graph.name!r}, so it "
                "closes it: it takes no more submit() calls (close() first to say so; "
                "run.show() watches a run live)",
                RuntimeWarning,
                stacklevel=3,
            )
        self.close()

    @property
    def closed(self) -> bool:
        """Whether ``submit`` takes no more calls: a run not made with ``open=True``, or
        an open one once ``close()`` (or ``wait()``) was called; it then ends once its
        tasks and calls have."""
        return not self.open or self._closed

    def done(self) -> bool:
        """Whether the run has ended (done or failed) on every rank."""
        raise NotImplementedError

    def state(self) -> str:
        """``"queued"``, ``"running"``, ``"done"`` or ``"failed"``."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> RunHandle:
        """Block until the run ends and return it; raise its error if it failed on any
        rank (TaskError, RunError); TimeoutError if it is still going after ``timeout``
        seconds (the run goes on). Ctrl-C meanwhile cancels the run and re-raises."""
        raise NotImplementedError

    def cancel(self, reason: str | None = None) -> None:
        """Stop the run on every rank; ``wait()`` then raises RunError naming
        ``reason``. A queued run is stopped before it starts; cancelling an ended run,
        or cancelling twice, changes nothing."""
        raise NotImplementedError

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks in all), as far as this side knows now."""
        raise NotImplementedError

    def calls_ended(self) -> int:
        """Spawned and submitted calls ended so far, as far as this side knows (a batch
        job's rank: its own; the notebook: every engine's, from their batches)."""
        return 0

    def batches(self) -> list[dict]:
        """Progress and event batches that arrived since the last call, in order."""
        raise NotImplementedError

    @property
    def trace(self) -> Trace:
        """Every rank's events of this run, merged (waits for the run to end)."""
        raise NotImplementedError

    @property
    def stats(self) -> Stats:
        """What the run did (tasks, messages, bytes, spawned calls, steals); zeros until
        it ends. In a batch job: this rank's own counts; on engines: every rank's
        counts summed, its seconds and steal latency median the largest rank's (the
        trace's ``dynamic()`` gives the median over every steal)."""
        return self._stats

    def show(self, **kwargs):
        """Live view: a widget in a notebook, a progress line and trace files elsewhere.
        ``kwargs`` go to :func:`taskgraph.trace.widgets.show`."""
        from ..trace.widgets import show  # (ipywidgets: heavy, optional)

        return show(self, **kwargs)

    def __repr__(self) -> str:
        return f"<Run {self.graph.name!r} on {self.cluster.size} {self.where}: {self.state()}>"

    # -- the summary -----------------------------------------------------------------

    def summary(self) -> Summary:
        """What the run did, over every rank, once it has ended (waits for it, without
        raising its error): calls that succeeded (with retries, and those read from
        the checkpoint), failed (each with its error), were skipped, and how many
        retries happened. Prints readably; a table in a notebook. RunError if the
        ranks' counts never came (engines that died)."""
        self._close_to_read("summary()")
        error: Exception | None = None
        join = getattr(self, "join", None)
        if join is not None:
            join()
        else:  # (an engine run: its wait() raises the run's error, the summary stands)
            try:
                self.wait()
            except Exception as exc:  # noqa: BLE001 - the summary says what failed
                error = exc
        found = self._summary()
        if found is None and not hasattr(self, "executor"):  # (an engine run)
            raise RunError(
                f"run {self.graph.name!r}: no summary, the engines did not send their "
                f"counts: {error}"
            ) from error
        return found if found is not None else Summary(self.graph.name)

    def _repr_html_(self) -> str:
        """In a notebook: the run's line and, once it has ended, its summary (so a cell
        that ends in ``run.wait()`` shows what succeeded, failed, was skipped)."""
        head = f"<code>{html.escape(repr(self))}</code>"
        if not self.done():
            return head
        found = self._summary()
        return head if found is None else head + found._repr_html_()

    def _summary(self) -> Summary | None:
        """The run's summary where this side has it (None: not known here)."""
        return getattr(getattr(self, "executor", None), "summary", None)

    def _say_summary(self) -> None:
        """At the end of ``wait()`` in a script: print the summary (once, on rank 0)
        when anything failed, was skipped or retried."""
        if getattr(self, "_summary_said", False):
            return
        self._summary_said = True
        say_summary(self._summary(), getattr(self.cluster, "rank", 0) or 0)

    # -- values ----------------------------------------------------------------------

    def result(self, future=None):
        """Wait, then the value of ``future`` in this run (the graph's only result, a
        value no task reads, if None). Raises the run's error; RunError for a future of
        another graph, GraphError for a kernel's task (it has no value). A value kept on
        one rank is fetched from it (collective in batch: every rank asks)."""
        self._close_to_read("result()")
        self.wait()
        tid = self._task_of(future)
        if tid not in self.values:
            self.values[tid] = self._fetch(tid)
        value = self.values[tid]
        if value.__class__ is Skipped:  # (on_failure="skip": it has no value)
            raise value.exception()
        return value

    def _task_of(self, future) -> int:
        """The task id whose value ``future`` names (the only sink for None)."""
        if future is None:
            sinks = self._sinks()
            if len(sinks) != 1:
                raise RunError(
                    f"run {self.graph.name!r}: the graph has {len(sinks)} results: "
                    "name the future you want"
                )
            return sinks[0]
        if getattr(future, "graph", None) is not self.graph:
            raise RunError(f"{future!r} is not a task of run {self.graph.name!r}")
        if future.id not in self._valued:
            raise GraphError(f"task {self.graph.label(future.id)} is a kernel: it has no value")
        return future.id

    def _sinks(self) -> list[int]:
        """Tasks with a value that no task reads, in order."""
        read = {p for t in self.graph.tasks for p in t.preds}
        return [t.id for t in self.graph.tasks if t.id in self._valued and t.id not in read]

    def _fetch(self, tid: int):
        """The value of task ``tid`` from the rank that keeps it."""
        raise NotImplementedError
