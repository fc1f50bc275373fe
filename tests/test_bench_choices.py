"""The benchmark suite's own decisions: which baseline a figure is held to, and where
a run's results go (the committed full run must survive a newcomer's quick run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the repository, not installed

from benchmarks import __main__ as bench_main
from benchmarks import comm
from benchmarks.__main__ import RESULTS, out_dir


def test_the_bandwidth_baseline_is_a_two_buffer_ping_pong_never_the_one_buffer_one():
    # one buffer far faster (its working set in cache): still not the baseline
    assert comm.baseline(same=500.0, two=1000.0, numpy=1020.0) == 1000.0
    assert comm.baseline(same=3600.0, two=1090.0, numpy=1086.0) == 1086.0


def test_a_quick_run_writes_beside_the_committed_full_run_not_over_it():
    assert out_dir(None, quick=False) == RESULTS
    assert out_dir(None, quick=True) == RESULTS / "quick"
    assert out_dir(None, quick=True) != RESULTS
    assert out_dir(Path("elsewhere"), quick=True) == Path("elsewhere")


def test_one_quick_suite_writes_its_results_where_out_says(tmp_path, monkeypatch, capsys):
    """``--out`` said "where results go" and a single --quick suite wrote nothing."""
    monkeypatch.setattr(bench_main, "run_suite", lambda name, quick: [{"suite": name}])
    bench_main.main(["dynamic", "--quick", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "dynamic.json").read_text()) == [{"suite": "dynamic"}]
    assert str(tmp_path / "dynamic.json") in capsys.readouterr().out


def test_quick_results_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    check = ["git", "check-ignore", "-q", "benchmarks/results/quick/comm.json"]
    assert subprocess.run(check, cwd=ROOT, timeout=30).returncode == 0
    kept = ["git", "check-ignore", "-q", "benchmarks/results/comm.json"]
    assert subprocess.run(kept, cwd=ROOT, timeout=30).returncode == 1
