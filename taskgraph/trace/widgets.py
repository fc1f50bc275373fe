"""Watching a run: a live widget in a notebook, a progress line and files elsewhere.

Observation is a subscriber: the views pull event batches from the run
(``run.batches()``) at their own pace, at most every ``interval`` seconds, and the
executor never knows they exist. All aggregation happens here, in Python
(:class:`~taskgraph.trace.Trace`); the browser gets the small ``state`` trait and
only the *new* events, so a 20,000-task run stays responsive.

::

    run.batches() --every 0.25 s--> Trace.ingest --> state (trait) + new rows (message)
                                                         |
                                                    view.js draws
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import anywidget
import traitlets

from ..core import config
from .events import Trace
from .report import STATIC

CHUNK = 5000  # task rows per message when replaying a whole run


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets can be displayed)."""
    shell = (
        sys.modules.get("IPython")
        and getattr(sys.modules["IPython"], "get_ipython", lambda: None)()
    )
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def _source_graph(run):
    return run.graph, run.cluster.size


class RunView(anywidget.AnyWidget):
    """The live view of a run: progress, timeline, communication matrix, utilisation."""

    _esm = STATIC / "view.js"
    if (STATIC / "view.css").exists():
        _css = STATIC / "view.css"
    state = traitlets.Dict().tag(sync=True)

    def __init__(self, run=None, *, trace: Trace | None = None, interval: float = 0.25):
        super().__init__()
        self.run = run
        self.interval = interval
        self.cost_seconds = 0.0  # notebook-side time spent keeping the view current
        self.updates = 0
        self._lock = threading.Lock()
        if trace is None:
            graph, nranks = _source_graph(run)
            trace = Trace.for_graph(graph, nranks)
        self.trace = trace
        self.state = trace.state()
        self.on_msg(self._on_msg)
        self._thread = None
        if run is not None:
            self._thread = threading.Thread(target=self._pump, name="taskgraph-view", daemon=True)
            self._thread.start()

    # -- keeping up with the run ---------------------------------------------------------

    def _pump(self) -> None:
        while True:
            finished = self.run.done()
            self.update()
            if finished:
                break
            time.sleep(self.interval)
        self._finish()

    def update(self) -> int:
        """Take the batches that arrived, send what is new; returns new task events."""
        t0 = time.perf_counter()
        with self._lock:
            rows: list[list] = []
            msgs: list[list] = []
            rebased = self.trace.rebased
            nspawned, nsteals = len(self.trace.spawned), len(self.trace.steals)
            for batch in self.run.batches():
                new_rows, new_msgs = self.trace.ingest(batch)
                rows += new_rows
                msgs += new_msgs
            spawned = self.trace.spawned[nspawned:]
            steals = self.trace.steals[nsteals:]
            if self.trace.rebased != rebased:  # rows already drawn moved: draw all again
                self._replay()
            elif rows or msgs or spawned or steals:
                self.send(self.trace.event_rows(rows, msgs, spawned, steals))
            self.state = self.trace.state()
            self.updates += 1
        self.cost_seconds += time.perf_counter() - t0
        return len(rows)

    def _finish(self) -> None:
        """The run ended: switch to its merged trace (every rank) and say how it ended."""
        t0 = time.perf_counter()
        try:
            final = self.run.trace
        except Exception as exc:  # noqa: BLE001 - the view must survive anything
            with self._lock:
                error = f"{type(exc).__name__}: {exc}"
                try:
                    self.trace.finish(error)
                    self.state = self.trace.state()
                except Exception:  # noqa: BLE001 - (then say only how it ended)
                    self.state = {**self.state, "status": "failed", "error": error}
            return
        with self._lock:
            complete = all(
                len(getattr(final, rows)) == len(getattr(self.trace, rows))
                for rows in ("tasks", "messages", "spawned", "steals")
            )
            self.trace = final
            if not complete:  # e.g. a batch job's view saw only rank 0 while it ran
                self._replay()
            self.state = final.state()
        self.cost_seconds += time.perf_counter() - t0

    # -- the browser side --------------------------------------------------------------

    def _on_msg(self, widget, content, buffers) -> None:
        if isinstance(content, dict) and content.get("kind") == "replay":
            with self._lock:
                self._replay()

    def _replay(self) -> None:
        self.send({"kind": "reset"})
        tr = self.trace
        tasks, spawned = tr.tasks, tr.spawned
        for i in range(0, max(len(tasks), len(spawned), 1), CHUNK):
            first = i == 0
            self.send(
                tr.event_rows(
                    tasks[i : i + CHUNK],
                    tr.messages if first else [],
                    spawned[i : i + CHUNK],
                    tr.steals if first else None,
                )
            )

    def wait(self, timeout: float | None = None) -> RunView:
        """Until the view has caught up with the end of the run."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self


class TextView:
    """Outside a notebook: a progress line (tqdm), then the trace files."""

    def __init__(self, run, *, interval: float = 0.25, directory: str | None = None, stream=None):
        self.run = run
        self.interval = interval
        self.directory = Path(directory or config.trace_dir())
        self.stream = stream or sys.stderr
        self.files: list[str] = []
        self._thread = threading.Thread(target=self._pump, name="taskgraph-progress")
        self._thread.start()  # not a daemon: the files get written before exit

    def _pump(self) -> None:
        from tqdm import tqdm

        rank = getattr(self.run.cluster, "rank", 0)
        loud = rank in (0, None)  # rank 0 of a batch job, or the notebook
        total = self.run.progress()[1]
        size = self.run.cluster.size
        desc = self.run.graph.name + (f" (rank 0 of {size})" if rank == 0 and size > 1 else "")
        bar = tqdm(
            total=total,
            desc=desc,
            unit="task",
            file=self.stream,
            disable=not loud,
            mininterval=self.interval,
        )
        while True:
            finished = self.run.done()
            bar.update(max(0, self.run.progress()[0] - bar.n))
            calls = self.run.calls_ended()
            if calls:  # (a run of spawned or submitted calls: its tasks say little)
                bar.set_postfix_str(f"{calls} calls ended", refresh=False)
            if finished:
                break
            time.sleep(self.interval)
        bar.close()
        if not loud:
            return
        try:
            self.files = write_files(self.run.trace, self.directory)
        except OSError as exc:  # one line, not a traceback from this thread
            print(f"taskgraph: warning: trace not written: {exc}", file=self.stream)
            return
        print(f"taskgraph: trace written to {', '.join(self.files)}", file=self.stream)

    def wait(self, timeout: float | None = None) -> TextView:
        self._thread.join(timeout)
        return self


def write_files(trace: Trace, directory: Path) -> list[str]:
    """Write ``trace`` as Chrome JSON and as an HTML report into ``directory`` (made if
    missing); each file whole or not at all. Returns the paths; raises OSError (naming
    the directory or file) where they cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot make {directory}: {exc.strerror or exc}") from exc
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", trace.title) or "run"
    return [
        trace.to_chrome(directory / f"{stem}.trace.json"),
        trace.to_html(directory / f"{stem}.html"),
    ]


def show(run, *, display: bool = True, **kwargs):
    """``run.show()``: the widget in a notebook (displayed here), else a progress line."""
    if not in_notebook():
        return TextView(run, **kwargs)
    view = RunView(run, **kwargs)
    if display:
        from IPython.display import display as ipy_display

        ipy_display(view)
        return None
    return view
