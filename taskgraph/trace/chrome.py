"""Chrome trace-event JSON (opens in Perfetto) from a merged trace: a process per
rank, a thread per worker and one for the rank's network, a flow arrow per message."""

from __future__ import annotations

NETWORK_TID = 1000  # the Chrome "thread" of a rank's network events


def chrome_events(trace, task_failed: int) -> list[dict]:
    """The trace-event list for ``trace`` (a :class:`taskgraph.trace.events.Trace`);
    task rows whose state is ``task_failed`` are marked failed."""
    events: list[dict] = []
    for r in range(trace.nranks):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": r,
                "tid": 0,
                "args": {"name": f"rank {r}"},
            }
        )
        for w in range(max(1, trace.workers[r])):
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": r,
                    "tid": w,
                    "args": {"name": f"worker {w}"},
                }
            )
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": r,
                "tid": NETWORK_TID,
                "args": {"name": "network"},
            }
        )
    for r, w, s, e, k, t, st in trace.tasks:
        events.append(
            {
                "ph": "X",
                "name": trace.labels[t],
                "cat": trace.kernels[k],
                "pid": r,
                "tid": w,
                "ts": s * 1e6,
                "dur": (e - s) * 1e6,
                "args": {"task": t, "state": "failed" if st == task_failed else "done"},
            }
        )
    for i, (s, d, b, tag, t0, t1) in enumerate(trace.messages):
        common = {"cat": "message", "id": i, "args": {"bytes": b, "tag": tag}}
        events.append(
            {
                "ph": "s",
                "name": f"{s}->{d}",
                "pid": s,
                "tid": NETWORK_TID,
                "ts": t0 * 1e6,
                **common,
            }
        )
        events.append(
            {
                "ph": "X",
                "name": f"send to {d}",
                "pid": s,
                "tid": NETWORK_TID,
                "ts": t0 * 1e6,
                "dur": max(1.0, (t1 - t0) * 1e6),
                **common,
            }
        )
        events.append(
            {
                "ph": "f",
                "bp": "e",
                "name": f"{s}->{d}",
                "pid": d,
                "tid": NETWORK_TID,
                "ts": t1 * 1e6,
                **common,
            }
        )
    return events
