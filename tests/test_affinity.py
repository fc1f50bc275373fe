"""``taskgraph.core.affinity``: which CPUs a rank keeps, and ranks that bind themselves."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from taskgraph.core import affinity
from taskgraph.core.affinity import cpu_quota, parse_cfs, parse_cpu_max, share, topology_key

ALL4 = frozenset({0, 1, 2, 3})


def test_unbound_ranks_split_the_cpus_evenly_and_disjointly():
    assert [share(r, [ALL4, ALL4]) for r in (0, 1)] == [[0, 1], [2, 3]]
    assert [share(r, [ALL4] * 4) for r in range(4)] == [[0], [1], [2], [3]]
    odd = frozenset({4, 7, 9})  # CPU numbers as the OS gives them, not 0..n-1
    assert [share(r, [odd, odd]) for r in (0, 1)] == [[4], [7, 9]]


@pytest.mark.parametrize(
    "cpus_by_rank",
    [
        [ALL4],  # alone on the node
        [frozenset({0}), frozenset({1})],  # the launcher bound them (Open MPI, srun)
        [frozenset({0, 1}), frozenset({0, 1}), frozenset({0, 1})],  # more ranks than CPUs
    ],
)
def test_left_alone(cpus_by_rank):
    assert all(share(r, cpus_by_rank) is None for r in range(len(cpus_by_rank)))


def test_a_rank_has_its_share_of_the_cpus_it_shares_with_other_ranks():
    assert [affinity.rank_cores(r, [ALL4, ALL4]) for r in (0, 1)] == [2, 2]
    assert affinity.rank_cores(0, [ALL4]) == 4  # alone on the node
    # bound by the launcher: its own CPUs, whatever the others have
    assert affinity.rank_cores(1, [frozenset({0}), frozenset({1, 2})]) == 2
    assert affinity.rank_cores(0, [frozenset({0})] * 3) == 1  # oversubscribed: at least 1


def test_shares_keep_hyperthread_siblings_and_sockets_together(tmp_path):
    # 2 sockets x 2 cores x 2 threads, numbered as Intel does: siblings 4 apart
    layout = {
        0: (0, 0),
        1: (0, 1),
        2: (1, 0),
        3: (1, 1),
        4: (0, 0),
        5: (0, 1),
        6: (1, 0),
        7: (1, 1),
    }
    for cpu, (package, core) in layout.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    key = topology_key(tmp_path)
    every = [frozenset(range(8))] * 2
    assert [share(r, every, key=key) for r in (0, 1)] == [[0, 4, 1, 5], [2, 6, 3, 7]]
    # by number, rank 0 would have had both sockets' first threads: [0, 1, 2, 3]
    assert share(0, every) == [0, 1, 2, 3]
    assert topology_key(tmp_path / "nowhere")(3) == (0, 0, 3)  # no sysfs: by number


def test_a_binding_the_os_refuses_changes_nothing_and_says_so():
    before = affinity.current()
    assert affinity.bind([max(before) + 4096]) is False  # a CPU this machine lacks
    assert affinity.current() == before and affinity.node_cpus() == before


def test_a_cpu_quota_below_the_cpus_leaves_ranks_unbound():
    # a container limited to 2 CPUs' time on a 4-CPU node: other containers see the
    # same CPUs, and their ranks would be bound to the same ones
    assert share(0, [ALL4, ALL4], quota=2.0) is None
    assert share(1, [ALL4, ALL4], quota=4.0) == [2, 3]


def test_cgroup_quota_files_parse():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("250000 100000\n") == 2.5
    assert parse_cfs("-1\n", "100000\n") is None
    assert parse_cfs("50000", "100000") == 0.5
    quota = cpu_quota()  # this machine's, whatever it is: a number of CPUs or none
    assert quota is None or quota > 0


JOB = """
import json, os, sys, threading, time
started = threading.Event()

def idle():  # a thread that exists before the rank binds (as BLAS pools do)
    started.set()
    time.sleep(30)

t = threading.Thread(target=idle, daemon=True)
t.start()
started.wait()
import taskgraph as tg
from taskgraph.core import affinity
from taskgraph.core import config

c = tg.Cluster()
with affinity.whole_node():
    widened = sorted(os.sched_getaffinity(0))
out = {
    "rank": c.rank,
    "bound": c.world.bound_cpus,
    "main": sorted(os.sched_getaffinity(0)),
    "earlier_thread": sorted(os.sched_getaffinity(t.native_id)),
    "widened": widened,
    "cores": config.cores(),
    "workers": c.workers,
    "rank_cores": c.world.cores,
}
rows = c.world.allgather(out)
if c.rank == 0:
    print("ROWS " + json.dumps(rows))
"""


def job_rows(mpirun, tmp_path, env=None) -> list[dict]:
    script = tmp_path / "where.py"
    script.write_text(textwrap.dedent(JOB))
    proc = mpirun(2, [str(script)], timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ROWS "))
    return json.loads(line[5:])


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_unbound_ranks_take_a_core_each_with_every_thread(mpirun, tmp_path):
    node = sorted(os.sched_getaffinity(0))
    if len(node) < 2:
        pytest.skip("one CPU: two ranks are left to share it")
    rows = job_rows(mpirun, tmp_path)
    assert [r["bound"] for r in rows] == [share(i, [frozenset(node)] * 2) for i in (0, 1)]
    for r in rows:
        assert r["main"] == r["bound"] and r["earlier_thread"] == r["bound"]
        # what "cores" means does not change: the node's, for workers and labels
        assert r["widened"] == node and r["cores"] == len(node)
        assert r["workers"] == max(1, len(node) // 2)
        assert r["rank_cores"] == len(r["bound"])  # what the progress thread weighs
    assert not set(rows[0]["main"]) & set(rows[1]["main"])


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_taskgraph_bind_0_leaves_ranks_unbound(mpirun, tmp_path):
    node = sorted(os.sched_getaffinity(0))
    rows = job_rows(mpirun, tmp_path, env={"TASKGRAPH_BIND": "0"})
    assert all(r["bound"] is None and r["main"] == node for r in rows)
    # unbound, the two still share the node's CPUs: half each
    assert [r["rank_cores"] for r in rows] == [max(1, len(node) // 2)] * 2
