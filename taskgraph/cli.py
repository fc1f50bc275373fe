"""The ``taskgraph`` command.

taskgraph demo [--ranks 2] [--n 4096] [--tile 512] [--dtype float64] [--json]
taskgraph run -n 4 script.py [args...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from . import config
from .launch import run_ranks


def _demo(argv: list[str]) -> int:
    from . import demo

    args = demo.parser().parse_args(argv)
    if args.ranks < 1:
        print("taskgraph demo: --ranks must be at least 1", file=sys.stderr)
        return 2
    if args.ranks == 1 and not config.use_mpi():
        return demo.main(argv)
    return _launch(args.ranks, ["-m", "taskgraph.demo", *argv], args.timeout)


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="taskgraph run", description="Run a script on N local MPI ranks."
    )
    p.add_argument("-n", "--ranks", type=int, default=2, help="MPI ranks (default 2)")
    p.add_argument(
        "--timeout", type=float, default=None, help="kill the job after this many seconds"
    )
    p.add_argument("script", help="a Python script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error("-n must be at least 1")
    return _launch(args.ranks, [args.script, *args.args], args.timeout)


def _launch(ranks: int, argv: list[str], timeout: float | None) -> int:
    try:
        return run_ranks(ranks, argv, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"taskgraph: the job ran past {timeout} s and was stopped", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        return 130
    except FileNotFoundError as exc:
        print(f"taskgraph: {exc}", file=sys.stderr)
        return 127


COMMANDS = {"demo": _demo, "run": _run}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
