"""Notebook-side cost of the live widget for a 20,000-task graph on 2 engines.

    python -m benchmarks.widget [--tasks 20000] [--engines 2] [--task-ms 0.4]

The graph is ``tasks`` independent small tasks (each sleeps ``task-ms``) so the run
lasts a few seconds and the view updates live. Prints one JSON object: the seconds
the notebook spent keeping the view current (ingesting batches, building state,
sending rows) against the run's wall time, per update, and the bytes sent to the
browser.
"""

from __future__ import annotations

import argparse
import json
import time

import taskgraph as tg
from taskgraph.core.machine import describe
from taskgraph.trace.widgets import RunView


class Measured(RunView):
    """Counts the bytes the browser would receive (outside a kernel nothing is sent)."""

    sent_bytes = 0

    def send(self, content, buffers=None):
        self.sent_bytes += len(json.dumps(content))
        super().send(content, buffers)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20000)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--task-ms", type=float, default=0.4)
    args = p.parse_args(argv)
    delay = args.task_ms / 1e3

    @tg.task
    def work(i):
        time.sleep(delay)
        return i

    with tg.Cluster(n=args.engines) as cluster:
        with tg.Graph("many") as g:
            for i in range(args.tasks):
                work(i)
        t0 = time.perf_counter()
        run = cluster.run(g)
        view = Measured(run, interval=0.25)
        run.wait()
        view.wait(60)
        wall = time.perf_counter() - t0
        state_bytes = len(json.dumps(view.state))
        print(
            json.dumps(
                {
                    "benchmark": "widget_cost",
                    "tasks": args.tasks,
                    "engines": args.engines,
                    "run_wall_s": round(wall, 2),
                    "view_cost_s": round(view.cost_seconds, 3),
                    "view_cost_fraction": round(view.cost_seconds / wall, 4),
                    "updates": view.updates,
                    "ms_per_update": round(1e3 * view.cost_seconds / max(1, view.updates), 2),
                    "bytes_to_browser": view.sent_bytes,
                    "state_bytes": state_bytes,
                    "events_in_view": len(view.trace.tasks),
                    "machine": describe(),
                }
            )
        )


if __name__ == "__main__":
    main()
