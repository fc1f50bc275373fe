"""The tutorial notebooks: committed stripped and up to date, and they run headless.

Every ``notebooks/*.ipynb`` is executed with nbclient in a fresh kernel, in a temporary
directory (a copy of the notebook), with ``TASKGRAPH_QUICK=1`` (small sizes). A marker
in the kernel's environment reaches every process the notebook starts (controller,
mpiexec, engines); after the kernel shuts down, none may be left.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, assert_none_left

import taskgraph as tg

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = ROOT / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT = 180  # seconds, per cell

# text each notebook's outputs must contain (regular expressions)
EXPECTED = {
    "01-quickstart": [
        r"sum of squares of 0\.\.9 = 285\b",
        r"square\(7\) = 49\b",
        r"GFLOP/s",
        r"residual .* \(ok\)",
    ],
    "02-tiled-cholesky": [
        r"residual .* \(ok\)",
        r"tile-size sweep",
        r"tile\s+tiles\s+tasks\s+seconds\s+GFLOP/s",
        r"strong scaling",
        r"ranks\s+seconds\s+GFLOP/s\s+speed-up\s+efficiency",
        r"loaded back: <Trace 'cholesky'",
    ],
    "03-placement-and-communication": [
        r"2-D block-cyclic\s+1-D\s+random",
        r"makespan\s+[\d.]+ ms\s+[\d.]+ ms\s+[\d.]+ ms",
        r"critical path\s+[\d.]+ ms",
        r"bytes moved",
        r"predicted on 4 ranks",
    ],
    "04-many-tasks": [
        r"1000 walks of \d+ steps",
        r"reduction: .* \(ok\)",
        r"utilisation breakdown, 1999 tasks",
        r"rank\s+tasks\s+wall s\s+computing\s+comm\s+idle\s+overhead",
        r"sum over the members: \d+ \(1 left out\)",
        r"48 succeeded, 1 failed, 0 skipped, 5 retries",
        r"48 succeeded \(4\d from the checkpoint\)",
        r"member#\d+\(7, .*code 3",
    ],
    "06-dynamic-tasks": [
        r"fib\(36\) = 14930352 \(ok\)",
        r"11-Queens: 2680 solutions \(ok\)",
        r"spawned calls: \d+, steals: \d+",
        r"rank\s+computing\s+stealing\s+idle",
        r"caught: step\(3\) failed on rank \d; first error: ValueError\('negative pressure'\)",
        r"adaptive search: \d+ calls, best score",
        r"analytics: mean 499\.5",
        r"14-Queens: 365596 solutions",
    ],
    # in its stub state the exercises get findings with hints, not an exception
    "05-exercises": [r"LU without pivoting: .* problems? to fix", r"2-D Jacobi"],
}


def _ids(path: Path) -> str:
    return path.stem


def output_text(nb) -> str:
    """Everything the notebook printed or displayed as text."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                data = out.get("data", {})
                parts.append(data.get("text/plain", "") + data.get("text/html", ""))
    return "".join(parts)


def test_notebooks_exist():
    assert {p.stem for p in PATHS} >= set(EXPECTED), f"notebooks found: {PATHS}"


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_committed_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown", "a notebook starts with a markdown intro"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} of {path.name} has outputs: strip them"
            assert cell.execution_count is None, f"cell {i} of {path.name} has a count"


def test_generated_notebooks_up_to_date():
    spec = importlib.util.spec_from_file_location(
        "_make_notebooks", NOTEBOOKS / "_make_notebooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, nb in module.build().items():
        committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        assert committed == nb, (
            f"notebooks/{name}.ipynb differs from what notebooks/_make_notebooks.py "
            "writes: run `python notebooks/_make_notebooks.py`"
        )


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_notebook_runs(path, tmp_path, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("TASKGRAPH_QUICK", "1")
    monkeypatch.setenv("TASKGRAPH_TEST_JOB", marker)  # inherited by the kernel and engines
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError, naming the cell, if one fails
    finally:
        seconds = time.perf_counter() - t0
        nbformat.write(nb, tmp_path / f"executed-{path.name}")  # to look at after a failure
        assert_none_left(marker)
    print(f"{path.stem}: {seconds:.1f} s")

    text = output_text(nb)
    for pattern in EXPECTED.get(path.stem, []):
        assert re.search(pattern, text), f"{path.name}: no output matches {pattern!r}\n{text}"
    if path.stem == "02-tiled-cholesky":
        trace = tg.Trace.load(tmp_path / "out" / "cholesky.trace.json")
        assert trace.status == "done" and trace.nranks == 2 and trace.tasks
        with open(tmp_path / "out" / "cholesky.trace.json") as f:
            assert json.load(f)["traceEvents"], "no Chrome trace events"
        assert (tmp_path / "out" / "cholesky.html").stat().st_size > 0
