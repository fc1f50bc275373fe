"""SLURM job scripts from templates: ``taskgraph sbatch NOTEBOOK|SCRIPT --nodes ...``.

The templates live in ``slurm/`` at the top of the repository (installed as the
package data ``taskgraph.slurm``) and are plain bash with named placeholders,
``{{name}}``. Filling them is a pure function of the options::

    JobOptions --validate()--> values (all text, shell-quoted) --fill(template)--> job.sh

==================  ======================================================================
template            what the job does
==================  ======================================================================
``job.sh.tmpl``     ``srun python -m mpi4py script.py``: the script on nodes x
                    ntasks-per-node ranks, cpus-per-task worker threads each (BLAS and
                    numba threads to match), traces in ``<job-name>-<job id>.trace/``
                    beside ``<job-name>-<id>.out``
``engines.sh.tmpl`` an ipcontroller and ``srun ipengine --mpi`` (one engine per rank) that
                    a notebook joins with ``tg.Cluster.attach(connection_file=...)``
==================  ======================================================================

A notebook is converted (``taskgraph convert``) when the job script is written, and
the script (converted or given) is checked: it must compile, and no ``Cluster(n)``
with a literal n may ask for more ranks than the job has. Such a job fails here, not
in the queue; what cannot be checked before it runs (a cluster size computed at run
time) is noted.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .convert import ConversionError, check_ranks, convert_notebook

PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# SLURM --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_NAME = re.compile(r"^[A-Za-z0-9_.,+/@:-]+$")
TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 1:30:00, 2-00)"


@dataclass
class JobOptions:
    """What ``taskgraph sbatch`` was asked for; ``script`` is the Python file to run."""

    script: str = ""
    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int = 1
    time: str = "1:00:00"
    partition: str | None = None
    account: str | None = None
    modules: list[str] = field(default_factory=list)
    job_name: str = ""
    python: str = "python"
    venv: str | None = None
    mpi: str | None = None  # srun --mpi=... (pmix, pmi2), where the site needs one
    args: list[str] = field(default_factory=list)
    source: str = ""  # the notebook the script was converted from, if any


def parse_time(text: str) -> int:
    """Seconds in a SLURM ``--time``; a ValueError that lists the formats otherwise."""
    m = _TIME.match(text.strip())
    bad = f"--time {text!r} is not a SLURM time limit: use {TIME_FORMATS}"
    if not m:
        raise ValueError(bad)
    d, dh, dm, ds, mm, ms, hs = (int(g) if g is not None else None for g in m.groups())
    if d is not None:  # D-HH[:MM[:SS]]
        h, mi, s = dh or 0, dm or 0, ds or 0
        if h > 23 or mi > 59 or s > 59:
            raise ValueError(f"{bad}: hours < 24, minutes and seconds < 60 after 'D-'")
        seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    elif hs is not None:  # HH:MM:SS
        h, mi, s = mm or 0, ms or 0, hs
        if mi > 59 or s > 59:
            raise ValueError(f"{bad}: minutes and seconds must be below 60 in HH:MM:SS")
        seconds = (h * 60 + mi) * 60 + s
    else:  # MM or MM:SS
        mi, s = mm or 0, ms or 0
        if s > 59:
            raise ValueError(f"{bad}: seconds must be below 60 in MM:SS")
        seconds = mi * 60 + s
    if seconds <= 0:
        raise ValueError(f"--time {text!r} is zero: give the job some time, e.g. 30:00")
    return seconds


def validate(o: JobOptions, need_script: bool = True) -> None:
    """Raise a ValueError that says what to change in the options."""
    for name, value, what in (
        ("--nodes", o.nodes, "nodes for the job"),
        ("--ntasks-per-node", o.ntasks_per_node, "MPI ranks on each node"),
        ("--cpus-per-task", o.cpus_per_task, "cores for each rank's worker threads"),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1 (got {value}): the number of {what}")
    parse_time(o.time)
    for option, text in (("--partition", o.partition), ("--account", o.account)):
        if text is not None and not _NAME.match(text):
            raise ValueError(f"{option} {text!r}: use the name SLURM knows (letters, digits, _-.)")
    for module in o.modules:
        if not _NAME.match(module):
            raise ValueError(f"--module {module!r}: one module name per --module, e.g. gcc/12")
    if o.mpi is not None and not re.match(r"^[A-Za-z0-9_]+$", o.mpi):
        raise ValueError(f"--mpi {o.mpi!r}: a plugin name of `srun --mpi=list`, e.g. pmix")
    if need_script and not o.script:
        raise ValueError("no script to run: give a notebook (.ipynb) or a Python script")


def job_name(o: JobOptions) -> str:
    stem = o.job_name or Path(o.source or o.script).stem or "taskgraph"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)


def _common(o: JobOptions) -> dict[str, str]:
    lines = [f"#SBATCH --partition={o.partition}"] if o.partition else []
    lines += [f"#SBATCH --account={o.account}"] if o.account else []
    setup = [f"module load {shlex.quote(m)}" for m in o.modules]
    if o.venv:
        setup.append(f"source {shlex.quote(str(Path(o.venv) / 'bin' / 'activate'))}")
    return {
        "job_name": job_name(o),
        "nodes": str(o.nodes),
        "ntasks_per_node": str(o.ntasks_per_node),
        "cpus_per_task": str(o.cpus_per_task),
        "time": o.time.strip(),
        "sbatch_extra": "\n".join(lines),
        "setup": "\n".join(setup) or "# (no modules: --module NAME adds `module load NAME`)",
        "python": shlex.quote(o.python),
        "srun": "srun" + (f" --mpi={o.mpi}" if o.mpi else ""),
        "ranks": str(o.nodes * o.ntasks_per_node),
    }


def job_values(o: JobOptions) -> dict[str, str]:
    """The placeholders of ``job.sh.tmpl``, as text ready for bash."""
    validate(o)
    values = _common(o)
    what = f"{o.source} (converted to {o.script})" if o.source else o.script
    values.update(
        what=what.replace("\n", " "),
        script=shlex.quote(o.script),
        args=" ".join(shlex.quote(a) for a in o.args),
    )
    return values


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{{name}}`` replaced; every name must have a value."""
    missing = sorted(set(PLACEHOLDER.findall(template)) - set(values))
    if missing:
        raise KeyError(f"template placeholders without a value: {', '.join(missing)}")
    text = PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def template_dir() -> Path:
    """``slurm/``: installed as ``taskgraph.slurm``, else beside the package (a checkout)."""
    spec = importlib.util.find_spec("taskgraph.slurm")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "slurm"


def load_template(name: str) -> str:
    path = template_dir() / name
    if not path.exists():
        raise FileNotFoundError(f"template {path} missing: reinstall taskgraph")
    return path.read_text()


def render_job(options: JobOptions, template: str | None = None) -> str:
    """The job script for ``options`` (``slurm/job.sh.tmpl`` unless a template is given)."""
    values = job_values(options)
    return fill(template if template is not None else load_template("job.sh.tmpl"), values)


def render_engines(options: JobOptions, template: str | None = None) -> str:
    """A job that starts a controller and one engine per rank for a notebook to attach."""
    validate(options, need_script=False)
    values = _common(options)
    if not options.job_name:
        values["job_name"] = "taskgraph-engines"
    text = template if template is not None else load_template("engines.sh.tmpl")
    return fill(text, values)


# -- the command line -------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="taskgraph sbatch",
        description="Write a SLURM job script that runs a notebook or script on MPI ranks.",
    )
    p.add_argument("target", nargs="?", help="a notebook (.ipynb) or a Python script")
    p.add_argument("args", nargs="*", help="arguments for the script (after --)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--ntasks-per-node", type=int, default=1, help="MPI ranks per node")
    p.add_argument("--cpus-per-task", type=int, default=1, help="worker threads per rank")
    p.add_argument("--time", default="1:00:00", help=f"time limit: {TIME_FORMATS}")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--module", action="append", default=[], help="`module load` this (repeatable)")
    p.add_argument("--venv", help="activate this virtual environment in the job")
    p.add_argument("--python", help="the Python in the job (default: this one)")
    p.add_argument("--mpi", help="srun --mpi= plugin, where the site needs one (pmix, pmi2)")
    p.add_argument("--job-name")
    p.add_argument(
        "--engines",
        action="store_true",
        help="instead: a job of ipyparallel engines for a notebook to attach to",
    )
    p.add_argument("-o", "--output", help="write the job script here (default: stdout)")
    return p


def options_from_args(args: argparse.Namespace) -> JobOptions:
    """Options from the command line; a notebook is converted beside the job script."""
    import sys

    o = JobOptions(
        nodes=args.nodes,
        ntasks_per_node=args.ntasks_per_node,
        cpus_per_task=args.cpus_per_task,
        time=args.time,
        partition=args.partition,
        account=args.account,
        modules=list(args.module),
        job_name=args.job_name or "",
        python=args.python or sys.executable,
        venv=args.venv,
        mpi=args.mpi,
        args=list(args.args),
    )
    validate(o, need_script=False)
    if args.engines:
        return o
    if not args.target:
        raise ValueError("give a notebook (.ipynb) or a Python script to run (or --engines)")
    target = Path(args.target)
    if target.suffix not in (".ipynb", ".py"):
        raise ValueError(f"{target}: give a notebook (.ipynb) or a Python script (.py)")
    if not target.is_file():
        raise ValueError(f"{target}: no such file; check the path")
    if target.suffix == ".ipynb":
        where = Path(args.output).resolve().parent if args.output else Path.cwd()
        script = where / f"{target.stem}_batch.py"
        text, notes = convert_notebook(target, script.name)
        notes += check_script(text, o, target.name)
        script.write_text(text)
        o.source, o.script = str(target.resolve()), str(script)
    else:
        notes = check_script(target.read_text(), o, target.name)
        o.script = str(target.resolve())
    for note in notes:
        print(f"taskgraph sbatch: note: {note}", file=sys.stderr)
    return o


def check_script(python: str, o: JobOptions, where: str) -> list[str]:
    """What can be checked before the job waits in the queue: the script compiles,
    and no cluster asks for more ranks than the job has (ConversionError, a
    ValueError, if so); notes on what cannot be checked here."""
    notes = check_ranks(python, o.nodes * o.ntasks_per_node, where)
    try:
        compile(python, where, "exec")
    except SyntaxError as exc:
        raise ConversionError(f"{where}, line {exc.lineno}: {exc.msg}") from None
    return notes
