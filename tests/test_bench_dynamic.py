"""The dynamic benchmark's programs: the numba leaves against plain Python, the static
splits against the whole, the jobs it starts; no timings."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the repository, not installed

from benchmarks import dynamic, leaves

QUEENS = {1: 1, 4: 2, 5: 10, 6: 4, 7: 40, 8: 92, 9: 352, 10: 724}


def fib_loop(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def test_fib_leaf_and_its_python_are_fib():
    assert [leaves.fib(n) for n in range(25)] == [fib_loop(n) for n in range(25)]
    assert [leaves.fib.py_func(n) for n in range(15)] == [fib_loop(n) for n in range(15)]


@pytest.mark.parametrize("n,cutoff", [(0, 5), (1, 0), (20, 12), (25, 2)])
def test_fib_split_leaves_add_up_to_fib(n, cutoff):
    assert sum(leaves.fib(m) for m in leaves.fib_split(n, cutoff)) == fib_loop(n)


def test_queens_counts_the_known_solutions():
    assert {n: leaves.queens(n, 0, 0, 0) for n in QUEENS} == QUEENS
    assert leaves.queens.py_func(8, 0, 0, 0) == 92


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 8])
def test_eight_queens_split_at_any_depth_finds_92(depth):
    assert sum(leaves.queens(*s) for s in leaves.queens_split(8, depth)) == 92


def test_splitmix64_is_the_reference_one():
    # the first output of Vigna's splitmix64 seeded with 0
    assert int(leaves.splitmix64(np.uint64(0))) == 0xE220A8397B1DCDAF
    with np.errstate(over="ignore"):  # NumPy scalars warn where 64-bit wrapping is meant
        assert int(leaves.splitmix64.py_func(np.uint64(0))) == 0xE220A8397B1DCDAF


def test_uts_degrees_are_geometric_with_mean_b0():
    degrees = [leaves.uts_degree(np.uint64(i), 0, 4.0, 10) for i in range(20_000)]
    assert abs(np.mean(degrees) - 4.0) < 0.2
    assert degrees.count(0) / len(degrees) == pytest.approx(1 / 5, abs=0.02)  # p = 1/(1+b0)
    assert leaves.uts_degree(np.uint64(7), 10, 4.0, 10) == 0  # the depth cap


def uts_python(node: int, depth: int, b0: float, max_depth: int) -> int:
    """The tree's size by walking it with uts_children (a different path from the leaf)."""
    return 1 + sum(uts_python(*c) for c in leaves.uts_children(node, depth, b0, max_depth))


def test_uts_leaf_counts_the_tree_that_its_children_walk():
    for seed in (1, 42, 7):
        whole = leaves.uts(np.uint64(seed), 0, 3.0, 6)
        assert whole == uts_python(seed, 0, 3.0, 6)
        assert whole == leaves.uts.py_func(np.uint64(seed), 0, 3.0, 6)


@pytest.mark.parametrize("depth", [0, 1, 3, 5])
def test_uts_split_adds_up_to_the_whole_tree(depth):
    above, subtrees = leaves.uts_split(42, 4.0, 8, depth)
    below = sum(leaves.uts(np.uint64(n), d, b, m) for n, d, b, m in subtrees)
    assert above + below == leaves.uts(np.uint64(42), 0, 4.0, 8)


def test_the_quick_problems_have_their_known_answers_serial_and_chunked():
    known = {"fib": 9227465, "queens": 73712, "uts": 12858040}  # uts: the fixed tree's size
    for p in dynamic.programs(quick=True):
        base, items = dynamic.chunks(p)
        assert dynamic.serial(p) == known[p.name]
        assert base + dynamic.run_chunk(p.name, items) == known[p.name]


@pytest.mark.timeout(120)
def test_the_process_pool_baseline_counts_what_serial_counts():
    small = [
        dynamic.Program("fib", (22,), 15),
        dynamic.Program("queens", (8,), 2),
        dynamic.Program("uts", (42, 4.0, 7), 3),
    ]
    with dynamic.make_pool() as pool:
        assert isinstance(pool, ProcessPoolExecutor)
        for p in small:
            assert dynamic.pool_seconds(p, pool)[1] == dynamic.serial(p)
        # without tg.spawn the baselines still come, and the taskgraph figure says why not
        (row,) = dynamic.measure_program(small[0], pool, spawn=False, timeout=60)
        assert row["taskgraph"] == dynamic.UNAVAILABLE and row["value"] == 17711
        assert row["pool_chunks"] == len(leaves.fib_split(22, 15))


def test_a_failed_job_gives_a_row_that_says_so_and_no_ratio():
    base = {"benchmark": "dynamic", "serial_seconds": 1.0, "pool_seconds": 0.6, "value": 5}
    row = dynamic.rate(base, 3, {"error": "job of 3 ranks failed (1): boom"})
    assert row["taskgraph"].endswith("boom") and row["ranks"] == 3
    assert "speedup_vs_serial" not in row and "vs_pool" not in row
    ok = dynamic.rate(
        base, 2, {"seconds": 0.5, "seconds_all": [0.5], "value": 5, "cpu_fraction_by_rank": [1, 1]}
    )
    assert ok["speedup_vs_serial"] == 2.0 and ok["vs_pool"] == 1.2 and ok["value_ok"]


def test_the_targets_say_they_do_not_apply_at_the_quick_sizes():
    rows = [
        {"program": "uts", "ranks": 2, "seconds": 0.1, "speedup_vs_serial": 1.9, "vs_pool": 1.1}
    ]
    idle, load = {"idle_rank_cpu_fraction": 0.01}, {"vs_unloaded": 1.2}
    full, quick = dynamic.targets(rows, idle, load), dynamic.targets(rows, idle, load, quick=True)
    assert full["applies"] and "note" not in full and full["uts_vs_pool"]["ok"]
    assert not quick["applies"] and "full sizes" in quick["note"]


def test_the_loaded_target_is_shown_beside_the_fair_share_bound():
    # 2 ranks on 2 cores, one shared with a busy loop: 1.5 cores do 2 cores' work
    assert dynamic.fair_share_bound(2, 2) == 1.333
    assert dynamic.fair_share_bound(2, 4) == 1.0  # (a rank moves to a free core)
    assert dynamic.fair_share_bound(4, 4) == round(4 / 3.5, 3)
    rows = [{"program": "uts", "ranks": 2, "seconds": 1.0, "speedup_vs_serial": 1.9, "vs_pool": 1}]
    load = {"vs_unloaded": 1.331, "fair_share_bound": 1.333}
    got = dynamic.targets(rows, {}, load)["uts_loaded"]
    assert got == {"value": 1.331, "target": 1.3, "ok": False, "fair_share_bound": 1.333}


@pytest.mark.timeout(30)
def test_the_busy_loop_is_gone_after_its_block():
    with dynamic.BusyLoop(0) as busy:
        assert busy.proc is not None and busy.proc.poll() is None
    assert busy.proc.poll() is not None


@pytest.mark.timeout(60)
def test_the_suite_takes_quick_and_help():
    cmd = [sys.executable, "-m", "benchmarks", "dynamic", "--quick", "--help"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "dynamic" in proc.stdout and "--quick" in proc.stdout


@pytest.mark.timeout(120)
def test_the_idle_cpu_job_reports_every_rank(mpirun):
    env = {"PYTHONPATH": str(ROOT), "TASKGRAPH_WORKERS": "1"}
    proc = mpirun(2, ["-m", "benchmarks.dynamic", "--idle", "27"], timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got["cpu_fraction_by_rank"]) == len(got["rank_seconds"]) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,args,split", [("fib", (20,), 14), ("queens", (8,), 2)])
def test_the_spawned_version_counts_exactly_on_2_ranks(mpirun, name, args, split):
    if not dynamic.have_spawn():
        pytest.skip("tg.spawn is not in this tree yet")
    spec = json.dumps({"name": name, "args": list(args), "split": split})
    env = {"PYTHONPATH": str(ROOT), "TASKGRAPH_WORKERS": "1"}
    argv = ["-m", "benchmarks.dynamic", "--child", spec, "--repeat", "1"]
    proc = mpirun(2, argv, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["value"] == dynamic.serial(dynamic.Program(name, args, split))
