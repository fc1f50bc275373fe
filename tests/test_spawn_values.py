"""What a spawned call may take and give, alike on 1, 2 and 3 ranks (a new user's
trial found each of these broken where a call was stolen): a value of a class defined
in the script, an argument that cannot be rebuilt on the thief, a SystemExit in a
child, a write into an array it was given, a grandchild's error caught by its own
class; and ``tg.as_completed`` once a run is cancelled."""

from __future__ import annotations

import pickle
import re
import textwrap

import numpy as np
import pytest

from taskgraph.cluster.submit import _stopped
from taskgraph.run.attempts import AttemptTimeout
from taskgraph.run.context import TaskAbandoned
from taskgraph.run.dynamic import (
    FAILED,
    WROTE,
    SpawnedTaskError,
    SpawnFuture,
    _elide,
    _wrote_into,
    dump_original,
    load_original,
    read_only,
    spawned_error,
)

pytestmark = pytest.mark.timeout(180)


def test_arrays_given_to_a_spawned_call_are_read_only_views_and_the_rest_is_kept():
    a, b = np.zeros(4), np.ones(2)
    b.flags.writeable = False
    args, kwargs = read_only((a, 3, "x", b), {"c": a, "d": [a]})
    assert not args[0].flags.writeable and args[0].base is a  # (a view: no copy)
    assert args[1:3] == (3, "x") and args[3] is b and kwargs["d"][0] is a
    assert not kwargs["c"].flags.writeable
    assert a.flags.writeable  # (the caller's own array is untouched)
    plain = ((1, 2), {"k": 3})
    assert read_only(*plain) == plain
    twice, _ = read_only((a, a), {})
    assert twice[0] is twice[1]  # (an array given twice is one array in the call)


def test_a_submitted_call_that_exits_is_its_own_failure_not_a_stopped_run():
    """On engines, a call the run stopped under is left to the run's summary; one that
    raised SystemExit itself is published as its failure (else its future waited for
    the run's end)."""
    fut = SpawnFuture(None, print, (), {}, 1)
    fut.state = FAILED
    fut.exc = SystemExit(3)
    assert not _stopped(fut)
    fut.exc = TaskAbandoned()
    assert _stopped(fut)


def test_a_spawned_calls_future_says_it_cannot_leave_its_rank():
    """Returned from a task and read on another rank, it failed with "cannot pickle
    'module' object", naming nothing."""
    fut = SpawnFuture(None, print, (5,), {}, 1)
    with pytest.raises(TypeError, match=r"future of print\(5\) cannot leave this rank"):
        pickle.dumps(fut)


class Coded(Exception):
    def __init__(self, code):
        super().__init__(f"code {code}")
        self.code = code


def test_a_spawned_error_is_also_of_its_originals_class_and_survives_pickling():
    failure = ("f(1)", 1, 2, "vm", "Coded: code 7", "Traceback ...")
    err = spawned_error(failure, Coded(7))
    assert isinstance(err, SpawnedTaskError) and isinstance(err, Coded)
    assert err.code == 7 and err.task == "f(1)" and isinstance(err.original, Coded)
    back = pickle.loads(pickle.dumps(err))  # (how an engine publishes it to the notebook)
    assert type(back) is type(err) and back.code == 7 and back.original.code == 7
    assert str(back) == str(err)
    gone = spawned_error(failure, FileNotFoundError(2, "gone", "/x"))  # (C fields too)
    assert isinstance(gone, FileNotFoundError) and (gone.errno, gone.filename) == (2, "/x")
    assert type(spawned_error(failure, None)) is SpawnedTaskError
    key = spawned_error(failure, KeyError("k"))  # (its message is ours, not KeyError's)
    assert isinstance(key, KeyError) and str(key).startswith("task f(1) on rank 1/2")
    assert type(spawned_error(failure, ZeroDivisionError)) is type(
        spawned_error(failure, ZeroDivisionError("x"))
    )  # (only the class came: one class per original class)


class TwoArgs(Exception):  # (its plain pickle cannot rebuild it: args is one string)
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def test_what_a_spawned_error_does_not_become():
    """Not a StopIteration (a loop over results would end early, silently), not one of
    the runtime's own (a child's AttemptTimeout blamed the parent: a TimeoutError only),
    and a child's rewritten "wrote into an array" error is not the parent's own write."""
    failure = ("f(1)", 0, 1, "vm", "StopIteration", "")
    assert type(spawned_error(failure, StopIteration())) is SpawnedTaskError
    late = spawned_error(failure, AttemptTimeout("late"))  # (a TimeoutError, as it is)
    assert isinstance(late, TimeoutError) and not isinstance(late, AttemptTimeout)
    wrote = spawned_error(failure, ValueError(f"child(a) wrote into a NumPy array ({WROTE})"))
    parent = SpawnFuture(None, print, (np.zeros(2),), {}, 1)
    assert isinstance(wrote, ValueError) and not _wrote_into(wrote, parent)
    assert _wrote_into(ValueError(WROTE), parent)


def test_a_stolen_errors_class_comes_back_where_its_instance_cannot():
    back = load_original(dump_original(TwoArgs(1, 2)))
    assert type(back) is TwoArgs and back.args == ("1 2",)  # (remade without __init__)
    assert isinstance(spawned_error(("f", 0, 1, "vm", "TwoArgs: 1 2", ""), back), TwoArgs)
    assert isinstance(load_original(dump_original(ValueError("x"))), ValueError)


def chain_error(levels: int) -> str:
    """The error text of a call whose failure came up ``levels`` spawned calls, each
    level eliding its child's text as _failure does."""
    error = "ValueError: bottom"
    for d in range(levels):
        error = _elide(f"SpawnedTaskError: task bad({d}) on rank 0/1 (vm) failed: {error}")
    return error


def test_a_long_chain_of_failed_calls_names_its_ends_and_counts_the_middle():
    short = chain_error(4)
    assert short.count("SpawnedTaskError") == 4 and "more spawned calls" not in short
    long = chain_error(41)
    assert long.count("task bad(") == 4 and len(long) < 400, long
    assert long.startswith("SpawnedTaskError: task bad(40) ")
    assert "task bad(39) " in long and "task bad(0) " in long and "bad(20)" not in long
    assert "(37 more spawned calls failed in turn)" in long and long.endswith("ValueError: bottom")


JOB = """
import sys, time
from dataclasses import dataclass
import numpy as np
import taskgraph as tg

def say(*words):
    line = " ".join(str(w) for w in (f"rank {c.rank}:", *words))
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()

@dataclass
class Result:  # (of this script: a thief rebuilds the class from the function)
    seed: int
    value: float

def simulate(seed):
    time.sleep(0.02)
    return Result(seed, seed * 0.5)

def boom():
    raise RuntimeError("cannot rebuild me")

class BadUnpickle:
    def __reduce__(self):
        return (boom, ())

def use(obj, i):
    time.sleep(0.01)
    return i

def exits(i):
    time.sleep(0.01)
    if i == 2:
        sys.exit(3)
    return i

def poke(a, i):
    time.sleep(0.01)
    a[i] = 1.0
    return i

class Boom(Exception):  # (of this script, with a field: caught by its class anywhere)
    def __init__(self, code):
        super().__init__(f"boom {code}")
        self.code = code

def grandchild(i):
    time.sleep(0.01)
    if i % 2:
        raise Boom(i)
    return 1 // 0

def child(i):
    return tg.spawn(grandchild, i).result()

def catches(i):
    try:
        return tg.spawn(child, i).result()
    except Boom as e:
        return "boom", e.code, isinstance(e, tg.TaskError), isinstance(e.__cause__, Boom)
    except ZeroDivisionError as e:
        return "zero", i, isinstance(e, tg.TaskError), isinstance(e.__cause__, ZeroDivisionError)

def outcomes(futs):
    out = []
    for f in futs:
        try:
            out.append(f.result())
        except tg.TaskError as exc:
            out.append(" ".join(str(exc).split()))
    return out

@tg.task
def parent():
    results = [tg.spawn(simulate, s) for s in range(12)]
    bad = [tg.spawn(use, BadUnpickle(), i) for i in range(12)]
    ex = [tg.spawn(exits, i) for i in range(6)]
    a = np.zeros(8)
    pokes = [tg.spawn(poke, a, i) for i in range(8)]
    caught = [tg.spawn(catches, i) for i in range(12)]
    got = [r.result() for r in results]
    typed = all(type(r) is Result for r in got) and [r.value for r in got] == [
        s * 0.5 for s in range(12)
    ]
    kinds = [f.result() for f in caught]
    by_class = kinds == [("boom" if i % 2 else "zero", i, True, True) for i in range(12)]
    return typed, outcomes(bad), outcomes(ex), outcomes(pokes), float(a.sum()), by_class

c = tg.Cluster()
with tg.Graph("values") as g:
    f = parent()
c.run(g, workers=1).wait()
typed, bad, ex, pokes, total, by_class = f.result()
say("typed", typed)
say("caught by class", by_class)
say("bad", sum(1 for b in bad if isinstance(b, int)),
    sum(1 for b in bad if isinstance(b, str) and "use(" in b and "cannot rebuild me" in b))
say("exits", [e if isinstance(e, int) else ("exits(2)" in e and "SystemExit: 3" in e)
              for e in ex])
say("pokes", total, all(isinstance(p, str) and "wrote into a NumPy array" in p for p in pokes))

run = c.run(open=True)
if c.rank == 0:
    futs = [run.submit(simulate, s) for s in range(8)]
    say("submitted", all(type(f.result()) is Result for f in futs))
run.wait()

run = c.run(open=True)
if c.rank == 0:
    futs = [run.submit(use, None, i) for i in range(200)]
    time.sleep(0.3)
    run.cancel("stop now")
    try:
        ended = list(tg.as_completed(futs, timeout=20))
        stopped = 0
        for f in ended:
            try:
                f.result()
            except tg.RunError:
                stopped += 1
        say("after cancel", len(ended), stopped > 0)
    except TimeoutError as exc:
        say("after cancel timed out", exc)
try:
    run.wait()
except tg.RunError:
    pass
with tg.Graph("next") as g:
    f = parent()
c.run(g, workers=1).wait()
say("next", f.result()[0])
"""


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_values_errors_and_a_cancelled_wait_on_any_number_of_ranks(ranks, mpirun, tmp_path):
    script = tmp_path / "values.py"
    script.write_text(textwrap.dedent(JOB))
    proc = mpirun(ranks, [str(script)], timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "rank 0: typed True" in out, out  # a stolen call's value is the script's class
    found = re.search(r"rank 0: bad (\d+) (\d+)", out)
    assert found and int(found.group(1)) + int(found.group(2)) == 12, out
    if ranks == 1:
        assert int(found.group(1)) == 12, out  # (nothing moves: nothing is rebuilt)
    assert "rank 0: exits [0, 1, True, 3, 4, 5]" in out, out  # named, caught by the parent
    assert "rank 0: pokes 0.0 True" in out, out  # refused alike wherever they ran
    # a grandchild's own exception class catches its error, wherever it ran
    assert "rank 0: caught by class True" in out, out
    assert "rank 0: submitted True" in out, out
    assert "rank 0: after cancel 200 True" in out, out  # every future yielded, none hangs
    for rank in range(ranks):
        assert f"rank {rank}: next True" in out, out
