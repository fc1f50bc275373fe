"""The live view and the HTML report draw dynamic runs: spawned calls as bars on their
lanes, steals as lines from the victim's lane to the thief's. Python side: what the
front end receives, live and on replay (and nothing new for static runs); browser
side: the report of a recorded stealing trace in headless chromium."""

from __future__ import annotations

import json
import random
import re
import sys
import time

import pytest
from test_browser import CHROMIUM, needs_browser
from test_trace_dynamic import plain, tree
from test_widgets import Feed, Recording

import taskgraph as tg
from taskgraph.trace.events import TASK_DONE, TASK_FAILED, Recorder, Trace
from taskgraph.trace.report import report_html

pytestmark = pytest.mark.timeout(120)


def stealing_trace() -> Trace:
    """An empty trace of a 2-rank run of ``root()``, one worker per rank."""
    return Trace("steal", 2, ["root()"], [0], ["root"], preds=[[]])


def recorders() -> tuple[Recorder, Recorder]:
    """Rank 0 runs root() and spawns; rank 1 steals two calls from it (one host, so the
    ranks share a clock: rank 0's recorder starts first, so no rows move)."""
    r0 = Recorder(1, 0, workers=1, rank=0, host="h")
    r1 = Recorder(0, 0, workers=1, rank=1, host="h")
    r1.t0 = r0.t0  # the same time zero: the times below are the merged ones
    return r0, r1


def record_first(r0: Recorder, r1: Recorder) -> None:
    t = r0.t0
    r0.spawned(0, t + 0.1, t + 0.2, "f(1)", TASK_DONE)
    r0.spawned(0, t + 0.5, t + 0.55, "g(0)", TASK_FAILED)
    r1.stole(0, "f(2)", t + 0.3, t + 0.30005)
    r1.spawned(0, t + 0.30008, t + 0.35, "f(2)", TASK_DONE)


def record_second(r0: Recorder, r1: Recorder) -> None:
    t = r0.t0
    r1.stole(0, "f(3)", t + 0.6, t + 0.60015)
    r1.spawned(0, t + 0.6002, t + 0.7, "f(3)", TASK_DONE)
    r0.task(0, 0, t, t + 0.9, TASK_DONE)
    for r in (r0, r1):
        r.wall = 1.0


def recorded(pushed: bool = False) -> Trace:
    """The whole recorded stealing run, merged (``pushed``: and a call pushed to rank 1)."""
    r0, r1 = recorders()
    record_first(r0, r1)
    record_second(r0, r1)
    if pushed:
        r1.stole(0, "f(4)", r0.t0 + 0.8, r0.t0 + 0.8001, pushed=True)
    trace = stealing_trace()
    for r in (r0, r1):
        trace.ingest(r.batch()[0])
    trace.finish()
    return trace


def drawn(messages: list[dict]) -> tuple[list, list, list]:
    """Task, spawned and steal rows the front end holds after ``messages``."""
    tasks: list = []
    spawned: list = []
    steals: list = []
    for m in messages:
        if m["kind"] == "reset":
            tasks, spawned, steals = [], [], []
            continue
        tasks += m["tasks"]
        spawned += m.get("spawned", [])
        steals += m.get("steals", [])
    return tasks, spawned, steals


def test_the_live_view_sends_only_new_spawned_rows_and_steals_each_update():
    r0, r1 = recorders()
    record_first(r0, r1)
    first = [r0.batch()[0], r1.batch()[0]]
    c0, c1 = r0.batch()[1], r1.batch()[1]
    record_second(r0, r1)
    second = [r0.batch(c0)[0], r1.batch(c1)[0]]
    view = Recording(trace=stealing_trace())
    view.run = Feed([first, second])
    view.sent.clear()
    view.update()
    _, spawned, steals = drawn(view.sent)
    assert [(lane, name, state) for lane, _s, _e, state, name in spawned] == [
        (0, "f(1)", TASK_DONE),
        (0, "g(0)", TASK_FAILED),
        (1, "f(2)", TASK_DONE),
    ]
    assert [(t, v, name, p) for t, v, name, _req, _arr, p in steals] == [(1, 0, "f(2)", False)]
    assert steals[0][4] - steals[0][3] == pytest.approx(5e-5, abs=1e-7)
    n = len(view.sent)
    view.update()
    tasks, spawned, steals = drawn(view.sent[n:])  # the second update: only what is new
    assert [row[6] for row in tasks] == ["root()"]
    assert [row[4] for row in spawned] == ["f(3)"] and spawned[0][0] == 1
    assert [row[2] for row in steals] == ["f(3)"]
    assert view.state["dynamic"]["steals"] == 2


def test_a_view_opened_late_replays_spawned_rows_and_steals():
    view = Recording(trace=recorded())
    view.sent.clear()
    view._on_msg(view, {"kind": "replay"}, [])
    assert view.sent[0] == {"kind": "reset"}
    tasks, spawned, steals = drawn(view.sent)
    assert len(tasks) == 1 and len(spawned) == 4 and len(steals) == 2


class Ended(Feed):
    """A run that has ended, whose merged trace holds more than its batches showed."""

    def __init__(self, trace: Trace):
        super().__init__([])
        self.trace = trace

    def done(self) -> bool:
        return True


def test_at_the_end_steals_only_the_merged_trace_holds_are_drawn():
    """A batch job's view sees rank 0 while the run goes; rank 1's steals come with the
    merged trace, which has as many task rows: the view still draws everything again."""
    r0, r1 = recorders()
    record_first(r0, r1)
    record_second(r0, r1)
    view = Recording(trace=stealing_trace())
    view.run = Feed([[r0.batch()[0]]])
    view.update()
    assert drawn(view.sent)[2] == []
    final = recorded()
    assert len(final.tasks) == len(view.trace.tasks)
    view.run = Ended(final)
    view._finish()
    _, spawned, steals = drawn(view.sent)
    assert len(spawned) == 4 and [row[2] for row in steals] == ["f(2)", "f(3)"]


def test_a_real_run_hands_its_spawned_calls_to_the_view():
    with tg.Graph("tree") as g:
        r = tree(3)
    run = tg.current_cluster().run(g, workers=2)
    view = Recording(run, interval=0.05).wait(30)
    run.wait()
    assert r.result() == 8
    _, spawned, steals = drawn(view.sent)
    assert len(spawned) == 14 and {row[0] for row in spawned} <= {0, 1}
    assert sorted(row[4] for row in spawned).count("tree(0)") == 8
    assert steals == []  # one rank: nobody to steal from
    assert view.state["status"] == "done"


def test_a_static_run_sends_no_dynamic_keys_and_its_report_none():
    with tg.Graph("static") as g:
        plain(plain(1))
    run = tg.current_cluster().run(g)
    view = Recording(run, interval=0.05).wait(30)
    run.wait()
    events = [m for m in view.sent if m["kind"] == "events"]
    assert events and all(set(m) == {"kind", "tasks", "messages"} for m in events)
    data = report_data(report_html(run.trace))
    assert set(data["events"][0]) == {"kind", "tasks", "messages"}


def test_calls_submitted_to_an_empty_graph_are_not_an_empty_run():
    trace = Trace("submitted", 1, [], [], [])
    assert trace.status == "empty"
    rec = Recorder(0, 0)
    rec.spawned(0, rec.t0, rec.t0 + 0.1, "f(1)", TASK_DONE)
    trace.ingest(rec.batch()[0])
    assert trace.status == "running"
    trace.finish()
    assert trace.status == "done"


def serial_fib(n: int) -> int:
    return n if n < 2 else serial_fib(n - 1) + serial_fib(n - 2)


@tg.task
def nap_fib(n: int, cutoff: int, delay: float) -> int:
    """fib(n) by spawns down to ``cutoff``; each leaf naps up to ``delay`` s (seeded)."""
    if n < cutoff:
        time.sleep(random.Random(n).random() * delay)
        return serial_fib(n)
    a = tg.spawn(nap_fib, n - 1, cutoff, delay)
    b = tg.spawn(nap_fib, n - 2, cutoff, delay)
    return a.result() + b.result()


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_stealing_run_on_two_engines_reaches_the_view_with_its_steals():
    from conftest import assert_no_new_children, child_pids, engines_marker

    before = child_pids()
    with engines_marker(sys.modules[__name__]), tg.Cluster(n=2) as c:
        with tg.Graph("fib") as g:
            f = nap_fib(16, 9, 0.01)
        run = c.run(g, workers=1)
        view = Recording(run, interval=0.05).wait(120)
        run.wait(120)
        assert f.result() == 987
        trace = run.trace
    assert_no_new_children(before)
    assert trace.steals, "the idle engine stole"
    _, spawned, steals = drawn(view.sent)
    assert sorted(map(tuple, steals)) == sorted(map(tuple, trace.steals))
    assert len(spawned) == len(trace.spawned)
    assert {lane for lane, *_ in spawned} == {0, 1}, "both ranks' lanes"


def report_data(html: str) -> dict:
    text = re.search(r'id="taskgraph-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(text.replace("<\\/", "</"))


def test_the_report_carries_spawned_rows_and_steals():
    data = report_data(report_html(recorded()))
    ev = data["events"][0]
    assert len(ev["spawned"]) == 4 and [s[2] for s in ev["steals"]] == ["f(2)", "f(3)"]


# -- the report in a real browser ---------------------------------------------------------

AXIS_H, LANE_H = 22, 26  # view.js: px above the lanes, and a lane's height with <= 8 lanes


def launch(p):
    return p.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
    )


def open_report(page, path) -> dict:
    """Open the report at ``path``; returns the timeline canvas's box and counts."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_function(
        "() => document.querySelector('canvas.tg-timeline')?.dataset.steals !== undefined",
        timeout=20_000,
    )
    assert errors == []
    return page.eval_on_selector(
        "canvas.tg-timeline",
        "c => ({box: c.getBoundingClientRect().toJSON(), steals: c.dataset.steals,"
        " spawned: c.dataset.spawned})",
    )


def pixel(page, x: float, y: float) -> list[int]:
    """The canvas's colour at (x, y) css px from its corner."""
    return page.eval_on_selector(
        "canvas.tg-timeline",
        f"""c => {{ const d = c.width / c.getBoundingClientRect().width;
            return Array.from(c.getContext('2d').getImageData(
                Math.round({x} * d), Math.round({y} * d), 1, 1).data); }}""",
    )


def tooltip_at(page, box: dict, x: float, y: float) -> str:
    page.mouse.move(box["x"] + x, box["y"] + y)
    page.wait_for_selector(".tg-tooltip", state="visible", timeout=5_000)
    return page.text_content(".tg-tooltip")


@needs_browser
def test_the_report_draws_steals_between_lanes_and_spawned_calls_in_chromium(tmp_path):
    from playwright.sync_api import sync_playwright

    trace = recorded()
    trace.to_html(tmp_path / "steal.html")
    static = Trace("static", 2, ["root()"], [0], ["root"], preds=[[]])
    r0, _ = recorders()
    r0.task(0, 0, r0.t0, r0.t0 + 0.9, TASK_DONE)
    r0.wall = 1.0
    static.ingest(r0.batch()[0])
    static.finish()
    static.to_html(tmp_path / "static.html")
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            got = open_report(page, tmp_path / "steal.html")
            box = got["box"]
            sc = box["width"] / (trace.makespan * 1.01)  # the automatic window
            legend = page.eval_on_selector_all(
                ".tg-legend-steal, .tg-legend-spawned", "els => els.map(e => e.textContent)"
            )
            # f(2)'s steal line, half-way from rank 0's lane to rank 1's
            mid_x, mid_y = (0.3 + 0.30005) / 2 * sc, AXIS_H + LANE_H
            line = [pixel(page, mid_x + dx, mid_y) for dx in (-1, 0, 1)]
            steal_tip = tooltip_at(page, box, mid_x, mid_y)
            lower = AXIS_H + LANE_H - 5  # the lower part of a lane: spawned calls
            failed = pixel(page, 0.525 * sc, lower)
            spawned_tip = tooltip_at(page, box, 0.33 * sc, LANE_H + lower)
            task_tip = tooltip_at(page, box, 0.8 * sc, AXIS_H + 6)
            page.screenshot(path=str(tmp_path / "steal.png"))
            plain_page = browser.new_page(viewport={"width": 1100, "height": 900})
            quiet = open_report(plain_page, tmp_path / "static.html")
            quiet_legend = plain_page.eval_on_selector_all(
                ".tg-legend-steal, .tg-legend-spawned", "els => els.length"
            )
        finally:
            browser.close()
    assert (got["steals"], got["spawned"]) == ("2", "4")
    assert legend == ["f (spawned)", "g (spawned)", "steal (victim → thief)"]
    assert any(b > g + 60 and r > g + 20 for r, g, b, _a in line), line  # purple
    assert "steal: f(2)" in steal_tip and "rank 1 (thief)" in steal_tip, steal_tip
    assert "rank 0 (victim)" in steal_tip and "latency 50.0 µs" in steal_tip, steal_tip
    assert failed[:3] == [0x11, 0x11, 0x11], "a failed spawned call is drawn as failed"
    assert "f(2)" in spawned_tip and "spawned call" in spawned_tip, spawned_tip
    assert "root()" in task_tip and "kernel root" in task_tip, task_tip
    assert (quiet["steals"], quiet["spawned"], quiet_legend) == ("0", "0", 0)


@needs_browser
def test_the_header_counts_pushed_calls_apart_from_steals_in_chromium(tmp_path):
    """Pushed calls are drawn as lines too; the header said only "N steals", fewer than
    the lines drawn (a trial: 10 steals and 2 pushes, 12 lines)."""
    from playwright.sync_api import sync_playwright

    recorded(pushed=True).to_html(tmp_path / "pushed.html")
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            got, header = (
                open_report(page, tmp_path / "pushed.html"),
                page.text_content(".tg-stats"),
            )
        finally:
            browser.close()
    assert got["steals"] == "3"  # (lines drawn: 2 steals and the pushed call)
    assert "2 steals" in header and "1 pushed" in header, header
