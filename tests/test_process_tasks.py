"""``@tg.task(process=True)``: GIL-bound calls in the rank's process pool run in
parallel, fail before running when they ask too much, and leave no process behind."""

from __future__ import annotations

import textwrap

import pytest

JOB = """
import os, time
import taskgraph as tg
from taskgraph.run import procpool

@tg.task(process=True)
def spin(seconds):
    # pure Python: holds the GIL the whole time
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        n += 1
    return os.getpid(), t0, time.perf_counter()

@tg.task(process=True, cores=4)
def greedy():
    return 0

c = tg.Cluster(workers=2, cores=2)
with tg.Graph("gil") as g:
    calls = [spin(0.5), spin(0.5)]
c.run(g).wait()
(p1, s1, e1), (p2, s2, e2) = [f.result() for f in calls]
overlap = min(e1, e2) - max(s1, s2)
print(f"pids {p1 != p2} {os.getpid() not in (p1, p2)} overlap {overlap:.3f}", flush=True)
print(f"pool {len(procpool.processes())}", flush=True)
with tg.Graph("greedy") as g2:
    greedy()
try:
    c.run(g2).wait()
except tg.GraphError as exc:
    print(f"refused {exc}", flush=True)
"""


@pytest.mark.timeout(120)
def test_gil_bound_calls_run_in_parallel_processes(mpirun, tmp_path):
    """Two pure-Python calls on 2 workers overlap in time, measured inside the
    children (not by speed); a 4-core task on a 2-core rank is refused before it
    runs, naming it; the pool's processes are gone after the job (the fixture looks
    for any process with the job's marker)."""
    script = tmp_path / "gil.py"
    script.write_text(textwrap.dedent(JOB))
    proc = mpirun(1, [str(script)], timeout=100)
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:] + proc.stderr[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("pids"))
    assert line.startswith("pids True True overlap"), out
    assert float(line.split()[-1]) > 0.1, out  # they ran at the same time
    assert "pool 2" in out, out
    assert "refused task greedy#0() asks for 4 cores" in out, out


DIES = """
import os
import taskgraph as tg

@tg.task(process=True)
def dies():
    os._exit(3)  # (as a call into MPI there does: its PMI_Init fails)

@tg.task
def fine():
    return 7

c = tg.Cluster()
with tg.Graph("dies") as g:
    dies()
try:
    c.run(g).wait(60)
except tg.TaskError as exc:
    print(f"failed {exc}", flush=True)
with tg.Graph("after") as g2:
    r = fine()
c.run(g2).wait(60)
print(f"after {r.result()}", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_pool_process_that_dies_is_named_with_why_it_may_have(mpirun, tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent(DIES))
    proc = mpirun(1, [str(script)], timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "task dies#0() (process=True): the pool's process died" in proc.stdout, proc.stdout
    assert "not an MPI rank: a call there cannot use mpi4py" in proc.stdout, proc.stdout
    assert "after 7" in proc.stdout
