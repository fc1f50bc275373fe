"""Ensemble features for calls made while a run goes (``tg.spawn`` inside tasks,
``run.submit`` from outside): a call that asks for more than any rank has is refused at
once, a per-call ``timeout=`` is one failed attempt under the call's policy, and the
interrupt of a timed call hits that call only, also when a waiting worker runs deeper
calls on its own stack. The timeout watch's rules without a run; timeouts and refusals
in a 1-rank run in this process; an adaptive ensemble of shell and Python calls in a
real 2-rank batch job.
"""

from __future__ import annotations

import re
import textwrap
import threading
import time

import pytest

import taskgraph as tg
from taskgraph.run.attempts import WATCH_PAUSED, AttemptTimeout, Timed, Watch

# -- the watch's rules, without a run ---------------------------------------------------


def test_the_watch_interrupts_the_innermost_timed_attempt_only_when_nothing_runs_deeper():
    w = Watch(1)
    outer = Timed(101, "outer(1)", 1.0, now=0.0)
    assert w.arm(outer)  # (the first: the watcher thread is to be started)
    assert w.check(0.5, 2.0) == pytest.approx(0.5)
    w.pause(101, 0)  # a waiting worker runs a deeper call on this thread
    inner = Timed(101, "inner(2)", 0.1, now=0.6)
    w.arm(inner)
    assert w.stacks[101] == [outer, None, inner]
    assert w.check(1.2, 2.0) is not None  # both past their time: only the inner is hit
    assert inner.hit and not outer.hit
    w.disarm(inner)
    assert w.check(1.3, 2.0) == pytest.approx(WATCH_PAUSED)  # the outer waits its turn
    assert not outer.hit
    # the deeper call returns to the outer one, past its time: it fails there, at once
    assert w.resume(101, 0, 1.4, 2.0) is True
    assert outer.hit and w.stacks[101] == [outer]
    w.disarm(outer)
    assert w.stacks == {} and w.armed == 0 and w.check(1.5, 2.0) is None


def test_a_resumed_attempt_still_in_its_time_goes_on():
    w = Watch(1)
    entry = Timed(7, "f(1)", 5.0, now=0.0)
    w.arm(entry)
    w.pause(7, 0)
    assert w.resume(7, 0, 1.0, 2.0) is False
    assert not entry.hit and w.stacks[7] == [entry]


def test_the_watcher_interrupts_a_real_thread_and_withdraws_nothing_else():
    w = Watch(1)
    got: list[str] = []
    armed = threading.Event()

    def body():
        entry = Timed(threading.get_ident(), "spin(1)", 0.2, time.perf_counter())
        w.arm(entry)
        armed.set()
        try:
            for _ in range(1000):
                time.sleep(0.01)
            got.append("ran out")
        except AttemptTimeout:
            got.append("interrupted")
        w.disarm(entry)

    th = threading.Thread(target=body)
    th.start()
    assert armed.wait(5)
    deadline = time.monotonic() + 5
    while th.is_alive() and time.monotonic() < deadline:
        w.check(time.perf_counter(), 2.0)
        time.sleep(0.02)
    th.join(5)
    assert got == ["interrupted"]


# -- in a 1-rank run in this process -----------------------------------------------------

tries: dict[str, int] = {}
spun: list[float] = []


def _spin(seconds: float) -> float:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)  # (short sleeps: an interrupt lands between them)
    return seconds


def _spin_untimed(seconds: float) -> float:
    spun.append(_spin(seconds))
    return seconds


@tg.task(timeout=0.3)
def slow(key: str, seconds: float) -> float:
    tries[key] = tries.get(key, 0) + 1
    return _spin(seconds if tries[key] == 1 else 0.0)


@tg.task(timeout=0.6)
def timed_waiter(seconds: float) -> float:
    # with one worker, the spawned call runs on this stack while this call waits
    return tg.spawn(_spin_untimed, seconds).result()


@tg.task
def untimed_parent() -> str:
    fut = tg.spawn(slow, "child", 5.0)
    try:
        fut.result()
    except tg.TaskError as exc:
        return f"caught {type(exc.__cause__).__name__}"
    return "not interrupted"


@tg.task(cores=64)
def huge(x: int) -> int:
    return x


@tg.task
def spawns_huge() -> str:
    try:
        tg.spawn(huge, 3)
    except tg.GraphError as exc:
        return str(exc)
    return "spawned"


@pytest.mark.timeout(60)
def test_a_submitted_calls_timeout_is_a_failed_attempt_under_its_policy():
    tries.clear()
    run = tg.Cluster().run(open=True, workers=2)
    failing = run.submit(slow, "fail", 5.0)
    retried = run.submit(slow.with_options(retries=1), "retry", 5.0)
    ignored = run.submit(slow.with_options(on_failure="ignore"), "ignore", 5.0)
    skipped = run.submit(slow.with_options(on_failure="skip"), "skip", 5.0)
    with pytest.raises(tg.TaskError, match=r"slow\('fail', 5.0\) timed out after 0.3 s") as info:
        failing.result()
    assert isinstance(info.value.__cause__, TimeoutError)
    assert retried.result() == 0.0 and tries["retry"] == 2
    value = ignored.result()
    assert isinstance(value, AttemptTimeout) and "slow('ignore', 5.0)" in str(value)
    with pytest.raises(tg.TaskSkipped, match="timed out after 0.3 s"):
        skipped.result()
    assert run.submit(abs, -2).result() == 2  # the run goes on
    run.wait(30)
    s = run.summary()
    assert (s.retries, len(s.failed), s.skipped) == (1, 3, [])


@pytest.mark.timeout(60)
def test_the_interrupt_hits_only_the_call_that_ran_past_its_time_on_a_shared_stack():
    tries.clear()
    spun.clear()
    run = tg.Cluster().run(open=True, workers=1)
    # a timed call that waits: the untimed call it runs on its stack ends with its
    # value, and the waiter fails as that call returns to it
    waiter = run.submit(timed_waiter, 1.0)
    with pytest.raises(tg.TaskError, match=r"timed_waiter\(1.0\) timed out after 0.6 s"):
        waiter.result()
    assert spun == [1.0]  # (it ran to its end, not interrupted)
    # an untimed call waits: its timed child, run on its stack, is interrupted alone
    assert run.submit(untimed_parent).result() == "caught AttemptTimeout"
    run.wait(30)
    assert run.stats.spawned == 4 and run.summary().succeeded == 2  # (not the start task)


@tg.task(cores=2)
def wide_parent(x: int) -> int:
    # holds both cores of the rank: its 1-core child runs only if they go back meanwhile
    return tg.spawn(tg.task(cores=1)(abs), x).result() + 1


@pytest.mark.timeout(60)
def test_a_managed_call_gives_its_cores_back_while_it_waits_for_a_spawned_call():
    run = tg.Cluster(cores=2).run(open=True, workers=1, retries=1)  # (every call managed)
    fut = run.submit(wide_parent, -4)
    assert [f.result() for f in tg.as_completed([fut], timeout=20)] == [5]
    run.wait(30)
    assert run.executor.launcher.gate.in_use() == 0


@pytest.mark.timeout(60)
def test_a_call_asking_for_more_than_any_rank_has_is_refused_at_once():
    run = tg.Cluster().run(open=True)
    with pytest.raises(tg.GraphError, match=r"task huge\(1\) asks for 64 cores"):
        run.submit(huge, 1)
    with pytest.raises(
        tg.GraphError, match=r"task huge\(2\) asks for 1 cores, .* GiB memory, more"
    ):
        run.submit(huge.with_options(cores=1, memory="900TiB"), 2)
    with pytest.raises(tg.GraphError, match=r"task shell\('true', ranks=64\) asks for 64 cores"):
        run.submit(tg.shell, "true", ranks=64)
    assert run.submit(spawns_huge).result().startswith("task huge(3) asks for 64 cores")
    run.wait(30)


# -- an adaptive ensemble in a 2-rank batch job --------------------------------------------

JOB = r"""
import os
import sys
import time
import taskgraph as tg

D = sys.argv[1]

def once(key):  # True the first time, on any rank (a file marks it)
    try:
        os.close(os.open(os.path.join(D, key), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False

@tg.task
def square(x):
    if x % 5 == 0 and once(f"sq{x}"):
        raise ValueError(f"first try of {x}")
    return x * x

@tg.task(on_failure="ignore")
def broken(x):
    raise KeyError(f"broken {x}")

@tg.task(timeout=0.5)
def stuck(x):
    for _ in range(3000):
        time.sleep(0.01)
    return x

@tg.task(cores=64)
def huge(x):
    return x

@tg.task
def with_shell(x):
    try:
        tg.spawn(huge, x)
    except tg.GraphError as exc:
        refused = str(exc).split(":")[0]
    return str(tg.spawn(tg.shell, "echo spawned {x}", x=x).result()), refused

def say(*words):  # (one write per line: the ranks' lines do not mix)
    sys.stdout.write(" ".join(str(w) for w in (f"rank {c.rank}:", *words)) + "\n")
    sys.stdout.flush()

def shell_call(i):
    if i % 7 == 0:  # fails once: exit 3, then the retry finds its mark
        p = os.path.join(D, f"sh{i}")
        return run.submit(tg.shell, "test -e {p} || {{ touch {p}; exit 3; }}; echo {i}", p=p, i=i)
    return run.submit(tg.shell, "echo {i}", i=i)

c = tg.Cluster()
run = c.run(open=True, retries=1)
if c.rank == 0:
    try:
        run.submit(huge, 1)
    except tg.GraphError as exc:
        say("refused", str(exc).split(":")[0])
    first = [shell_call(i) for i in range(20)] + [run.submit(square, x) for x in range(10)]
    odd = run.submit(broken, 1)
    late = run.submit(stuck, 2)
    spawner = run.submit(with_shell, 4)
    second = []
    for f in tg.as_completed(first, timeout=60):
        v = f.result()
        if isinstance(v, tg.ExeResult):
            second.append(run.submit(square, int(str(v))))
        else:
            second.append(run.submit(tg.shell, "echo {v}", v=v))
    got = sorted(int(str(f.result())) for f in tg.as_completed(second, timeout=60))
    say("second", got == sorted([i * i for i in range(20)] + [x * x for x in range(10)]))
    v = odd.result()
    say("ignored", type(v).__name__, v)
    try:
        late.result()
    except tg.TaskError as exc:
        say("late", type(exc.__cause__).__name__, str(exc).splitlines()[0])
    say("spawner", spawner.result())
run.wait(60)
say("summary", run.summary().headline())
"""


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_an_adaptive_ensemble_of_shell_and_python_calls_in_a_2_rank_batch_job(mpirun, tmp_path):
    script = tmp_path / "ensemble.py"
    script.write_text(textwrap.dedent(JOB))
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = mpirun(2, [str(script), str(marks)], timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "rank 0: refused task huge(1) asks for 64 cores, more than any rank has" in out
    assert "rank 0: second True" in out
    assert "rank 0: ignored KeyError 'broken 1'" in out
    assert re.search(
        # (the cause is the remote traceback's text where it ran on the other rank)
        r"rank 0: late (AttemptTimeout|RemoteTraceback) task stuck\(2\) on rank [01]/2 "
        r"\(.*\) failed: "
        r"AttemptTimeout: stuck\(2\) timed out after 0.5 s on rank [01]/2",
        out,
    ), out
    assert (
        "rank 0: spawner ('spawned 4', 'task huge(4) asks for 64 cores, more than any rank has')"
        in out
    )
    # retries: 3 shell calls and 4 squares failing once, stuck(2) and broken(1) once each;
    # succeeded: 20 + 10 + 30 calls, with_shell and its shell call (the run's start task,
    # which is not the user's, not counted: it was, 63)
    for r in (0, 1):
        assert (
            f"rank {r}: summary run 'ensemble': 62 succeeded, 2 failed, 0 skipped, 9 retries"
            in (out)
        ), out
