"""Traces: recorded on every rank, merged, summarised, exported and read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

import taskgraph as tg
from taskgraph.linalg import cholesky
from taskgraph.trace.events import TASK_DONE, TASK_FAILED, Recorder, Trace, TraceError

pytestmark = pytest.mark.timeout(120)


def test_recorder_batches_hand_out_each_event_once():
    rec = Recorder(ntasks=3, nmessages=2, workers=2, rank=1)
    rec.task(7, 0, 0.0, 0.5, TASK_DONE)
    first, cursor = rec.batch()
    rec.task(8, 1, 0.1, 0.2, TASK_FAILED)
    rec.message(0, 4096, 3, 0.05, +1)
    second, cursor = rec.batch(cursor)
    third, _ = rec.batch(cursor)
    assert first["events"]["tasks"]["id"] == [7] and second["events"]["tasks"]["id"] == [8]
    assert second["events"]["tasks"]["state"] == [TASK_FAILED]
    assert second["events"]["messages"]["bytes"] == [4096]
    assert third["events"]["tasks"]["id"] == []
    assert first["rank"] == 1 and first["workers"] == 2 and len(first["waits"]) == 2


def test_a_disabled_recorder_records_nothing():
    rec = Recorder(ntasks=3, nmessages=2, enabled=False)
    rec.task(1, 0, 0.0, 1.0, TASK_DONE)
    assert rec.batch()[0]["events"]["tasks"]["id"] == []


def two_rank_trace() -> Trace:
    """Two ranks, one worker each; task 0 on rank 0 sends a tile to task 1 on rank 1::

    rank 0:  [t0 0.0-1.0]  ---4 KiB, tag 1--->  rank 1:  [t1 1.2-2.0]
    """
    tr = Trace("demo", 2, ["a(A[0,0])", "b(A[1,0])"], [0, 1], ["a", "b"], [[], [0]])

    def batch(rank, tasks, messages, wall, waits):
        ids, starts, ends = zip(*tasks) if tasks else ((), (), ())
        peer, nbytes, tag, posted, done, d = zip(*messages) if messages else [()] * 6
        return {
            "rank": rank,
            "workers": 1,
            "waits": waits,
            "wall": wall,
            "events": {
                "tasks": {
                    "id": list(ids),
                    "worker": [0] * len(ids),
                    "start": list(starts),
                    "end": list(ends),
                    "state": [TASK_DONE] * len(ids),
                },
                "messages": {
                    "peer": list(peer),
                    "bytes": list(nbytes),
                    "tag": list(tag),
                    "posted": list(posted),
                    "done": list(done),
                    "dir": list(d),
                },
            },
        }

    tr.ingest(batch(0, [(0, 0.0, 1.0)], [(1, 4096, 1, 1.0, 1.1, +1)], 2.0, [[0.0, 0.9]]))
    tr.ingest(batch(1, [(1, 1.2, 2.0)], [(0, 4096, 1, 0.0, 1.15, -1)], 2.0, [[1.1, 0.0]]))
    tr.finish()
    return tr


def test_merge_matches_both_ends_of_a_message():
    tr = two_rank_trace()
    assert tr.messages == [[0, 1, 4096, 1, 1.0, 1.15]]  # sender's post, receiver's arrival
    assert tr.sent.tolist() == [[0, 4096], [0, 0]]
    assert tr.sent_count.tolist() == [[0, 1], [0, 0]]


def one_task_batch(rank: int, host: str, t0: float, start: float, end: float) -> dict:
    empty = {k: [] for k in ("peer", "bytes", "tag", "posted", "done", "dir")}
    tasks = {"id": [rank], "worker": [0], "start": [start], "end": [end], "state": [TASK_DONE]}
    return {
        "rank": rank,
        "host": host,
        "t0": t0,
        "workers": 1,
        "waits": [[0.0, 0.0]],
        "wall": 1.0,
        "events": {"tasks": tasks, "messages": empty},
    }


def test_ranks_on_one_host_are_merged_onto_one_clock():
    """Rank 1 started its clock 0.25 s after rank 0 on the same host: its times move
    onto rank 0's base; rank 2, on another host, keeps the barrier's alignment."""
    tr = Trace("clocks", 3, ["a", "b", "c"], [0, 0, 0], ["k"])
    tr.ingest(one_task_batch(0, "node1", 100.0, 0.1, 0.2))
    tr.ingest(one_task_batch(1, "node1", 100.25, 0.1, 0.2))
    tr.ingest(one_task_batch(2, "node2", 7.0, 0.1, 0.2))
    starts = {row[0]: (row[2], row[3]) for row in tr.tasks}
    assert starts[0] == (0.1, 0.2)
    assert starts[1] == pytest.approx((0.35, 0.45))
    assert starts[2] == (0.1, 0.2)


def test_summary_utilisation_adds_up_to_wall_time():
    s = two_rank_trace().summary()
    for u in s["utilisation"]:
        parts = u["compute"] + u["comm"] + u["idle"] + u["overhead"]
        assert parts == pytest.approx(u["wall"])
    r0, r1 = s["utilisation"]
    assert r0["compute"] == pytest.approx(1.0) and r0["idle"] == pytest.approx(0.9)
    assert r1["comm"] == pytest.approx(1.1) and r1["compute"] == pytest.approx(0.8)
    assert s["makespan"] == pytest.approx(2.0)
    assert s["critical_path"] == pytest.approx(1.8) and s["status"] == "done"


def test_critical_path_follows_measured_durations():
    """Diamond: 0 -> {1 (long), 2 (short)} -> 3; the path goes through 1."""
    tr = Trace("d", 1, ["t0", "t1", "t2", "t3"], [0] * 4, ["k"], [[], [0], [0], [1, 2]])
    tr.tasks = [
        [0, 0, 0.0, 1.0, 0, 0, 1],
        [0, 0, 1.0, 4.0, 0, 1, 1],
        [0, 1, 1.0, 1.5, 0, 2, 1],
        [0, 0, 4.0, 5.0, 0, 3, 1],
    ]
    tr.finish()
    assert tr.critical["tasks"] == [0, 1, 3] and tr.critical["length"] == pytest.approx(5.0)


def test_chrome_export_and_load_round_trip(tmp_path):
    tr = two_rank_trace()
    path = tr.to_chrome(tmp_path / "t.json")
    with open(path) as f:
        doc = json.load(f)
    phases = {e["ph"] for e in doc["traceEvents"]}
    assert {"X", "M", "s", "f"} <= phases, "tasks, names and message flows"
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert {"rank 0", "rank 1", "worker 0", "network"} <= names
    tasks = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "message"]
    assert [(e["pid"], e["name"]) for e in tasks] == [(0, "a(A[0,0])"), (1, "b(A[1,0])")]
    back = Trace.load(path)
    assert back.summary() == tr.summary()


def test_load_rejects_missing_and_malformed_files(tmp_path):
    with pytest.raises(TraceError, match="no trace file"):
        Trace.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="not a readable JSON trace"):
        Trace.load(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceError, match="not a taskgraph trace"):
        Trace.load(other)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"taskgraph": {"format": "taskgraph-trace/1", "title": "x"}}))
    with pytest.raises(TraceError, match="malformed"):
        Trace.load(broken)
    assert tg.Trace is Trace


def test_a_real_run_is_traced_on_every_worker():
    A = tg.TiledMatrix.random_spd(1024, 128)
    g = cholesky(A)
    run = tg.current_cluster().run(g, workers=2).wait()
    tr = run.trace
    assert len(tr.tasks) == g.ntasks and tr.status == "done"
    assert sorted(row[5] for row in tr.tasks) == list(range(g.ntasks))
    assert {row[1] for row in tr.tasks} == {0, 1}, "both workers ran tasks"
    for row in tr.tasks:
        assert 0 <= row[2] <= row[3] <= tr.makespan + 1e-6
    u = tr.utilisation()[0]
    assert u["compute"] > 0 and u["wall"] == pytest.approx(2 * tr.wall[0], rel=1e-6)
    assert 0 < tr.critical["length"] <= tr.makespan + 1e-6
    assert tr.critical["tasks"][0] == 0, "Cholesky's critical path starts at potrf(A[0,0])"


def test_a_failed_run_keeps_its_trace_and_error():
    @tg.kernel(modes="rw", dims="mn")
    def fail(t):
        raise RuntimeError("on purpose")

    A = tg.TiledMatrix.random_spd(256, 128)
    g = cholesky(A)
    with g:
        fail(A[1, 1].rw)
    run = tg.current_cluster().run(g)
    with pytest.raises(tg.TaskError):
        run.wait()
    tr = run.trace
    assert tr.status == "failed" and "on purpose" in tr.error
    assert [row[5] for row in tr.tasks if row[6] == TASK_FAILED] == [g.ntasks - 1]


def test_an_empty_graph_has_an_empty_trace():
    run = tg.current_cluster().run(tg.Graph("nothing")).wait()
    tr = run.trace
    assert tr.status == "empty" and tr.tasks == [] and tr.makespan >= 0
    assert tr.summary()["tasks"] == 0


def test_tracing_off_records_nothing_but_runs():
    A = tg.TiledMatrix.random_spd(256, 128)
    g = cholesky(A)
    run = tg.current_cluster().run(g, trace=False).wait()
    assert run.trace.tasks == [] and run.stats.tasks == g.ntasks == 4
    assert np.isfinite(run.seconds)


def test_an_earlier_rank_on_the_same_host_moves_the_time_base_and_loses_nothing():
    """Rank 1 started its clock 0.5 s before rank 0 (it left the start barrier first)
    and ran its task then: merged after rank 0, its task keeps its place, before rank
    0's, and no time is negative (the view draws from 0: such a lane showed empty)."""
    tr = Trace("clocks", 2, ["a", "b"], [0, 0], ["k"])
    tr.ingest(one_task_batch(0, "node1", 100.5, 0.1, 0.2))
    tr.ingest(one_task_batch(1, "node1", 100.0, 0.1, 0.2))
    times = {row[0]: (row[2], row[3]) for row in tr.tasks}
    assert times[1] == pytest.approx((0.1, 0.2))
    assert times[0] == pytest.approx((0.6, 0.7))
    assert tr.rebased == 1 and tr.elapsed == pytest.approx(1.5)


def test_a_message_half_merged_before_the_time_base_moves_moves_with_it():
    tr = Trace("clocks", 2, ["a", "b"], [0, 0], ["k"])
    b0 = one_task_batch(0, "node1", 10.5, 0.0, 0.1)
    b0["events"]["messages"] = {
        "peer": [1],
        "bytes": [8],
        "tag": [3],
        "posted": [0.1],
        "done": [0.2],
        "dir": [1],
    }
    b1 = one_task_batch(1, "node1", 10.0, 0.7, 0.8)
    b1["events"]["messages"] = {
        "peer": [0],
        "bytes": [8],
        "tag": [3],
        "posted": [0.0],
        "done": [0.65],
        "dir": [-1],
    }
    tr.ingest(b0)
    tr.ingest(b1)
    assert tr.messages == [[0, 1, 8, 3, pytest.approx(0.6), pytest.approx(0.65)]]


def test_compile_time_is_shown_apart_from_the_runs_elapsed_time():
    tr = Trace("c", 1, ["a"], [0], ["k"])
    batch = one_task_batch(0, "node1", 5.0, 0.0, 0.04)
    batch.update(wall=0.042, compile=3.5, elapsed=3.542)  # an engine's elapsed: with compile
    tr.ingest(batch)
    p = tr.progress()
    assert p["elapsed"] == pytest.approx(0.042) and p["compile"] == 3.5
    assert tr.summary()["compile_seconds"] == 3.5
    assert Trace.from_dict(tr.to_dict()).compile_seconds == 3.5


def test_a_run_traces_its_compile_time_apart():
    from taskgraph.run import comm
    from taskgraph.run.executor import Executor

    g = naps(2)
    ex = Executor(g, tg.make_plan(g, 1).for_rank(0), comm.Network(), compile_seconds=2.5)
    ex.run()
    assert ex.trace.batch()[0]["compile"] == 2.5


@tg.kernel(modes="rw", dims="mn")
def _nap(t):
    pass


def naps(n: int) -> tg.Graph:
    B = tg.TiledMatrix.zeros((2, 2), 2)
    with tg.Graph("naps") as g:
        for _ in range(n):
            _nap(B[0, 0].rw)
    return g


FULL_DISK = """
import os, resource, signal, sys
import taskgraph as tg
from taskgraph.trace import Trace
path = sys.argv[1]
tr = Trace.load(path)
tr.title = "x" * 100_000  # far over the limit below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
for write in (tr.to_chrome, tr.to_html):
    try:
        write(path)
    except OSError as exc:
        assert str(path) in str(exc), exc
        print("REFUSED", type(exc).__name__, exc)
    else:
        raise AssertionError("the write should have failed")
"""


@pytest.mark.timeout(60)
def test_a_trace_file_is_whole_or_untouched_when_the_disk_is_full(tmp_path):
    """A write that fails half-way (here: past a file-size limit, as on a full disk)
    leaves the old file as it was and no temporary file, and says which path."""
    import subprocess
    import sys

    run = tg.current_cluster().run(naps(3)).wait()
    path = tmp_path / "t.json"
    run.trace.to_chrome(path)
    before = path.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("REFUSED") == 2, proc.stdout
    assert path.read_bytes() == before
    assert Trace.load(path).summary()["tasks"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_show_warns_once_where_the_trace_directory_cannot_be_written(tmp_path):
    """run.show()'s files, in a directory that cannot be made (under a file; as root,
    a read-only directory is no obstacle): one warning line, no traceback from the
    view's thread, and the run's result is intact."""
    import io

    from taskgraph.trace.widgets import TextView

    blocker = tmp_path / "file"
    blocker.write_text("")
    stream = io.StringIO()
    run = tg.current_cluster().run(naps(3))
    view = TextView(run, directory=str(blocker / "traces"), stream=stream)
    run.wait()
    view.wait(30)
    assert not view._thread.is_alive()
    lines = [x for x in stream.getvalue().splitlines() if "taskgraph:" in x]
    assert len(lines) == 1 and "warning: trace not written" in lines[0], stream.getvalue()
    assert str(blocker / "traces") in lines[0] and "Traceback" not in stream.getvalue()
    assert view.files == []


def _leaf(i: int) -> int:
    return i


@tg.task
def _spawns(n: int) -> int:
    return sum(tg.wait([tg.spawn(_leaf, i) for i in range(n)]))


def test_the_progress_line_counts_the_spawned_calls_too(tmp_path):
    """It said "1/1 task" for a run of 400 spawned calls."""
    import io

    from taskgraph.trace.widgets import TextView

    with tg.Graph("calls") as g:
        _spawns(400)
    stream = io.StringIO()
    run = tg.current_cluster().run(g)
    view = TextView(run, directory=str(tmp_path), stream=stream, interval=0.05)
    run.wait()
    view.wait(30)
    assert run.calls_ended() == 400 and "400 calls ended" in stream.getvalue(), stream.getvalue()


def test_a_trace_holding_another_ranks_events_only_writes_nothing(tmp_path):
    """On ranks other than 0 of a batch job, run.trace has that rank's events only:
    writing it to the path every rank names would clobber rank 0's whole trace."""
    tr = Trace("clocks", 2, ["a", "b"], [0, 0], ["k"])
    tr.ingest(one_task_batch(1, "node1", 1.0, 0.1, 0.2))
    assert tr.only_another_rank
    assert tr.to_chrome(tmp_path / "t.json") == str(tmp_path / "t.json")
    assert tr.to_html(tmp_path / "t.html") == str(tmp_path / "t.html")
    assert list(tmp_path.iterdir()) == []
    tr.ingest(one_task_batch(0, "node1", 1.0, 0.1, 0.2))
    assert not tr.only_another_rank


EVERY_RANK_WRITES = """
import json, os, sys, threading
import taskgraph as tg
from taskgraph.linalg import cholesky

path = sys.argv[1]
c = tg.current_cluster()
A = tg.TiledMatrix.random_spd(400, 100)
g = cholesky(A)
run = c.run(g).wait()
bad, stop = [], threading.Event()

def read():  # every read, on every rank, sees a whole trace of every rank
    while not stop.is_set():
        try:
            with open(path) as f:
                doc = json.load(f)["taskgraph"]
        except FileNotFoundError:
            continue
        except Exception as exc:
            bad.append(repr(exc)[:200])
            continue
        ranks = {row[0] for row in doc["tasks"]}
        if len(doc["tasks"]) != g.ntasks or ranks != set(range(c.size)):
            bad.append(f"{len(doc['tasks'])} tasks of ranks {sorted(ranks)}")

reader = threading.Thread(target=read)
reader.start()
for _ in range(40):
    assert run.trace.to_chrome(path) == path
    assert run.trace.to_html(path + ".html") == path + ".html"
stop.set()
reader.join()
c.barrier()
assert not bad, bad[:3]
left = [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]
assert not left, left
print("WROTE", c.rank, flush=True)
"""


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_every_rank_writing_the_same_trace_path_leaves_one_whole_file(tmp_path, mpirun):
    script = tmp_path / "writers.py"
    script.write_text(EVERY_RANK_WRITES)
    out = tmp_path / "out"
    out.mkdir()
    proc = mpirun(2, [str(script), str(out / "t.json")], timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("WROTE") == 2, proc.stdout + proc.stderr
    assert Trace.load(out / "t.json").summary()["ranks"] == 2


def test_a_clusters_run_passes_its_compile_time_to_the_trace():
    run = tg.current_cluster().run(cholesky(tg.TiledMatrix.random_spd(256, 128))).wait()
    assert run.trace.compile_seconds == run.compile_seconds
    assert run.trace.progress()["elapsed"] <= run.seconds + 1e-3
