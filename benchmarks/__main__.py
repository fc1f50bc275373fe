"""``python -m benchmarks all [--quick] [--out DIR]``, or one suite by name.

Suites run one after another (never in parallel: they measure the machine), each
result is printed as a JSON line, each suite writes ``DIR/<suite>.json``, and ``all``
then the report (``DIR/README.md`` with tables, and PNG plots). ``report`` rebuilds the report
from the JSON files alone. DIR is ``benchmarks/results/``, where the committed full
run lives, or ``benchmarks/results/quick/`` (not committed) for ``--quick``: a
newcomer's first quick run must not write over the full run's results.

The packages of the ``bench`` extra that a suite cannot run without
(``benchmarks.common.NEEDS``) are looked for before any suite starts: a missing one
ends the command in one line naming it and the install command (dask, imported by a
baseline's subprocess after 49 s of timing, had lost the whole run).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from benchmarks import common

SUITES = [
    "cholesky",
    "qr",
    "tiles",
    "overhead",
    "micro",
    "comm",
    "hops",
    "cma",
    "pages",
    "binding",
    "graphsize",
    "tracing",
    "dynamic",
    "ensemble",
]
RESULTS = Path(__file__).parent / "results"


def out_dir(out: Path | None, quick: bool) -> Path:
    """Where results go: ``--out`` if given, else the committed full run's folder, or
    a folder of its own for quick runs."""
    if out is not None:
        return out
    return RESULTS / "quick" if quick else RESULTS


def run_suite(name: str, quick: bool) -> list[dict]:
    module = importlib.import_module(f"benchmarks.{name}")
    return module.run(quick=quick)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["all", "report", *SUITES])
    p.add_argument("--quick", action="store_true", help="small sizes: all of it in < 10 min")
    p.add_argument(
        "--out", type=Path, help="where results go (default results/, --quick: results/quick/)"
    )
    args = p.parse_args(argv)
    args.out = out_dir(args.out, args.quick)
    if args.what == "report":
        from benchmarks.report import write_report

        print(write_report(args.out))
        return
    names = SUITES if args.what == "all" else [args.what]
    common.require(names, "python -m benchmarks")  # (before any timing)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    failed = []
    for name in names:
        t1 = time.perf_counter()
        try:
            results = run_suite(name, args.quick)
        except Exception as exc:  # one suite failing must not lose the others
            if args.what != "all":
                raise
            print(f"# suite {name} failed: {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
            continue
        path = args.out / f"{name}.json"  # (a quick run's folder is its own: see out_dir)
        path.write_text(json.dumps(results, indent=1) + "\n")
        took = time.perf_counter() - t1
        print(f"# suite {name} took {took:.0f} s; results in {path}", flush=True)
    if args.what == "all":
        from benchmarks.report import write_report

        write_report(args.out)
        print(f"# suite took {time.perf_counter() - t0:.0f} s; results in {args.out}")
        if failed:
            raise SystemExit(f"suites that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
