"""Failure policies (``retries``, ``on_failure="fail" | "skip" | "ignore"``, a
per-attempt ``timeout``) and the run's summary: the pure decision, and real batch jobs
on 1 and 2 MPI ranks, checked on each policy's dependents (one on the other rank too),
on the trace's attempt rows, on spawned and submitted calls, and on the summary.
"""

from __future__ import annotations

import pickle
import re
import textwrap

import pytest

from taskgraph.dsl.options import TaskOptions
from taskgraph.run.attempts import Skipped, Summary, TaskSkipped, decide


def test_decide_retries_then_applies_the_policy():
    opts = TaskOptions(retries=2, on_failure="skip")
    err = ValueError("x")
    assert [decide(opts, n, err) for n in (1, 2, 3)] == ["retry", "retry", "skip"]
    assert decide(TaskOptions(), 1, err) == "fail"
    assert decide(TaskOptions(on_failure="ignore"), 1, err) == "ignore"


def test_decide_never_retries_an_interrupt():
    assert decide(TaskOptions(retries=5, on_failure="ignore"), 1, KeyboardInterrupt()) == "fail"


def test_a_skipped_value_is_small_picklable_and_says_why():
    s = Skipped("g#2(<task 1>)", "f#1(3)", 1, 2, "ValueError: boom")
    back = pickle.loads(pickle.dumps(s))
    assert len(pickle.dumps(s)) < 200
    err = back.exception("host")
    assert isinstance(err, TaskSkipped)
    assert str(err) == (
        "task g#2(<task 1>) was skipped: its input f#1(3) failed on rank 1/2: ValueError: boom"
    )
    assert pickle.loads(pickle.dumps(err)).task == "g#2(<task 1>)"


def test_the_summary_merges_ranks_and_reads_well():
    parts = [
        {"ok": 3, "retries": 1, "hits": 0, "failed": [("f#1(3)", 0, "E: x")], "skipped": []},
        {"ok": 2, "retries": 0, "hits": 2, "failed": [], "skipped": ["g#2(<task 1>)"]},
    ]
    s = Summary.merge("ens", parts)
    assert (s.succeeded, len(s.failed), len(s.skipped), s.retries) == (5, 1, 1, 1)
    text = str(s)
    assert text.splitlines()[0] == (
        "run 'ens': 5 succeeded (2 from the checkpoint), 1 failed, 1 skipped, 1 retries"
    )
    assert "f#1(3) on rank 0: E: x" in text and "g#2(<task 1>)" in text
    assert "<table>" in s._repr_html_()
    assert s.notable and not Summary("x", succeeded=4).notable


JOB = r"""
import sys
import time
import taskgraph as tg

tries = {}

def first_fails(key):
    tries[key] = tries.get(key, 0) + 1
    return tries[key] == 1

@tg.task(retries=2)
def flaky(x):
    if first_fails(("flaky", x)):
        raise ValueError(f"first attempt of {x}")
    return x * 10

@tg.task(on_failure="skip")
def bad(x):
    raise RuntimeError(f"bad {x}")

@tg.task(on_failure="ignore")
def odd(x):
    raise KeyError(f"odd {x}")

@tg.task(nbytes=10**6)  # (a large value: a task that reads it goes where it is)
def big():
    return 5

@tg.task
def near(v):
    return ("near", v)

@tg.task
def far(v, z):
    return ("far", v, z)

@tg.task
def seen(v):
    return f"{type(v).__name__}:{v}:{'odd 3' in getattr(v, 'remote_traceback', '')}"

@tg.task(timeout=0.5, retries=1)
def slow_once(x):
    if first_fails(("slow", x)):
        for _ in range(3000):  # (short sleeps: the timeout's interrupt lands between them)
            time.sleep(0.01)
    return x + 1

@tg.task(retries=1)
def always(x):
    raise OSError(f"always {x}")

def say(*words):  # (one write per line: the ranks' lines do not mix)
    sys.stdout.write(" ".join(str(w) for w in (f"rank {c.rank}:", *words)) + "\n")
    sys.stdout.flush()

def outcome(run, fut):
    try:
        return run.result(fut)
    except tg.TaskError as exc:
        return f"{type(exc).__name__}: {exc}"

with tg.Graph("policies") as g:
    a = flaky(1)
    b = bad(2)
    z = big()
    n1 = near(b)
    f1 = far(b, z)
    f2 = near(f1)
    ok = near(a)
    o = odd(3)
    s = seen(o)
    w = slow_once(4)

c = tg.Cluster()
run = c.run(g, workers=2)
run.wait()
say("placed", run.plan.placement[b.id], run.plan.placement[f1.id], run.plan.placement[f2.id])
for name, fut in [("ok", ok), ("b", b), ("n1", n1), ("f1", f1), ("f2", f2), ("s", s), ("w", w)]:
    say(name, outcome(run, fut))
say("summary", run.summary().headline())
if c.rank == 0:
    rows = run.trace.attempts()
    say("attempts", sorted((r["label"].split("#")[0], r["attempt"], r["state"]) for r in rows
                           if r["state"] in ("retried", "done") and r["attempt"] > 0
                           and r["label"].startswith(("flaky", "slow_once"))))

sub = c.run(open=True)
if c.rank == 0:
    got = [
        sub.submit(flaky.with_options(retries=1), 7),
        sub.submit(bad.with_options(on_failure="ignore"), 8),
        sub.submit(bad, 9),
    ]
    say("submitted", got[0].result(), repr(got[1].result()))
    try:
        got[2].result()
    except tg.TaskError as exc:
        say("submitted skip", type(exc).__name__, exc)
sub.wait()
say("sub summary", sub.summary().headline())

with tg.Graph("fails") as g3:
    always(5)
try:
    c.run(g3).wait()
except tg.TaskError as exc:
    say("fails", str(exc).splitlines()[0], "| last of 2", "of 2 attempts" in exc.traceback)
"""


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_each_policy_on_its_dependents_in_a_batch_job(mpirun, tmp_path, ranks):
    script = tmp_path / "policies.py"
    script.write_text(textwrap.dedent(JOB))
    proc = mpirun(ranks, [str(script)], timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for r in range(ranks):
        mine = {
            line.split(": ", 1)[1].split(" ", 1)[0]: line.split(": ", 1)[1]
            for line in out.splitlines()
            if line.startswith(f"rank {r}:")
        }
        assert mine["ok"] == "ok ('near', 10)"
        where = mine["placed"].split()[1]  # (the rank bad#1(2) ran on)
        assert mine["b"] == (
            f"b TaskSkipped: task bad#1(2) was skipped: it failed on rank {where}/{ranks}: "
            "RuntimeError: bad 2"
        )
        why = f"its input bad#1(2) failed on rank {where}/{ranks}: RuntimeError: bad 2"
        assert mine["n1"] == f"n1 TaskSkipped: task near#3(<task 1>) was skipped: {why}"
        assert mine["f1"].endswith(f"was skipped: {why}")
        assert mine["f2"] == f"f2 TaskSkipped: task near#5(<task 4>) was skipped: {why}"
        assert mine["s"] == "s KeyError:'odd 3':True"
        assert mine["w"] == "w 5"
        assert mine["summary"] == (
            "summary run 'policies': 5 succeeded, 2 failed, 3 skipped, 2 retries"
        )
        assert mine["sub"].endswith(": 1 succeeded, 2 failed, 0 skipped, 1 retries")
        assert mine["fails"].startswith("fails task always#0(5) on rank")
        assert mine["fails"].endswith("OSError: always 5 | last of 2 True")
    if ranks == 2:  # the far dependents ran on the other rank than the failed task
        placed = [
            line.split()[3:] for line in out.splitlines() if line.startswith("rank 0: placed")
        ]
        assert placed in ([["0", "1", "1"]], [["1", "0", "0"]])
    assert "rank 0: attempts [('flaky', 1, 'retried'), ('flaky', 2, 'done'), " in out
    assert "('slow_once', 1, 'retried'), ('slow_once', 2, 'done')]" in out
    assert "rank 0: submitted 70 RuntimeError('bad 8')" in out
    assert "rank 0: submitted skip TaskSkipped task bad(9) was skipped: it failed on rank" in out
    # in a script, wait() prints the summary once (rank 0) when something went wrong
    said = re.findall(r"^run 'policies': 5 succeeded, 2 failed, 3 skipped, 2 retries$", out, re.M)
    assert len(said) == 1, out
    assert re.search(r"  failed  bad#1\(2\) on rank [01]: RuntimeError: bad 2\n", out)


STUCK = r"""
import sys
import time
import taskgraph as tg

@tg.task(timeout=0.5, retries=1, on_failure="skip")
def stuck(x):
    if x == 2:
        time.sleep(60)  # (one C call: the timeout's interrupt cannot land in it)
    return x

@tg.task(cores=2)  # (every core of the rank: only free once the stuck calls gave theirs)
def whole(vals):
    return sum(vals)

@tg.task(timeout=0.5)
def inner(x):
    time.sleep(60)
    return x

@tg.task
def spawner():
    try:
        return tg.spawn(inner, 1).result()
    except tg.TaskError as exc:
        return str(exc.__cause__ or exc).splitlines()[-1]

t0 = time.perf_counter()
with tg.Graph("stuck") as g:
    a = [stuck(i) for i in range(4)]
    total = whole(a[:2])
    s = spawner()
run = tg.Cluster().run(g, workers=2)
run.wait(30)
print("seconds", round(time.perf_counter() - t0, 1))
print("total", run.result(total))
print("spawner", run.result(s))
try:
    run.result(a[2])
except tg.TaskSkipped as exc:
    print("skipped", exc)
print("rows", sorted((r["attempt"], r["state"], r["ended"] is not None)
      for r in run.trace.attempts() if r["label"].startswith("stuck#2")))
sys.stdout.flush()
"""


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_timed_call_stuck_in_one_c_call_is_abandoned_and_its_policy_applies(mpirun, tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    proc = mpirun(1, [str(script)], timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    # two attempts of 0.5 s, each abandoned 0.5 s after its interrupt: not the 60 s sleep
    assert float(out["seconds"]) < 10, proc.stdout
    assert out["total"] == "1"  # (its 2 cores came back from the abandoned calls)
    stuck_note = "(stuck in a call the interrupt cannot end: its thread was abandoned)"
    assert out["spawner"].endswith(f"inner(1) timed out after 0.5 s on rank 0/1 {stuck_note}")
    assert out["skipped"] == (
        "task stuck#2(2) was skipped: it failed on rank 0/1: AttemptTimeout: stuck#2(2) timed "
        f"out after 0.5 s on rank 0/1 {stuck_note}"
    )
    assert out["rows"] == "[(1, 'retried', True), (2, 'failed', True)]"
