"""What every benchmark shares: JSON output, the machine, running jobs.

A benchmark module ``benchmarks/<name>.py`` defines ``run(quick: bool) -> list[dict]``:
every dict is one result, has a ``"benchmark"`` key, its figures, its baseline
measured in the same run, their ratio, and ``"machine"``; ``run`` prints each one
with :func:`emit` as it goes. ``python -m benchmarks <name> [--quick]`` runs one,
``python -m benchmarks all [--quick]`` runs the suite and writes ``results/``
(``results/quick/`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from taskgraph.core import config
from taskgraph.core.machine import describe

# what each suite imports from the bench extra and cannot run without (ensemble reads
# a missing dask or parsl as an unavailable baseline, the report draws no plots
# without matplotlib); tests/test_bench_choices.py checks this against the sources
NEEDS = {"cholesky": ("dask",), "overhead": ("dask",)}
INSTALL = 'pip install -e ".[bench]"'

_machine: dict | None = None


def missing(suites: list[str]) -> dict[str, list[str]]:
    """The packages that ``suites`` need (:data:`NEEDS`) and this Python lacks, each
    with the suites that need it; empty when nothing is missing."""
    out: dict[str, list[str]] = {}
    for suite in suites:
        for package in NEEDS.get(suite, ()):
            if importlib.util.find_spec(package) is None:
                out.setdefault(package, []).append(suite)
    return out


def require(suites: list[str], prog: str) -> None:
    """Exit (code 2) with one line naming what ``suites`` need and this Python lacks,
    and how to install it; ``prog``: the command, for the message."""
    lacking = missing(suites)
    if lacking:
        needed = "; ".join(f"{p} (for {', '.join(s)})" for p, s in lacking.items())
        print(f"{prog}: not installed: {needed}; {INSTALL}", file=sys.stderr, flush=True)
        raise SystemExit(2)


def machine() -> dict:
    global _machine
    if _machine is None:
        _machine = describe()
    return _machine


def emit(result: dict) -> dict:
    """Print one result as a JSON line (with the machine) and return it."""
    result = dict(result)
    result.setdefault("machine", machine())
    print(json.dumps(result), flush=True)
    return result


def oversubscribed(ranks: int, workers: int = 1) -> bool:
    """True when ranks x workers exceeds this machine's cores (say so in results)."""
    return ranks * workers > config.cores()


def last_json(cmd: list[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run a command and parse the JSON object on its last line of output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def quick_main(run: Callable[..., list[dict]], doc: str, argv=None, help: str | None = None):
    """``python -m benchmarks.<suite> [--quick]``, for a suite with no other options."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=help)
    run(quick=p.parse_args(argv).quick)


def job_env(**extra: str) -> dict[str, str]:
    """This process's environment for a job of ranks that import ``benchmarks``."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, **extra)
