"""Two versions of the executor, interleaved in one job: is a change faster per hop?

    python -m benchmarks.abtest REF [--sizes 8 1048576] [--pairs 15]   # its own 2-rank job

Loads the package ``taskgraph/run`` as it is at the git ref REF (extracted with ``git
archive``, imported as ``taskgraph._abtest_ref``, so that an executor split over several
modules is the ref's throughout; ``taskgraph/executor.py`` alone before the layers)
beside the working tree's, and runs the comm suite's ping-pong chain with each in turn:
pairs of runs, the two versions alternating, in one 2-rank job. Only the run package
is swapped (the graph, the plan and the communicator are the working tree's), so REF
must be recent enough for its executor to run against today's other modules.

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


REF_PACKAGE = "taskgraph._abtest_ref"  # the ref's run package, imported beside taskgraph.run


def load_executor(path: str):
    """The ref's executor module: ``path`` is the ref's run package (a directory,
    imported whole as :data:`REF_PACKAGE`) or a flat-layout executor file (loaded as
    a module of the working tree's run package)."""
    if os.path.isdir(path):
        spec = importlib.util.spec_from_file_location(
            REF_PACKAGE, os.path.join(path, "__init__.py"), submodule_search_locations=[path]
        )
        name = REF_PACKAGE
    else:
        spec = importlib.util.spec_from_file_location("taskgraph.run._executor_ab", path)
        name = ""
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if name:
        module = importlib.import_module(f"{name}.executor")
    return module


def ref_modules() -> list[str]:
    """The modules of the ref's run package that are loaded (proof of what runs)."""
    return sorted(m for m in sys.modules if m.startswith(REF_PACKAGE))


def adapted(executor: type) -> type:
    """A ref's Executor as today's run handle drives it: an executor from before run
    results moved to the run handle (7e6f9d9) writes them into ``graph.results``
    instead of keeping ``.results``; one from before ``run.submit`` takes no ``open``.
    Its hot path is untouched."""
    import inspect

    takes_open = "open" in inspect.signature(executor.__init__).parameters
    if hasattr(executor, "results") and takes_open:
        return executor
    keeps_results = hasattr(executor, "results")

    class Adapted(executor):  # type: ignore[misc, valid-type]
        def __init__(self, graph, *args, **kwargs):
            if not takes_open:  # (from before run.submit: every run is closed)
                kwargs.pop("open", None)
            if not keeps_results:
                graph.results = self.results = {}
            super().__init__(graph, *args, **kwargs)

    return Adapted


def child(out: str, old_path: str, ref: str, sizes: list[int], pairs: int) -> None:
    import taskgraph.cluster.jobrun as cluster_module
    from taskgraph.run import executor as new

    old = load_executor(old_path)
    variants = {"ref": adapted(old.Executor), "tree": new.Executor}
    assert old.Executor is not new.Executor and old.__file__ != new.__file__
    cluster = tg.Cluster()
    if cluster.rank == 0:
        print(f"abtest: ref {ref} from {old.__file__} {ref_modules()}", flush=True)
        print(f"abtest: tree from {new.__file__}", flush=True)
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
                    cluster_module.Executor = executor  # type: ignore[misc]
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
        cluster_module.Executor = new.Executor  # type: ignore[misc]


def run(ref: str, sizes=(8, 1 << 20), pairs: int = 15) -> list[dict]:
    from taskgraph.cluster.launch import run_ranks

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        old_path = extract_ref(root, ref, tmp)
        out = os.path.join(tmp, "abtest.jsonl")
        argv = ["-m", "benchmarks.abtest", ref, "--child", out, old_path, "--pairs", str(pairs)]
        argv += ["--sizes", *map(str, sizes)]
        sys.stdout.flush()
        proc = run_ranks(2, argv, timeout=1200, env=job_env())
        if proc.returncode != 0:
            raise RuntimeError(f"the 2-rank A/B job failed ({proc.returncode})")
        return [json.loads(line) for line in Path(out).read_text().splitlines()]


def extract_ref(root: Path, ref: str, tmp: str) -> str:
    """Write the ref's run package under ``tmp`` (or, before the layers, its executor
    with its imports layered); return its path."""
    archive = ["git", "archive", "--format=tar", ref, "taskgraph/run"]
    found = subprocess.run(archive, cwd=root, capture_output=True, check=False)
    if found.returncode == 0:
        subprocess.run(["tar", "-x", "-C", tmp], input=found.stdout, check=True)
        return os.path.join(tmp, "taskgraph", "run")
    show = ["git", "show", f"{ref}:taskgraph/executor.py"]  # a ref from before the layers
    source = layered(
        subprocess.run(show, cwd=root, capture_output=True, text=True, check=True).stdout
    )
    path = os.path.join(tmp, "executor_ref.py")
    Path(path).write_text(source)
    return path


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
