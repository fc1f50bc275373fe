"""How a many-task ensemble is seen (taskgraph.trace): attempt rows recorded on a
rank and merged, the attempts table, overheads per call, the utilisation picture per
core, the state counts; in the HTML report and the widget. Hand-made rows, and runs."""

from __future__ import annotations

import pytest

from taskgraph.trace.events import Trace
from taskgraph.trace.recorder import (
    ATTEMPT_DONE,
    ATTEMPT_RETRIED,
    ATTEMPT_STATES,
    Recorder,
)

pytestmark = pytest.mark.timeout(60)


def rank_batch(rank: int, rows: list[tuple], workers: int = 2, t0: float = 100.0) -> dict:
    """A batch of ``rank`` holding attempt ``rows`` (times in seconds since its start)."""
    rec = Recorder(0, 0, workers=workers, rank=rank, host="h")
    rec.t0 = t0
    for row in rows:
        w, label, task, n, st, *times, cores = row
        rec.attempt(w, label, task, n, st, *[None if x is None else x + t0 for x in times], cores)
    rec.wall = max((r[8] or 0.0) for r in rows) if rows else 0.0
    return rec.batch()[0]


def test_attempt_rows_are_recorded_batched_and_merged_with_their_rank():
    rows0 = [
        (0, "f(1)", -1, 1, ATTEMPT_RETRIED, 0.0, 0.1, 0.2, 0.5, 1),
        (0, "f(1)", -1, 2, ATTEMPT_DONE, 0.5, 0.5, 0.6, 1.0, 1),
    ]
    rows1 = [(1, "g", 3, 1, "skipped", 0.3, None, None, None, 2)]
    trace = Trace("t", 2, [], [], [])
    trace.ingest(rank_batch(0, rows0))
    trace.ingest(rank_batch(1, rows1))
    assert trace.status == "running"
    got = [[round(x, 9) if isinstance(x, float) else x for x in r] for r in trace.attempt_rows]
    assert got == [
        [0, 0, "f(1)", -1, 1, "retried", 0.0, 0.1, 0.2, 0.5, 1],
        [0, 0, "f(1)", -1, 2, "done", 0.5, 0.5, 0.6, 1.0, 1],
        [1, 1, "g", 3, 1, "skipped", 0.3, None, None, None, 2],
    ]
    again = Trace.from_dict(trace.to_dict())
    assert again.attempt_rows == trace.attempt_rows


def test_a_batch_without_attempts_is_as_before_and_the_cursor_moves_on():
    rec = Recorder(1, 0)
    batch, cursor = rec.batch()
    assert "attempts" not in batch["events"]
    c = rec.clock()
    rec.attempt(0, "f", -1, 1, ATTEMPT_DONE, c, c, c, c, 1)
    batch, cursor = rec.batch(cursor)
    assert batch["events"]["attempts"]["label"] == ["f"]
    batch, cursor = rec.batch(cursor)
    assert "attempts" not in batch["events"]
    assert set(ATTEMPT_STATES) == {"done", "failed", "retried", "skipped", "checkpoint-hit"}


def test_a_disabled_recorder_keeps_no_attempts():
    rec = Recorder(0, 0, enabled=False)
    rec.attempt(0, "f", -1, 1, ATTEMPT_DONE, 0.0, 0.0, 0.0, 0.0, 1)
    assert rec.attempt_rows == []
