"""The trace of dynamic runs (taskgraph.trace.events, taskgraph.trace.chrome): spawned
calls as rows, steals as events with thief, victim and latency, merged on rank 0, drawn
as flows in the Chrome export and counted in the summary; in process and on 2 ranks."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest

import taskgraph as tg
from taskgraph.trace.events import TASK_DONE, TASK_FAILED, Recorder, Trace

pytestmark = pytest.mark.timeout(120)


@tg.task
def tree(n: int) -> int:
    """2**n leaves by spawns, each leaf 1."""
    if n == 0:
        return 1
    a, b = tg.spawn(tree, n - 1), tg.spawn(tree, n - 1)
    return a.result() + b.result()


@tg.task
def plain(x: int) -> int:
    return x + 1


def run_in_process(g, workers: int = 1, trace: bool = True):
    return tg.current_cluster().run(g, workers=workers, trace=trace).wait()


def test_spawned_calls_are_rows_of_the_trace_on_their_workers():
    with tg.Graph("tree") as g:
        r = tree(4)
    run = run_in_process(g, workers=2)
    assert r.result() == 16
    trace = run.trace
    assert len(trace.spawned) == run.stats.spawned == 30
    names = sorted(row[4] for row in trace.spawned)
    assert names.count("tree(0)") == 16 and names.count("tree(3)") == 2
    for rank, worker, start, end, _name, state in trace.spawned:
        assert rank == 0 and worker in (0, 1) and 0 <= start <= end and state == TASK_DONE
    s = trace.summary()
    assert (s["spawned"], s["spawned_failed"], s["steals"]) == (30, 0, 0)
    # nested spawned rows do not count twice: compute fits the wall of the workers
    u = trace.utilisation()[0]
    assert u["compute"] <= u["wall"] + 1e-9


def test_a_static_graph_records_no_dynamic_rows():
    with tg.Graph("static") as g:
        plain(plain(1))
    trace = run_in_process(g).trace
    assert trace.spawned == [] and trace.steals == []
    assert len(trace.tasks) == 2
    s = trace.summary()
    assert (s["spawned"], s["steals"], s["steal_latency_median"]) == (0, 0, 0.0)
    assert all(u["stealing"] == 0.0 for u in s["utilisation"])


def test_tracing_off_records_no_spawned_rows():
    with tg.Graph("tree") as g:
        r = tree(3)
    run = run_in_process(g, trace=False)
    assert r.result() == 8
    assert run.executor.trace.spawn_rows == []


def test_a_failed_spawned_call_is_a_failed_row():
    @tg.task
    def parent() -> str:
        try:
            tg.spawn(int, "x").result()
        except tg.TaskError:
            return "caught"
        return "not raised"

    with tg.Graph("fails") as g:
        p = parent()
    run = run_in_process(g)
    assert p.result() == "caught"
    assert [row[5] for row in run.trace.spawned] == [TASK_FAILED]
    assert run.trace.summary()["spawned_failed"] == 1


def recorded_batches() -> list[dict]:
    """Two ranks' batches by hand: rank 1 stole two calls of rank 0."""
    batches = []
    for rank in (0, 1):
        rec = Recorder(0, 0, workers=1, rank=rank, host="h")
        t = rec.t0
        rec.spawned(0, t + 0.1, t + 0.2, "f(1)", TASK_DONE)
        if rank == 1:
            rec.stole(0, "f(2)", t + 0.3, t + 0.30005)
            rec.stole(0, "f(3)", t + 0.4, t + 0.40015)
            rec.looked(0.5)
        rec.waits[0][1] = 0.8
        rec.wall = 1.0
        batches.append(rec.batch()[0])
    return batches


def test_batches_merge_steals_with_latency_and_a_cursor_hands_out_only_new_rows():
    trace = Trace("t", 2, [], [], [])
    for b in recorded_batches():
        trace.ingest(b)
    assert len(trace.spawned) == 2
    assert [(row[0], row[1], row[2]) for row in trace.steals] == [(1, 0, "f(2)"), (1, 0, "f(3)")]
    d = trace.dynamic()
    assert d["steals"] == 2 and d["steal_latency_median"] == pytest.approx(1e-4, abs=1e-6)
    u = trace.utilisation()[1]  # looking for work comes out of idle
    assert u["stealing"] == pytest.approx(0.5) and u["idle"] == pytest.approx(0.3)
    back = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert back.steals == trace.steals and back.summary()["steals"] == 2
    rec = Recorder(0, 0)
    rec.stole(1, "g()", rec.t0, rec.t0 + 1e-3)
    first, cursor = rec.batch((0, 0))
    rec.stole(1, "h()", rec.t0, rec.t0 + 1e-3)
    second, _ = rec.batch(cursor)
    assert first["events"]["steals"]["name"] == ["g()"]
    assert second["events"]["steals"]["name"] == ["h()"]


def test_the_chrome_export_draws_each_steal_from_the_victim_to_the_thief(tmp_path):
    trace = Trace("t", 2, [], [], [])
    for b in recorded_batches():
        trace.ingest(b)
    doc = json.loads(Path(trace.to_chrome(tmp_path / "t.json")).read_text())
    flows = [e for e in doc["traceEvents"] if e.get("cat") == "steal" and e["ph"] in "sf"]
    assert sorted((e["ph"], e["pid"]) for e in flows) == [("f", 1), ("f", 1), ("s", 0), ("s", 0)]
    spawned = [e for e in doc["traceEvents"] if e.get("cat") == "spawned"]
    assert {(e["pid"], e["name"]) for e in spawned} == {(0, "f(1)"), (1, "f(1)")}
    assert Trace.load(tmp_path / "t.json").summary()["steals"] == 2


JOB = """
import json, sys
import taskgraph as tg
sys.path.insert(0, {tests!r})
from test_steal import slow_fib
from test_trace_dynamic import plain

c = tg.Cluster()
with tg.Graph("steal") as g:
    f = slow_fib(14, 8, 0.004)
run = c.run(g, workers=1).wait()
trace = run.trace
path = trace.to_chrome({out!r})
if c.rank == 0:
    doc = json.load(open(path))
    flows = [e for e in doc["traceEvents"] if e.get("cat") == "steal" and e["ph"] in "sf"]
    s = trace.summary()
    json.dump(dict(
        result=f.result(), spawned=trace.spawned, steals=trace.steals, flows=len(flows),
        summary=[s["spawned"], s["steals"], s["steal_latency_median"], s["pushes"]],
        stealing=[u["stealing"] for u in s["utilisation"]]), open({out!r} + ".merged", "w"))
stats = run.stats
def say(line):
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()

say(f"rank {{c.rank}} stats {{stats.steals + stats.pushes}} {{stats.steal_latency_median_us}}")
with tg.Graph("static") as g:
    plain(plain(1))
trace = c.run(g, workers=1).wait().trace
if c.rank == 0:
    say(f"static {{len(trace.tasks)}} {{len(trace.spawned)}} {{len(trace.steals)}}")
"""


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_ranks_merge_spawned_rows_and_steals_on_rank_0(mpirun, tmp_path):
    script = tmp_path / "job.py"
    out = str(tmp_path / "trace.json")
    script.write_text(textwrap.dedent(JOB.format(tests=str(Path(__file__).parent), out=out)))
    t0 = time.monotonic()
    proc = mpirun(2, [str(script)], timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(Path(out + ".merged").read_text())
    assert m["result"] == 377
    assert {row[0] for row in m["spawned"]} == {0, 1}, "both ranks ran spawned calls"
    assert m["steals"], "an idle rank stole (or was pushed) calls with slow leaves"
    for thief, victim, name, req, arr, _pushed in m["steals"]:
        assert thief != victim and name.startswith("slow_fib(") and arr - req >= 0
    assert m["flows"] == 2 * len(m["steals"])
    pushed = sum(1 for row in m["steals"] if row[5])
    assert m["summary"][:2] == [len(m["spawned"]), len(m["steals"]) - pushed]
    assert m["summary"][3] == pushed
    assert m["summary"][2] >= 0 and sum(m["stealing"]) > 0
    steals = 0
    for rank in (0, 1):
        got = re.search(rf"^rank {rank} stats (\d+) ([\d.e+-]+)$", proc.stdout, re.M)
        assert got, proc.stdout
        steals += int(got.group(1))
        assert float(got.group(2)) >= 0
    assert steals == len(m["steals"])
    assert re.search(r"^static 2 0 0$", proc.stdout, re.M), proc.stdout
    assert time.monotonic() - t0 < 100


def test_the_view_state_and_report_carry_the_steal_counts(tmp_path):
    trace = Trace("t", 2, [], [], [])
    for b in recorded_batches():
        trace.ingest(b)
    state = trace.state()
    assert state["dynamic"]["steals"] == 2 and state["dynamic"]["spawned"] == 2
    assert state["util"][1]["stealing"] > 0
    text = Path(trace.to_html(tmp_path / "r.html")).read_text()
    assert '"steal_latency_median"' in text and "dynamicText" in text


def test_pushed_calls_count_apart_from_steals_and_their_latency():
    """A call pushed to an idle rank unasked is a row of its own kind: it is not a steal
    and its latency (from the push) stays out of the steals' median."""
    rec = Recorder(0, 0, workers=1, rank=1, host="h")
    t = rec.t0
    rec.stole(0, "f(2)", t + 0.3, t + 0.3001)
    rec.stole(0, "f(3)", t + 0.4, t + 0.4003)
    rec.stole(0, "f(4)", t + 0.5, t + 0.500002, pushed=True)
    rec.wall = 1.0
    trace = Trace("t", 2, [], [], [])
    trace.ingest(rec.batch()[0])
    d = trace.dynamic()
    assert d["steals"] == 2 and d["steal_latency_median"] == pytest.approx(2e-4, abs=1e-6)
    assert d["pushes"] == 1 and d["push_latency_median"] == pytest.approx(2e-6, abs=1e-7)
    back = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert back.steals == trace.steals and back.dynamic()["pushes"] == 1
    old = trace.to_dict()
    old["steals"] = [row[:5] for row in old["steals"]]  # a file written before pushes
    assert Trace.from_dict(json.loads(json.dumps(old))).dynamic()["steals"] == 3


def test_an_open_runs_view_counts_its_calls_not_the_runtimes_start_task():
    """A run of submitted calls only has one task of the runtime's: the live view read
    1/1 tasks and drew it in a lane (a session's note); now only the calls show."""
    from taskgraph.trace.widgets import RunView

    run = tg.current_cluster().run(open=True)
    view = RunView(run, interval=0.05)
    assert tg.wait([run.submit(abs, -i) for i in range(5)], timeout=30) == list(range(5))
    assert view.state["status"] == "running" and view.state["progress"]["total"] == 0
    run.wait(30)
    view.wait(10)
    state = view.state
    assert (state["progress"]["done"], state["progress"]["total"]) == (0, 0)
    assert state["status"] == "done" and state["dynamic"]["spawned"] == 5
    assert state["kernels"] == [] and run.trace.tasks == [] and len(run.trace.spawned) == 5
    empty = tg.current_cluster().run(open=True)
    empty.close()
    assert empty.wait(30).trace.status == "done"  # (not "running" for ever, nor "empty")


@tg.task
def _root_fails_after_spawning(n: int) -> int:
    futs = [tg.spawn(plain, i) for i in range(n)]
    tg.wait(futs)
    raise ValueError("the root fails")


def test_a_run_where_no_task_ended_well_has_a_trace_and_its_view_says_failed(tmp_path):
    """A failed one-root dynamic run (no graph task done) raised ValueError from the
    critical path in run.trace; the live view's thread died and stayed "running" (a
    trial): now its trace says failed, with no critical path, and so does the view."""
    from taskgraph.trace.widgets import RunView

    with tg.Graph("root fails") as g:
        _root_fails_after_spawning(4)
    run = tg.current_cluster().run(g)
    view = RunView(run, interval=0.05)
    with pytest.raises(tg.TaskError, match="the root fails"):
        run.wait(30)
    trace = run.trace
    assert trace.status == "failed" and trace.critical["tasks"] == []
    assert len(trace.spawned) == 4 and len(trace.tasks) == 1
    view.wait(10)
    assert view.state["status"] == "failed" and "the root fails" in view.state["error"]
    files = [
        Path(p) for p in (trace.to_chrome(tmp_path / "t.json"), trace.to_html(tmp_path / "t.html"))
    ]
    assert all(p.stat().st_size > 0 for p in files)
    assert Trace.load(files[0]).status == "failed"
