"""The issue's dynamic checks on 1, 2 and 3 real MPI ranks, one job per rank count:
fib, N-Queens and an unbalanced tree exact (with and without random slow leaves,
stealing on 2 and 3 ranks), a recursion 400 deep (waits on several threads' stacks), a
grandchild's exception caught by its
grandparent, two spawning runs in flight (one fails, the other goes on), a cancel
during a stealing run (every rank idle within 2 s, then a next run), and no process
left behind."""

from __future__ import annotations

import os
import random
import re
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_no_new_children, child_pids
from test_dynamic import serial_fib, serial_queens

import taskgraph as tg

pytestmark = pytest.mark.timeout(240)

MASK = (1 << 64) - 1


def _leaf_nap(delay: float, *key: int) -> None:
    """Sleep up to ``delay`` s, the same amount for the same leaf on every run."""
    if delay:
        time.sleep(random.Random(hash(key)).random() * delay)


@tg.task
def fib(n: int, cutoff: int = 12, delay: float = 0.0) -> int:
    """fib(n) by two spawns per level down to ``cutoff``, plain Python below."""
    if n < cutoff:
        _leaf_nap(delay, n)
        return serial_fib(n)
    a = tg.spawn(fib, n - 1, cutoff, delay)
    b = tg.spawn(fib, n - 2, cutoff, delay)
    return a.result() + b.result()


@tg.task
def queens(n: int, row=0, cols=0, d1=0, d2=0, cutoff=5, delay=0.0) -> int:
    """Solutions of N-Queens below a partial board, one spawn per free column."""
    if n - row <= cutoff:
        _leaf_nap(delay, row, cols, d1, d2)
        return serial_queens(n, row, cols, d1, d2)
    futures = []
    free = ~(cols | d1 | d2) & ((1 << n) - 1)
    while free:
        bit = free & -free
        free ^= bit
        args = (n, row + 1, cols | bit, (d1 | bit) << 1, (d2 | bit) >> 1, cutoff, delay)
        futures.append(tg.spawn(queens, *args))
    return sum(tg.wait(futures))


def mix(x: int) -> int:
    """splitmix64: a node's id -> a well-spread 64-bit value."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def kids(node: int, depth: int) -> list[int]:
    """A binomial UTS-like tree: the root has 30 children, any other node 4 with
    probability 0.248 (else none), so subtrees differ wildly in size."""
    h = mix(node)
    if depth == 0:
        count = 30
    else:
        count = 4 if h % 1000 < 248 else 0
    return [mix(h + i + 1) for i in range(count)]


def serial_uts(node: int, depth: int) -> int:
    return 1 + sum(serial_uts(k, depth + 1) for k in kids(node, depth))


@tg.task
def uts(node: int = 7, depth: int = 0, cutoff: int = 6, delay: float = 0.0) -> int:
    """Nodes of the tree below ``node``: a spawn per child down to ``cutoff``."""
    if depth >= cutoff:
        _leaf_nap(delay, node)
        return serial_uts(node, depth)
    futures = [tg.spawn(uts, k, depth + 1, cutoff, delay) for k in kids(node, depth)]
    return 1 + sum(tg.wait(futures))


@tg.task
def chain(depth: int) -> int:
    """A recursion ``depth`` spawns deep, each level waiting for the next."""
    if depth == 0:
        return 0
    return tg.spawn(chain, depth - 1).result() + 1


def fail_at_bottom(x: int, delay: float) -> int:
    _leaf_nap(delay, x)
    raise ValueError(f"bad leaf {x}")


def middle(x: int, delay: float) -> int:
    # a slow sibling first: on 2 and 3 ranks the grandchild may be stolen meanwhile
    below = tg.spawn(fail_at_bottom, x, delay)
    tg.spawn(_leaf_nap, 4 * delay, x).result()
    return below.result()  # not caught here


@tg.task
def grandparent(x: int, delay: float = 0.0) -> str:
    try:
        tg.spawn(middle, x, delay).result()
    except tg.TaskError as exc:
        return "caught " + " ".join(str(exc).split())
    return "not raised"


def gate(path: str, n: int) -> int:
    """fib(n), once ``path`` exists (the script opens it): keeps a run in flight."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)
    return serial_fib(n)


@tg.task
def gated_sum(path: str, k: int) -> int:
    """The sum of fib(0..k-1), each a spawned call held until ``path`` exists."""
    return sum(tg.wait([tg.spawn(gate, path, n) for n in range(k)]))


@tg.task
def asks_grandchild(x: int) -> int:
    return tg.spawn(middle, x, 0.0).result()  # not caught: fails the run


def test_the_tree_is_unbalanced_and_of_a_useful_size():
    sizes = [serial_uts(k, 1) for k in kids(7, 0)]
    assert 1 + sum(sizes) == serial_uts(7, 0) == 4599
    assert max(sizes) > 20 * min(sizes)


JOB = """
import sys, threading, time
import taskgraph as tg
sys.path.insert(0, {tests!r})
from test_dynamic_ranks import asks_grandchild, chain, fib, gated_sum, grandparent, queens, uts

def say(*words):
    line = " ".join(str(w) for w in (f"rank {{c.rank}}:", *words))
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()

def busy_workers():
    return [t.name for t in threading.enumerate() if t.name.startswith("taskgraph-worker")]

c = tg.Cluster()
for workers, delay in ((1, 0.0), (1, 0.002), (2, 0.002)):
    with tg.Graph("dyn") as g:
        f = fib(22, 12, delay)
        q = queens(8, cutoff=5, delay=delay)
        u = uts(delay=delay)
        d = chain(400)
        gp = grandparent(5, delay)
    run = c.run(g, workers=workers).wait()
    say("case", workers, delay, f.result(), q.result(), u.result(), d.result(),
        run.stats.steals + run.stats.pushes)
    say("caught", workers, delay, gp.result())

with tg.Graph("far") as g:  # alone: the grandchild waits while its sibling naps
    gp = grandparent(6, 0.1)
c.run(g, workers=1).wait()
say("far", gp.result())

# two dynamic runs in flight: one fails, the other, held meanwhile, goes on
with tg.Graph("held") as g1:
    h = gated_sum({gate!r}, 12)
with tg.Graph("fails") as g2:
    f2 = fib(18, 10, 0.002)
    asks_grandchild(4)
r1, r2 = c.run(g1, workers=2), c.run(g2, workers=1)
try:
    r2.wait(60)
    say("inflight not failed")
except tg.TaskError as exc:
    text = " ".join(str(exc).split())
    say("inflight failed", r1.state(), "asks_grandchild#" in text, "bad leaf 4" in text)
open({gate!r}, "a").close()
say("inflight other", r1.result(h), r1.state(), r2.state())

with tg.Graph("long") as g:
    fib(32, 10, 0.005)  # minutes of naps: stopped long before
run = c.run(g, workers=2)
if c.rank == 0:
    time.sleep(0.5)
    say("cancel at", repr(time.time()))
    run.cancel("enough")
try:
    run.wait()
    say("not cancelled")
except tg.RunError as exc:
    say("cancelled", repr(time.time()), "enough" in str(exc), len(busy_workers()))
with tg.Graph("next") as g:
    f = fib(16, 8)
c.run(g).wait()
say("next", f.result(), len(busy_workers()))
"""


def said(out: str, rank: int, what: str) -> list[str]:
    return re.findall(rf"^rank {rank}: {what} (.*)$", out, re.M)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_recursive_programs_steals_errors_and_cancel_on_ranks(ranks, mpirun, tmp_path):
    script = tmp_path / "dyn.py"
    body = JOB.format(tests=str(Path(__file__).parent), gate=str(tmp_path / "gate"))
    script.write_text(textwrap.dedent(body))
    before = child_pids()
    proc = mpirun(ranks, [str(script)], timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    want = f"{serial_fib(22)} 92 {serial_uts(7, 0)} 400"
    for workers, delay in ((1, 0.0), (1, 0.002), (2, 0.002)):
        steals = 0
        for rank in range(ranks):
            (case,) = said(out, rank, f"case {workers} {delay}") or [""]
            assert case.startswith(want + " "), out
            steals += int(case.split()[-1])
            (caught,) = said(out, rank, f"caught {workers} {delay}") or [""]
            # the grandchild, wherever it ran, named with its rank and its error
            assert caught.startswith("caught task middle(5, "), out
            assert re.search(rf"fail_at_bottom\(5, .*\) on rank \d/{ranks}", caught), caught
            assert "ValueError: bad leaf 5" in caught, caught
        if ranks == 1:
            assert steals == 0, out
        elif delay:  # slow leaves: an idle rank always finds work, and results stay exact
            assert steals > 0, out
    check_far_catch(out, ranks)
    for rank in range(ranks):
        assert said(out, rank, "inflight failed") == ["running True True"], out
        held = sum(serial_fib(n) for n in range(12))
        assert said(out, rank, "inflight other") == [f"{held} done failed"], out
    check_cancel(out, ranks)
    assert_no_new_children(before)


def check_far_catch(out: str, ranks: int) -> None:
    """On 2 and 3 ranks an idle rank steals the failing grandchild: its error comes
    back to the grandparent's rank, where it is caught."""
    for rank in range(ranks):
        (far,) = said(out, rank, "far") or [""]
        found = re.match(
            rf"caught task middle\(6, 0.1\) on rank (\d)/{ranks} .* "
            rf"task fail_at_bottom\(6, 0.1\) on rank (\d)/{ranks} .*ValueError: bad leaf 6",
            far,
        )
        assert found, out
        if ranks > 1:
            assert found.group(1) != found.group(2), far


def check_cancel(out: str, ranks: int) -> None:
    """Every rank stopped, and had no worker thread left, within 2 s of the cancel."""
    (at,) = said(out, 0, "cancel at") or [""]
    assert at, out
    for rank in range(ranks):
        (line,) = said(out, rank, "cancelled") or [""]
        assert line, out
        ended, named, workers = line.split()
        assert named == "True" and workers == "0", out
        took = float(ended) - float(at)
        assert took < 2.0, f"rank {rank} stopped {took:.2f} s after the cancel: {out}"
        assert said(out, rank, "next") == [f"{serial_fib(16)} 0"], out
