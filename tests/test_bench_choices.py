"""The benchmark suite's own decisions: which baseline a figure is held to, where
a run's results go (the committed full run must survive a newcomer's quick run), and
what a suite needs before it starts."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the repository, not installed

from benchmarks import __main__ as bench_main
from benchmarks import cholesky, comm, common
from benchmarks.__main__ import RESULTS, SUITES, out_dir

pytestmark = pytest.mark.timeout(60)


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


# (suite, package): imported, but a missing one is reported as an unavailable baseline
OPTIONAL = {("ensemble", "dask"), ("ensemble", "parsl")}


def test_the_needs_table_names_every_bench_package_a_suite_imports():
    extra = re.search(r"^bench = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert extra, "no bench extra in pyproject.toml"
    bench = {re.match(r"[\w-]+", x.strip(' "'))[0] for x in extra[1].split(",")}
    for suite in SUITES:
        tree = ast.parse((ROOT / "benchmarks" / f"{suite}.py").read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}  # fmt: skip
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
        for package in imported & bench:
            needed = package in common.NEEDS.get(suite, ()) or (suite, package) in OPTIONAL
            assert needed, f"{suite} imports {package}: add it to benchmarks.common.NEEDS"


def test_a_suite_without_its_packages_stops_before_any_timing(monkeypatch, capsys, tmp_path):
    """cholesky --quick ran 49 s, then died of ModuleNotFoundError: dask, writing nothing."""
    real = common.importlib.util.find_spec
    monkeypatch.setattr(
        common.importlib.util, "find_spec", lambda name: None if name == "dask" else real(name)
    )
    ran = []
    monkeypatch.setattr(bench_main, "run_suite", lambda name, quick: ran.append(name) or [])
    for argv in (["cholesky", "--quick"], ["all", "--quick"]):
        with pytest.raises(SystemExit) as stop:
            bench_main.main([*argv, "--out", str(tmp_path)])
        assert stop.value.code == 2 and ran == []
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not installed: dask (for cholesky" in err, err
        assert 'pip install -e ".[bench]"' in err
    with pytest.raises(SystemExit):
        cholesky.main(["--quick"])
    assert "dask (for cholesky)" in capsys.readouterr().err
    bench_main.main(["tiles", "--quick", "--out", str(tmp_path)])  # (needs no dask)
    assert ran == ["tiles"]
