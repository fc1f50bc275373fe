"""The ``taskgraph`` command.

taskgraph demo [--ranks 2] [--n 4096] [--tile 512] [--dtype float64] [--json]
taskgraph run -n 4 script.py|notebook.ipynb [args...]
taskgraph convert notebook.ipynb [-o script.py]
taskgraph sbatch notebook.ipynb|script.py --nodes 2 --ntasks-per-node 4
                 --cpus-per-task 8 --time 1:00:00 [--partition P] [--account A]
                 [--module M ...] [-o job.sh]
taskgraph sbatch --engines --nodes 2 ... [-o engines.sh]   (engines for a notebook)
taskgraph mpi-env       (shell exports for ranks that start MPI before taskgraph does)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from ..cluster.launch import Terminated, run_ranks, script_argv
from ..core import config
from ..run.singlecopy import single_copy_env
from . import convert, demo, sbatch


def _demo(argv: list[str]) -> int:
    args = demo.parser().parse_args(argv)  # (a bad value ends here: no job has started)
    if args.ranks == 1 and not config.use_mpi():
        return demo.main(argv)
    return _launch(args.ranks, ["-m", "taskgraph.batch.demo", *argv], args.timeout)


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="taskgraph run", description="Run a script on N local MPI ranks."
    )
    p.add_argument("-n", "--ranks", type=demo.at_least(1), default=2, help="MPI ranks (default 2)")
    p.add_argument(
        "--timeout", type=demo.seconds, default=None, help="kill the job after this many seconds"
    )
    p.add_argument("script", help="a Python script or a notebook (.ipynb)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = p.parse_args(argv)
    if not Path(args.script).exists():
        print(f"taskgraph run: no such script: {args.script}", file=sys.stderr)
        return 2
    if args.script.startswith("-"):  # not an option of mpi4py's runner
        args.script = f"./{args.script}"
    if not convert.is_notebook(args.script):
        return _launch(args.ranks, script_argv(args.script, args.args), args.timeout)
    with tempfile.TemporaryDirectory(prefix="taskgraph-run-") as tmp:
        script = Path(tmp) / (Path(args.script).stem + ".py")
        try:
            _report(convert.convert_to_file(args.script, script))
        except convert.ConversionError as exc:
            print(f"taskgraph run: {exc}", file=sys.stderr)
            return 2
        return _launch(args.ranks, script_argv(str(script), args.args), args.timeout)


def _convert(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="taskgraph convert",
        description="Turn a notebook into a script that runs on the ranks of an MPI job.",
    )
    p.add_argument("notebook", help="a Jupyter notebook (.ipynb)")
    p.add_argument("-o", "--output", help="the script to write (default: stdout)")
    args = p.parse_args(argv)
    try:
        if args.output:
            _report(convert.convert_to_file(args.notebook, args.output))
            print(f"taskgraph convert: wrote {args.output}", file=sys.stderr)
        else:
            text, notes = convert.convert_notebook(args.notebook)
            sys.stdout.write(text)
            _report(notes)
    except convert.ConversionError as exc:
        print(f"taskgraph convert: {exc}", file=sys.stderr)
        return 2
    return 0


def _sbatch(argv: list[str]) -> int:
    p = sbatch.parser()
    args = p.parse_args(argv)
    try:
        options = sbatch.options_from_args(args)
        render = sbatch.render_engines if args.engines else sbatch.render_job
        text = render(options)
        if args.output:
            Path(args.output).write_text(text)
            print(
                f"taskgraph sbatch: wrote {args.output}; submit it with `sbatch {args.output}`",
                file=sys.stderr,
            )
        else:
            sys.stdout.write(text)
    except (ValueError, OSError) as exc:
        print(f"taskgraph sbatch: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(notes: list[str]) -> None:
    for note in notes:
        print(f"taskgraph convert: note: {note}", file=sys.stderr)


def _launch(ranks: int, argv: list[str], timeout: float | None) -> int:
    try:
        return run_ranks(ranks, argv, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"taskgraph: the job ran past {timeout} s and was stopped", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        return 130
    except Terminated as why:
        print(f"taskgraph: {why} received: the job was stopped", file=sys.stderr)
        return 143
    except FileNotFoundError as exc:
        print(f"taskgraph: {exc}", file=sys.stderr)
        return 127


def _mpi_env(argv: list[str]) -> int:
    """Print the MPI settings that ranks started from this node should get, as shell
    exports: single-copy transfers where allowed (see :mod:`taskgraph.run.comm`)."""
    argparse.ArgumentParser(prog="taskgraph mpi-env", description=_mpi_env.__doc__).parse_args(argv)
    for name, value in single_copy_env().items():
        print(f"export {name}={value}")
    return 0


COMMANDS = {
    "demo": _demo,
    "run": _run,
    "convert": _convert,
    "sbatch": _sbatch,
    "mpi-env": _mpi_env,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
