"""Resources of a rank, the gate's packing and backfill rule, the launch throttle
(taskgraph.run.resources), and resource packing in a real batch job."""

from __future__ import annotations

import re
import textwrap
import threading
import time

import pytest

from taskgraph.core.errors import GraphError
from taskgraph.dsl.options import TaskOptions
from taskgraph.run.resources import (
    Capacity,
    Gate,
    Need,
    RankInfo,
    Slots,
    TokenBucket,
    capacities,
    check_fits,
    fits,
    need_of,
)

GiB = 2**30


def test_capacity_of_ranks_shares_a_node_and_honours_limits():
    """Two ranks on node a, one on b: a's memory and (node-wide) GPUs are halved;
    GPUs bound to a rank (CUDA_VISIBLE_DEVICES) are its own; cores= wins."""
    infos = [
        RankInfo("a", 4, 8 * GiB, 2, False, (None, None, None)),
        RankInfo("a", 4, 8 * GiB, 2, False, (None, None, None)),
        RankInfo("b", 3, 6 * GiB, 1, True, (8, None, 0)),
    ]
    caps = capacities(infos)
    assert caps[0] == caps[1] == Capacity(4, 4 * GiB, 1)
    assert caps[2] == Capacity(8, 6 * GiB, 0)


def test_need_holds_ranks_times_cores():
    o = TaskOptions.make("task f", cores=2, ranks=3, memory="1GiB", gpus=1)
    assert need_of(o) == Need(6, GiB, 1)
    assert need_of(TaskOptions(), extra_cores=4) == Need(4, 0, 0)
    assert fits(o, Capacity(6, GiB, 1)) and not fits(o, Capacity(5, 8 * GiB, 4))


def test_a_task_asking_more_than_any_rank_names_it_and_the_largest_rank():
    caps = [Capacity(2, 4 * GiB, 0), Capacity(4, 4 * GiB, 0)]
    check_fits([("f#0()", Need(4, GiB, 0))], caps)  # fits rank 1
    with pytest.raises(GraphError) as err:
        check_fits([("f#0()", Need(1, 0, 0)), ("big#3(7)", Need(8, 0, 0))], caps)
    msg = str(err.value)
    assert "task big#3(7) asks for 8 cores" in msg, msg
    assert "rank 1/2, has 4 cores" in msg, msg
    with pytest.raises(GraphError, match="1 GPUs"):
        check_fits([("g#1()", Need(1, 0, 1))], caps)


def test_gate_never_oversubscribes_cores_memory_or_gpus():
    gate = Gate(Capacity(4, 10, 1))
    assert gate.try_acquire(Need(3, 5, 0))
    assert not gate.try_acquire(Need(2, 0, 0))  # cores
    assert gate.try_acquire(Need(1, 5, 0))
    gate.release(Need(1, 5, 0))
    assert not gate.try_acquire(Need(1, 6, 0))  # memory
    assert gate.try_acquire(Need(1, 0, 1))
    assert not gate.try_acquire(Need(0, 0, 1))  # gpus
    with pytest.raises(ValueError, match="this rank has 4 cores"):
        gate.acquire(Need(5, 0, 0))


def test_a_stream_of_small_calls_never_starves_a_large_one():
    """Six threads keep taking 1 core of 4; a 4-core call comes: it starts after at
    most max_bypass small ones overtook it, and cores in use never pass 4."""
    gate = Gate(Capacity(4, 0, 0), max_bypass=8)
    lock = threading.Lock()
    state = {"in_use": 0, "peak": 0, "small_after_big": 0, "big_waiting": False}
    stop = threading.Event()
    big_started = threading.Event()

    def hold(cores: int, seconds: float) -> None:
        with lock:
            state["in_use"] += cores
            state["peak"] = max(state["peak"], state["in_use"])
        time.sleep(seconds)
        with lock:
            state["in_use"] -= cores

    def small() -> None:
        while not stop.is_set():
            if not gate.acquire(Need(1, 0, 0), stop.is_set):
                return  # (stopped while waiting)
            with lock:
                if state["big_waiting"] and not big_started.is_set():
                    state["small_after_big"] += 1
            hold(1, 0.002)
            gate.release(Need(1, 0, 0))

    threads = [threading.Thread(target=small, daemon=True) for _ in range(6)]
    for th in threads:
        th.start()
    time.sleep(0.05)  # the small ones hold every core, turn by turn
    with lock:
        state["big_waiting"] = True
    deadline = time.monotonic() + 60  # (never a hang)
    assert gate.acquire(Need(4, 0, 0), lambda: time.monotonic() > deadline)
    big_started.set()
    hold(4, 0.01)
    gate.release(Need(4, 0, 0))
    stop.set()
    for th in threads:
        th.join(5)
    assert state["peak"] <= 4, state
    # the head counts every bypass; the 4 holding cores when it came are not bypasses
    assert state["small_after_big"] <= 8 + 4, state
    assert gate.in_use() == 0 and gate.in_use_peak <= 4


def test_backfill_lets_small_calls_use_cores_the_head_cannot():
    """4 cores, 3 held; a 2-core head waits; a 1-core call behind it backfills."""
    gate = Gate(Capacity(4, 0, 0))
    assert gate.try_acquire(Need(3, 0, 0))
    got: list[str] = []
    head = threading.Thread(target=lambda: gate.acquire(Need(2, 0, 0)) and got.append("head"))
    head.start()
    while not gate.queue:
        time.sleep(0.001)
    assert gate.acquire(Need(1, 0, 0), lambda: False)  # behind the head, in the free core
    assert gate.queue[0].bypassed == 1 and got == []
    gate.release(Need(1, 0, 0))
    gate.release(Need(3, 0, 0))
    head.join(5)
    assert got == ["head"]


def test_a_head_bypassed_max_times_holds_everything_back():
    gate = Gate(Capacity(4, 0, 0), max_bypass=1)
    assert gate.try_acquire(Need(3, 0, 0))
    head = threading.Thread(target=lambda: gate.acquire(Need(2, 0, 0)), daemon=True)
    head.start()
    while not gate.queue:
        time.sleep(0.001)
    assert gate.acquire(Need(1, 0, 0), lambda: False)  # the one bypass
    gate.release(Need(1, 0, 0))
    # a core is free, but the head has been passed over once: nothing new starts
    assert not gate.acquire(Need(1, 0, 0), lambda: True)
    assert not gate.try_acquire(Need(1, 0, 0))
    gate.release(Need(3, 0, 0))
    head.join(5)
    assert not head.is_alive() and gate.in_use() == 2


def test_an_interrupted_wait_leaves_the_queue_as_it_was():
    gate = Gate(Capacity(1, 0, 0))
    assert gate.try_acquire(Need(1, 0, 0))

    def stop() -> bool:
        raise KeyboardInterrupt  # (as an async exception would, mid-wait)

    with pytest.raises(KeyboardInterrupt):
        gate.acquire(Need(1, 0, 0), stop)
    assert not gate.queue
    gate.release(Need(1, 0, 0))
    assert gate.try_acquire(Need(1, 0, 0))


def test_token_bucket_spaces_launches():
    now = [100.0]
    bucket = TokenBucket(4.0, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.25, 0.5]
    now[0] += 2.0  # idle: no burst saved up beyond the next launch
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == 0.25
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_slots_cap_launches_at_once():
    slots = Slots(2)
    assert slots.acquire() and slots.acquire()
    assert not slots.acquire(lambda: True)
    slots.release()
    assert slots.acquire(lambda: True)


PACKING_JOB = """
import sys, time
import taskgraph as tg

@tg.task(cores=2)
def wide(i):
    t0 = time.perf_counter(); time.sleep(0.03); return ("wide", 2, t0, time.perf_counter())

@tg.task
def narrow(i):
    t0 = time.perf_counter(); time.sleep(0.01); return ("narrow", 1, t0, time.perf_counter())

@tg.task(cores=3)
def too_wide():
    return 0

c = tg.Cluster(workers=4, cores=2)
with tg.Graph("pack") as g:
    calls = [wide(i) if i % 3 == 0 else narrow.with_options(retries=1)(i) for i in range(24)]
run = c.run(g)
run.wait()
rows = [f.result() for f in calls]
events = sorted([(s, +k) for _, k, s, e in rows] + [(e, -k) for _, k, s, e in rows])
use = peak = 0
for _, k in events:
    use += k
    peak = max(peak, use)
print(f"rank {c.rank}: peak {peak} of {len(rows)}", flush=True)
# the same from the trace: each attempt holds its cores from launched to ended
spans = [(a["launched"], a["ended"], a["cores"]) for a in run.trace.attempts()
         if a["rank"] == c.rank and a["launched"] is not None]
events = sorted([(s, +k) for s, e, k in spans] + [(e, -k) for s, e, k in spans])
use = peak = 0
for _, k in events:
    use += k
    peak = max(peak, use)
print(f"rank {c.rank}: trace peak {peak} of {len(spans)}", flush=True)
# the launch throttle: 12 calls at 40 launches a second over the run
with tg.Graph("throttled") as g3:
    for i in range(12):
        narrow(i)
r3 = c.run(g3, launch_rate=40)
r3.wait()
starts = sorted(a["started"] for a in r3.trace.attempts())  # (after the token)
print(f"rank {c.rank}: throttled {len(starts)} over {starts[-1] - starts[0]:.3f} s", flush=True)
with tg.Graph("too") as g2:
    too_wide()
try:
    c.run(g2).wait()
except tg.GraphError as exc:
    print(f"rank {c.rank}: refused {exc}", flush=True)
"""


@pytest.mark.timeout(120)
def test_packing_in_a_batch_job_never_passes_the_cores(mpirun, tmp_path):
    """One rank of 4 worker threads and 2 cores: calls of 1 and 2 cores never hold
    more than 2 at once (each call's own [start, end]); a 3-core task is refused
    before it runs, naming it."""
    script = tmp_path / "pack.py"
    script.write_text(textwrap.dedent(PACKING_JOB))
    proc = mpirun(1, [str(script)], timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "rank 0: peak 2 of 24" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "rank 0: trace peak 2 of 24" in proc.stdout, proc.stdout
    # 12 launches at 40 a second (a burst of one) take at least 11 / 40 s
    spread = float(re.search(r"rank 0: throttled 12 over ([\d.]+) s", proc.stdout).group(1))
    assert spread >= 11 / 40 - 0.01, proc.stdout
    assert "refused task too_wide#0() asks for 3 cores" in proc.stdout, proc.stdout
