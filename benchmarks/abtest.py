"""Two versions of the executor, interleaved in one job: is a change faster per hop?

    python -m benchmarks.abtest REF [--sizes 8 1048576] [--pairs 15]   # its own 2-rank job

Loads ``taskgraph/run/executor.py`` (``taskgraph/executor.py`` before the layers) as it is
at the git ref REF beside the working tree's
and runs the comm suite's ping-pong chain with each in turn: pairs of runs, the two
versions alternating, in one 2-rank job. Only the executor is swapped (the rest is the
working tree's), so REF must be recent enough for its executor to run against today's
other modules.

Why: separate runs of one benchmark on a shared VM differ by up to 2x from one minute
to the next (an 8-byte hop of unchanged code took 7.2 to 24 us in one afternoon), so
two separate runs cannot show a 10 % change. Within a pair both versions see the same
machine. Per size: each version's best and median µs a hop (long chain minus a
2-hop chain: one difference a pair, where the comm suite takes the best of each length
over a quarter-length chain), and ``pairs_won``: in how many
pairs the working tree's was faster. Nothing here is a target: it is how a change to
the runtime's hot path is judged before it goes in.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import taskgraph as tg
from benchmarks.comm import hop_seconds, ping_pong
from benchmarks.common import emit, job_env
from taskgraph.core import config

# an executor of the flat layout (before the layers): its imports, and where they are now
FLAT = {
    "from . import comm as": "from taskgraph.run import comm as",
    "from . import config, memory": (
        "from taskgraph.core import config\nfrom taskgraph.dsl import memory"
    ),
    "from .errors import": "from taskgraph.core.errors import",
    "from .graph import": "from taskgraph.dsl.graph import",
    "from .plan import": "from taskgraph.plan.planner import",
    "from .trace import": "from taskgraph.trace.events import",
}


def layered(source: str) -> str:
    """An executor of the flat layout with its imports pointed at the layers."""
    for old, new in FLAT.items():
        source = source.replace(old, new)
    return source


def load_executor(path: str):
    """The executor module in ``path``, loaded as a module of the taskgraph package."""
    spec = importlib.util.spec_from_file_location("taskgraph.run._executor_ab", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child(out: str, old_path: str, ref: str, sizes: list[int], pairs: int) -> None:
    import taskgraph.cluster.jobrun as cluster_module
    from taskgraph.run import executor as new

    variants = {"ref": load_executor(old_path).Executor, "tree": new.Executor}
    cluster = tg.Cluster()
    if cluster.size != 2:
        raise SystemExit(f"the ping-pong needs 2 ranks, not {cluster.size}")
    try:
        for nbytes in sizes:
            hops = 1000 if nbytes < (1 << 16) else 200
            # a 2-hop short chain: one sample a pair, and both versions warm up alike,
            # while a quarter-length one made single differences swing (-7 to 16 us)
            X, graphs, plans = ping_pong(nbytes, hops, short=2)
            times: dict[str, list[float]] = {k: [] for k in variants}
            for i in range(pairs + 1):  # the first pair warms up, and is not counted
                for name, executor in variants.items():
                    cluster_module.Executor = executor
                    hop = hop_seconds(cluster, X, graphs, plans)
                    if i:
                        times[name].append(hop * 1e6)
            if cluster.rank == 0:
                result = {
                    "benchmark": "abtest",
                    "ref": ref,
                    "bytes": nbytes,
                    "hops": hops,
                    "pairs": pairs,
                    **{f"{k}_best_us": round(min(v), 2) for k, v in times.items()},
                    **{f"{k}_median_us": round(statistics.median(v), 2) for k, v in times.items()},
                    "pairs_won": sum(t < r for t, r in zip(times["tree"], times["ref"])),
                }
                with open(out, "a") as f:
                    f.write(json.dumps(emit(result)) + "\n")
    finally:
        cluster_module.Executor = new.Executor


def run(ref: str, sizes=(8, 1 << 20), pairs: int = 15) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    root = Path(__file__).resolve().parent.parent
    show = ["git", "show", f"{ref}:taskgraph/run/executor.py"]
    found = subprocess.run(show, cwd=root, capture_output=True, text=True, check=False)
    source = found.stdout
    if found.returncode:  # a ref from before the layers
        show[-1] = f"{ref}:taskgraph/executor.py"
        source = layered(
            subprocess.run(show, cwd=root, capture_output=True, text=True, check=True).stdout
        )
    with tempfile.TemporaryDirectory() as tmp:
        old_path = os.path.join(tmp, "executor_ref.py")
        Path(old_path).write_text(source)
        out = os.path.join(tmp, "abtest.jsonl")
        argv = ["-m", "benchmarks.abtest", ref, "--child", out, old_path, "--pairs", str(pairs)]
        argv += ["--sizes", *map(str, sizes)]
        sys.stdout.flush()
        proc = run_ranks(2, argv, timeout=1200, env=job_env())
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-rank A/B job failed ({proc.returncode})")
        return [json.loads(line) for line in Path(out).read_text().splitlines()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ref", help="a git ref: its executor against the working tree's")
    p.add_argument("--sizes", nargs="+", type=int, default=[8, 1 << 20])
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if not config.use_mpi():
            raise SystemExit("--child runs inside the 2-rank job")
        child(args.child[0], args.child[1], args.ref, args.sizes, args.pairs)
        return
    run(args.ref, sizes=args.sizes, pairs=args.pairs)


if __name__ == "__main__":
    main()
