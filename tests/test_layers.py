"""The package's layers: imports point down only, and no module imports itself back.

A module may import from its own layer and the layers below it. Imports under ``if
TYPE_CHECKING:`` are for annotations only and are not counted.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent / "taskgraph"

# lowest first: the executor records into trace, so trace sits below run
LAYERS = ["core", "dsl", "plan", "trace", "run", "cluster", "batch"]
TOP = len(LAYERS)  # taskgraph/__init__, the teach package and the old-path aliases
# modules outside a layer folder that belong to a layer: linalg is graphs written in the DSL;
# calibrate measures the kernels for plan.tilesize (it imports core and plan alone)
PLACED = {"taskgraph.linalg": "dsl", "taskgraph.calibrate": "plan"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    if module in PLACED:
        return LAYERS.index(PLACED[module])
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else TOP


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING"


def imports(path: Path, modules: set[str]) -> list[tuple[int, str, bool]]:
    """(line, module imported, whether inside a function) for each import of a
    taskgraph module in ``path``; ``from pkg import mod`` counts as ``pkg.mod``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(), package, modules)


def imports_in(text: str, package: str, modules: set[str]) -> list[tuple[int, str, bool]]:
    """``imports`` of the source ``text`` of a module in ``package``."""
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((child.lineno, sub if sub in modules else base, inner))
            visit(child, inner)

    visit(ast.parse(text), False)
    return [(line, m, inner) for line, m, inner in found if m in modules]


def import_graph() -> tuple[nx.DiGraph, list[str]]:
    paths = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    g = nx.DiGraph()
    g.add_nodes_from(paths)
    upward = []
    for name, path in paths.items():
        for line, target, _ in imports(path, set(paths)):
            if target == name or name.startswith(target + "."):
                continue  # a package's own __init__ runs first anyway
            g.add_edge(name, target)
            if layer(target) > layer(name):
                upward.append(f"{name} (line {line}) imports {target}, a layer above")
    upward = list(dict.fromkeys(upward))  # (one line for each name a statement imports)
    return g, upward


def test_every_module_is_in_a_layer_folder_or_the_top():
    loose = {p.stem for p in ROOT.glob("*.py")}
    assert loose == {
        "__init__",
        "linalg",
        "calibrate",
        # old paths, kept for scripts and notebooks written before the layers
        "cli",
        "config",
        "convert",
        "demo",
        "tiled",
    }
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted([*LAYERS, "teach"])  # teach sits on top, with the package


def test_imports_point_down():
    _, upward = import_graph()
    assert upward == []


def test_no_import_cycle():
    g, _ = import_graph()
    assert list(nx.simple_cycles(g)) == []


def test_imports_inside_functions_are_only_of_the_widgets():
    """Inside a function a module of taskgraph is imported only where it pulls in a
    heavy optional dependency (the widgets need anywidget): never to dodge a cycle."""
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    inner = [
        f"{module_name(p)}:{line} {target}"
        for p in ROOT.rglob("*.py")
        for line, target, in_function in imports(p, modules)
        if in_function and target != "taskgraph.trace.widgets"
    ]
    assert inner == []


def test_the_checker_sees_upward_and_inner_imports():
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    text = (
        "from typing import TYPE_CHECKING\n"
        "from ..cluster import job\n"
        "from . import tasks\n"
        "if TYPE_CHECKING:\n"
        "    from ..run.executor import Executor\n"
        "def f():\n"
        "    from ..plan.planner import make_plan\n"
    )
    assert imports_in(text, "taskgraph.dsl", modules) == [
        (2, "taskgraph.cluster.job", False),
        (3, "taskgraph.dsl.tasks", False),
        (7, "taskgraph.plan.planner", True),
    ]
    assert layer("taskgraph.cluster.job") > layer("taskgraph.dsl.graph")


OLD_PATHS = """
import taskgraph.convert as _tgnb
from taskgraph.batch import nbshim
from taskgraph.config import cores, quick
from taskgraph.core import config
from taskgraph.dsl import tiled
from taskgraph.tiled import spd_dense
import taskgraph.cli, taskgraph.batch.cli
assert _tgnb is nbshim and _tgnb.rank0_prints and _tgnb.display and _tgnb.JobCluster
assert quick is config.quick and cores is config.cores and spd_dense is tiled.spd_dense
assert taskgraph.cli is taskgraph.batch.cli
"""


@pytest.mark.timeout(120)
def test_old_paths_of_scripts_and_notebooks_still_import():
    """Scripts converted, and job scripts rendered, before the layers keep working."""
    subprocess.run([sys.executable, "-c", OLD_PATHS], check=True, timeout=100)
    for module, says in (("taskgraph.cli", "taskgraph demo"), ("taskgraph.demo", "usage:")):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            timeout=100,
            check=True,
        )
        assert says in out.stdout
