"""The live view's Python side: what it sends, how it keeps up, how it ends.

The browser side is exercised for real in tests/test_browser.py.
"""

from __future__ import annotations

import time

import pytest

import taskgraph as tg
from taskgraph.linalg import cholesky
from taskgraph.trace import Trace
from taskgraph.trace.widgets import RunView, TextView, in_notebook

pytestmark = pytest.mark.timeout(120)


class Recording(RunView):
    """A view that keeps what it would send to the browser."""

    def __init__(self, *args, **kwargs):
        self.sent: list[dict] = []
        super().__init__(*args, **kwargs)

    def send(self, content, buffers=None):
        self.sent.append(content)


def task_rows(messages: list[dict]) -> list[list]:
    rows: list[list] = []
    for m in messages:
        if m["kind"] == "reset":
            rows = []
        else:
            rows += m["tasks"]
    return rows


@tg.kernel(modes="rw", dims="mn")
def nap(t):
    time.sleep(0.02)


def naps(n: int) -> tg.Graph:
    B = tg.TiledMatrix.zeros((2, 2), 2)
    with tg.Graph("naps") as g:
        for _ in range(n):
            nap(B[0, 0].rw)
    return g


def test_the_view_follows_a_run_live_and_ends_complete():
    run = tg.current_cluster().run(naps(60))  # about 1.2 s
    view = Recording(run, interval=0.1)
    seen_running = []
    while not run.done():
        seen_running.append(view.state["progress"]["done"])
        time.sleep(0.1)
    view.wait(10)
    assert any(0 < d < 60 for d in seen_running), "progress moved while running"
    assert view.updates >= 5, "at least twice a second"
    state = view.state
    assert state["status"] == "done" and state["progress"]["percent"] == 100.0
    assert [lane["rank"] for lane in state["lanes"]] == [0] * len(state["lanes"])
    assert state["kernels"] == ["nap"]
    rows = task_rows(view.sent)
    assert sorted(r[4] for r in rows) == list(range(60)), "every task once, after replay"
    assert all(r[6] == "nap(M" + r[6][5:] for r in rows)


@tg.kernel(modes="rw", dims="mn")
def tick(t):
    time.sleep(0.005)


def test_progress_per_kernel_with_rate_and_time_left_at_the_default_rate():
    B = tg.TiledMatrix.zeros((2, 2), 2)
    with tg.Graph("mixed") as g:
        for _ in range(40):
            nap(B[0, 0].rw)
            tick(B[0, 0].rw)
    t0 = time.monotonic()
    run = tg.current_cluster().run(g)  # about 1 s
    view = Recording(run)  # the default rate
    samples = []
    while not run.done():
        samples.append(view.state["progress"])
        time.sleep(0.05)
    view.wait(10)
    wall = time.monotonic() - t0
    assert view.updates >= 2 * wall - 1, f"{view.updates} updates in {wall:.1f} s"
    mid = [p for p in samples if 0 < p["done"] < p["total"]]
    assert mid, "no sample while the run went on"
    p = mid[len(mid) // 2]
    assert p["rate"] > 0 and p["eta"] > 0
    assert p["eta"] == pytest.approx((p["total"] - p["done"]) / p["rate"])
    assert 0 < p["percent"] < 100 and p["elapsed"] > 0
    final = view.state["progress"]
    assert final["eta"] is None and final["percent"] == 100.0
    kernels = {k["name"]: k for k in final["kernels"]}
    assert set(kernels) == {"nap", "tick"}
    assert kernels["nap"]["done"] == kernels["nap"]["total"] == 40
    assert kernels["tick"]["done"] == kernels["tick"]["total"] == 40
    assert kernels["nap"]["seconds"] > 40 * 0.02 * 0.9 > kernels["tick"]["seconds"]


def test_the_view_shows_a_failure_and_keeps_working():
    @tg.kernel(modes="rw", dims="mn")
    def boom(t):
        raise ValueError("half-way failure")

    g = naps(5)
    B = g.matrices()[0]
    with g:
        boom(B[0, 0].rw)
    run = tg.current_cluster().run(g)
    view = Recording(run, interval=0.05)
    view.wait(10)
    assert view.state["status"] == "failed"
    assert "half-way failure" in view.state["error"]
    failed = [r for r in task_rows(view.sent) if r[5] == 2]
    assert [r[4] for r in failed] == [5]
    with pytest.raises(tg.TaskError):
        run.wait()


def test_an_empty_graph_shows_as_empty():
    run = tg.current_cluster().run(tg.Graph("nothing"))
    view = Recording(run, interval=0.05).wait(10)
    assert view.state["status"] == "empty" and view.state["progress"]["total"] == 0


def test_a_browser_asking_to_replay_gets_everything_again():
    run = tg.current_cluster().run(naps(10)).wait()
    view = Recording(run, interval=0.05).wait(10)
    view.sent.clear()
    view._on_msg(view, {"kind": "replay"}, [])
    assert view.sent[0] == {"kind": "reset"}
    assert sorted(r[4] for r in task_rows(view.sent)) == list(range(10))


def test_a_view_of_a_saved_trace(tmp_path):
    run = tg.current_cluster().run(naps(4)).wait()
    path = run.trace.to_chrome(tmp_path / "t.json")
    view = Recording(trace=Trace.load(path))
    assert view.state["status"] == "done" and view.state["progress"]["done"] == 4


def test_outside_a_notebook_show_prints_progress_and_writes_files(tmp_path, capsys):
    assert not in_notebook()
    A = tg.TiledMatrix.random_spd(512, 128)
    run = tg.current_cluster().run(cholesky(A))
    view = run.show(directory=str(tmp_path))
    assert isinstance(view, TextView)
    run.wait()
    view.wait(30)
    err = capsys.readouterr().err
    assert "cholesky" in err and "100%" in err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["cholesky.html", "cholesky.trace.json"]
    html = (tmp_path / "cholesky.html").read_text()
    assert "renderStatic" in html and "potrf(A[0,0])" in html
    assert "http://" not in html and "https://" not in html, "the report works offline"
    assert Trace.load(tmp_path / "cholesky.trace.json").summary()["tasks"] == 20


class Feed:
    """Hands a view chosen batches (which rank's batch comes first is timing on a
    real run)."""

    def __init__(self, batches: list[list[dict]]):
        self.pending = batches

    def batches(self) -> list[dict]:
        return self.pending.pop(0) if self.pending else []


def test_an_earlier_rank_arriving_late_redraws_the_moved_rows():
    """Rank 0's batch comes first, then rank 1's, whose clock started earlier: the
    rows already drawn moved, so the view draws everything again, all at times >= 0."""
    from test_trace import one_task_batch

    view = Recording(trace=Trace("clocks", 2, ["a", "b"], [0, 0], ["k"]))
    view.run = Feed(
        [
            [one_task_batch(0, "node1", 100.5, 0.1, 0.2)],
            [one_task_batch(1, "node1", 100.0, 0.1, 0.2)],
        ]
    )
    view.update()
    assert [r[1] for r in task_rows(view.sent)] == [0.1]
    view.update()
    assert view.sent[-2] == {"kind": "reset"}
    starts = sorted(r[1] for r in task_rows(view.sent))
    assert starts == pytest.approx([0.1, 0.6])
