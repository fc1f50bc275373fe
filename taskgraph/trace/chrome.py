"""Chrome trace-event JSON (opens in Perfetto) from a merged trace: a process per
rank, a thread per worker and one for the rank's network, a flow arrow per message.

Spawned calls are slices on the worker that ran them (cat "spawned"), nested in the
task that waited for them where it ran them itself. A steal is a slice on the thief's
network lane from its request to the call's arrival, and a flow arrow (cat "steal")
from the victim's network lane to it."""

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
    events += _spawned_events(trace, task_failed)
    events += _steal_events(trace, len(trace.messages))
    return events


def _spawned_events(trace, task_failed: int) -> list[dict]:
    return [
        {
            "ph": "X",
            "name": name,
            "cat": "spawned",
            "pid": r,
            "tid": w,
            "ts": s * 1e6,
            "dur": (e - s) * 1e6,
            "args": {"state": "failed" if st == task_failed else "done"},
        }
        for r, w, s, e, name, st in trace.spawned
    ]


def _steal_events(trace, first_id: int) -> list[dict]:
    """Per steal: a slice where the victim gave (at the request: the victim's own time
    of it is not recorded), a slice on the thief from request to arrival, an arrow."""
    events: list[dict] = []
    for i, (thief, victim, name, req, arr, pushed) in enumerate(trace.steals, first_id):
        latency = arr - req
        args = {"task": name, "thief": thief, "victim": victim, "latency_us": latency * 1e6}
        if pushed:
            args["pushed"] = True  # (sent unasked to an idle rank: req is when it was sent)
        common = {"cat": "steal", "id": i, "args": args}
        flow = f"steal {victim}->{thief}"
        events += [
            {"ph": "X", "name": f"stolen by {thief}: {name}", "pid": victim,
             "tid": NETWORK_TID, "ts": req * 1e6, "dur": 1.0, **common},
            {"ph": "s", "name": flow, "pid": victim, "tid": NETWORK_TID, "ts": req * 1e6,
             **common},
            {"ph": "X", "name": f"steal from {victim}: {name}", "pid": thief,
             "tid": NETWORK_TID, "ts": req * 1e6, "dur": max(1.0, latency * 1e6), **common},
            {"ph": "f", "bp": "e", "name": flow, "pid": thief, "tid": NETWORK_TID,
             "ts": arr * 1e6, **common},
        ]  # fmt: skip
    return events
