"""Write the tutorial notebooks from the cells below, outputs stripped.

    python notebooks/_make_notebooks.py

The notebooks are generated so that they can be reviewed as code: edit the cells here,
run this script, commit both. ``tests/test_notebooks.py`` checks that the committed
``.ipynb`` files match what this script writes, and executes every notebook headless
with ``TASKGRAPH_QUICK=1`` (small sizes). ``05-exercises`` comes from ``_make_05.py`` and is
not touched here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from textwrap import dedent

import nbformat

HERE = Path(__file__).parent


def md(text: str):
    return nbformat.v4.new_markdown_cell(dedent(text).strip())


def code(text: str):
    return nbformat.v4.new_code_cell(dedent(text).strip())


def setup(sizes: str, imports: str = "", config: str = "quick", stdlib: str = "", numba=False):
    """The first code cell of every notebook: imports (``stdlib`` ones first, as isort
    orders them), and sizes that QUICK shrinks."""
    head = dedent(
        f"""
        {"import numba" if numba else ""}
        import numpy as np

        import taskgraph as tg
        """
    ).strip()
    if stdlib:
        head = f"{dedent(stdlib).strip()}\n\n{head}"
    head += f"\nfrom taskgraph.core.config import {config}"
    imports = dedent(imports).strip()
    quick = "QUICK = quick()  # TASKGRAPH_QUICK=1: small sizes (the tests run every notebook so)"
    return code(
        "\n".join([head, imports, "", quick, dedent(sizes).strip()]).replace("\n\n\n", "\n\n")
    )


# -- 01 ---------------------------------------------------------------------------------

QUICKSTART = [
    md(
        """
        # 01 · Quick start

        This notebook starts a small cluster — ipyparallel engines, one per MPI rank —
        and runs two task graphs on it:

        1. a **futures** graph of plain Python functions (`@tg.task`), and
        2. a **sequential-task-flow** graph: tiled Cholesky, written as the ordinary loop
           with each tile marked as read (`.r`) or read-and-written (`.rw`).

        You will watch each run live (`run.show()`), then gather the results back into the
        notebook. Set `TASKGRAPH_QUICK=1` before starting Jupyter for small sizes.
        """
    ),
    setup(
        """
        N, TILE = (512, 128) if QUICK else (4096, 512)
        """
    ),
    md(
        """
        ## Start a cluster

        `tg.Cluster(n=2)` starts an ipyparallel controller on 127.0.0.1 and 2 engines
        under `mpiexec`; engine *i* is `COMM_WORLD` rank *i*. (On an HPC system use
        `tg.Cluster.attach(...)` to connect to engines a SLURM job started.)
        """
    ),
    code(
        """
        cluster = tg.Cluster(n=2)
        cluster
        """
    ),
    md(
        """
        ## A futures graph

        Inside `with tg.Graph(...)`, calls of `@tg.task` functions do not run: they record
        a task and return a `Future`, which other calls can take as an argument. The graph
        is data — look at it before anything runs.
        """
    ),
    code(
        """
        @tg.task
        def square(x):
            return x * x


        @tg.task
        def total(*xs):
            return sum(xs)


        with tg.Graph("squares") as g:
            squares = [square(i) for i in range(10)]
            s = total(*squares)

        print(g)
        print("placement (task -> rank):", tg.make_plan(g, cluster.size).placement)
        """
    ),
    md(
        """
        `cluster.run(g)` plans the graph, sends the plan to every engine in one message
        and returns at once; `run.show()` is the live view, `run.wait()` blocks until the
        run ends (and raises if a task failed on any rank).
        """
    ),
    code(
        """
        run = cluster.run(g)
        run.show()
        run.wait()
        print("sum of squares of 0..9 =", s.result())
        print("square(7) =", squares[7].result(), "(fetched from the engine that computed it)")
        """
    ),
    md(
        """
        ## A sequential-task-flow graph: tiled Cholesky

        Write the loop of the algorithm and mark how each task uses each tile;
        read-after-write, write-after-read and write-after-write dependencies are
        inferred. `taskgraph.linalg.cholesky(A)` is that loop; here is its source. The
        matrix is made on the engines, each engine only its own tiles (2-D
        block-cyclic).
        """
    ),
    code(
        """
        import inspect

        from taskgraph.linalg import cholesky

        print(inspect.getsource(cholesky))
        """
    ),
    code(
        """
        A = tg.TiledMatrix.random_spd(N, tile=TILE, cluster=cluster)
        chol = cholesky(A)

        print(A)
        print(chol)
        """
    ),
    md("What the plan predicts, before running: tasks per rank and the messages between ranks."),
    code("chol.preview()"),
    code(
        """
        run = cluster.run(chol)
        run.show()
        run.wait()
        gflops = N**3 / 3 / run.seconds / 1e9
        print(f"Cholesky n={N} tile={TILE}: {run.seconds:.3f} s, {gflops:.2f} GFLOP/s")
        print(f"(kernels compiled before the run: {run.compile_seconds:.2f} s)")
        """
    ),
    md(
        """
        ## Gather and check

        `A.gather()` collects the tiles into one NumPy array in the notebook. The lower
        triangle now holds the factor L; check ‖A − LLᵀ‖/‖A‖ against the same random
        matrix built here.
        """
    ),
    code(
        """
        from taskgraph.dsl.tiled import spd_dense
        from taskgraph.linalg import cholesky_residual

        L = np.tril(A.gather())
        residual = cholesky_residual(spd_dense(N, TILE), L)
        print(f"residual ‖A − LLᵀ‖/‖A‖ = {residual:.2e}", "(ok)" if residual < 1e-12 else "(BAD)")
        """
    ),
    md("The figures of the run, as data:"),
    code(
        """
        summary = run.trace.summary()
        print(f"makespan       {summary['makespan'] * 1e3:8.2f} ms")
        print(f"critical path  {summary['critical_path'] * 1e3:8.2f} ms")
        print(f"bytes sent     {np.sum(summary['bytes']):8d}")
        """
    ),
    md("## Close the cluster\n\nThis stops the engines and the controller."),
    code("cluster.close()"),
]


# -- 02 ---------------------------------------------------------------------------------

CHOLESKY = [
    md(
        """
        # 02 · Tiled Cholesky

        The right-looking tiled Cholesky factorisation A = LLᵀ on MPI ranks:

        * one run with the **live timeline**,
        * a **tile-size sweep** (GFLOP/s for each tile size),
        * a **strong-scaling** table (the same matrix on 1, 2, … ranks), and
        * an **export** of the trace to Chrome/Perfetto JSON and a standalone HTML report.

        Timings on a shared machine are noisy: every figure is the best of a few runs.
        """
    ),
    setup(
        config="cores, quick",
        imports="""
        from taskgraph.dsl.tiled import spd_dense
        from taskgraph.linalg import cholesky, cholesky_flops, cholesky_residual
        """,
        sizes="""
        N, TILE = (512, 128) if QUICK else (8192, 512)
        SWEEP_N, TILES = (1024, (64, 128, 256)) if QUICK else (8192, (256, 512, 1024, 2048))
        RANKS = [k for k in (1, 2, 4, 8) if k <= max(2, cores())]  # not more ranks than cores
        REPEAT = 2 if QUICK else 3
        """,
    ),
    code(
        """
        cluster = tg.Cluster(n=2)
        print(cluster)
        print(f"kernels compiled on every engine in {cluster.compile():.1f} s")
        """
    ),
    md(
        """
        ## One run, watched live

        The timeline has a lane per rank and worker, tasks coloured by kernel and messages
        drawn between ranks; below it, the communication matrix and each rank's
        utilisation.
        """
    ),
    code(
        """
        A = tg.TiledMatrix.random_spd(N, tile=TILE, cluster=cluster)
        run = cluster.run(cholesky(A))
        run.show()
        run.wait()
        gflops = cholesky_flops(N) / run.seconds / 1e9
        print(f"n={N} tile={TILE}: {run.seconds:.3f} s, {gflops:.2f} GFLOP/s")
        residual = cholesky_residual(spd_dense(N, TILE), np.tril(A.gather()))
        print(f"residual {residual:.1e}", "(ok)" if residual < 1e-12 else "(BAD)")
        """
    ),
    md(
        """
        ## Tile-size sweep

        Small tiles give many tasks (more parallelism, more scheduling and messages per
        flop); big tiles give few, fast BLAS calls but leave ranks idle at the end. Each
        run factorises a fresh matrix (a run overwrites its matrix with L).
        """
    ),
    code(
        """
        def best_seconds(c, n, tile, repeat=REPEAT, **run_kw):
            \"\"\"Best time of `repeat` Cholesky runs of a fresh n x n matrix on cluster c.\"\"\"
            best = float("inf")
            for _ in range(repeat):
                M = tg.TiledMatrix.random_spd(n, tile=tile, cluster=c)
                best = min(best, c.run(cholesky(M), **run_kw).wait().seconds)
                del M  # frees its tiles on the engines
            return best


        def print_table(header, rows):
            \"\"\"A plain text table: right-aligned columns.\"\"\"
            cells = [header] + [[str(x) for x in row] for row in rows]
            widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
            for r in cells:
                print("  ".join(x.rjust(w) for x, w in zip(r, widths)))


        rows = []
        for tile in TILES:
            nt = -(-SWEEP_N // tile)
            seconds = best_seconds(cluster, SWEEP_N, tile)
            gflops = cholesky_flops(SWEEP_N) / seconds / 1e9
            tasks = nt * (nt + 1) * (nt + 2) // 6
            rows.append([tile, f"{nt}x{nt}", tasks, f"{seconds:.3f}", f"{gflops:.2f}"])
        print(f"tile-size sweep, n={SWEEP_N}, {cluster.size} ranks, best of {REPEAT}")
        print_table(["tile", "tiles", "tasks", "seconds", "GFLOP/s"], rows)
        """
    ),
    md(
        """
        ## Strong scaling

        The same matrix on 1, 2, … ranks, one worker thread per rank, so that *k* ranks use
        *k* cores. A notebook cluster has a fixed number of engines: for each rank count
        other than this cluster's, a cluster of that size is started and closed again.
        (With `TASKGRAPH_QUICK=1` the matrix is far too small to gain from a second rank.)
        """
    ),
    code(
        """
        rows = []
        base = None
        for k in RANKS:
            c = cluster if k == cluster.size else tg.Cluster(n=k)
            try:
                seconds = best_seconds(c, N, TILE, workers=1)
            finally:
                if c is not cluster:
                    c.close()
            if base is None:  # the 1-rank time: RANKS starts at 1
                base = seconds
            gflops = cholesky_flops(N) / seconds / 1e9
            speedup = base / seconds
            row = [k, f"{seconds:.3f}", f"{gflops:.2f}", f"{speedup:.2f}", f"{speedup / k:.0%}"]
            rows.append(row)
        print(f"strong scaling, n={N}, tile={TILE}, 1 worker per rank, best of {REPEAT}")
        print_table(["ranks", "seconds", "GFLOP/s", "speed-up", "efficiency"], rows)
        """
    ),
    md(
        """
        ## Export to Perfetto

        `run.trace.to_chrome(path)` writes Chrome trace-event JSON: open it at
        <https://ui.perfetto.dev> (a process per rank, a thread per worker, a "network"
        thread with the messages). `to_html` writes a standalone report with the widget's
        views, and `tg.Trace.load` reads a trace back. The files go to `out/` beside the
        notebook.
        """
    ),
    code(
        """
        from pathlib import Path

        out = Path("out")
        out.mkdir(exist_ok=True)
        chrome = run.trace.to_chrome(out / "cholesky.trace.json")
        report = run.trace.to_html(out / "cholesky.html")
        print("wrote", chrome, "and", report)

        back = tg.Trace.load(chrome)
        print("loaded back:", back)
        print(f"makespan {back.summary()['makespan'] * 1e3:.2f} ms")
        """
    ),
    code("cluster.close()"),
]


# -- 03 ---------------------------------------------------------------------------------

PLACEMENT = [
    md(
        """
        # 03 · Placement and communication

        Tasks run where the tile they write lives ("owner computes"), so the way tiles
        are dealt to ranks decides which tasks run where and which tiles must travel.
        Here the same Cholesky graph runs under three distributions of the matrix:

        * **2-D block-cyclic** over the most square P×Q grid (ScaLAPACK's choice),
        * **1-D** column block-cyclic over a 1×P grid,
        * **random**: a seeded, balanced random owner for each tile,

        and we compare makespan, communication matrix and critical path side by side.
        On 2 ranks the most square grid *is* 1×2, so the first two coincide there: the
        plan-only preview at the end shows how they differ on 4 ranks.
        """
    ),
    setup(
        config="cores, quick",
        imports="""
        from taskgraph.linalg import cholesky, cholesky_flops
        """,
        sizes="""
        N, TILE = (1024, 128) if QUICK else (8192, 512)
        NRANKS = 2 if QUICK else max(2, min(4, cores()))
        PLACEMENTS = {"2-D block-cyclic": "2d", "1-D": "1d", "random": "random"}
        """,
    ),
    code(
        """
        cluster = tg.Cluster(n=NRANKS)
        print(cluster)
        print(f"kernels compiled on every engine in {cluster.compile():.1f} s")
        """
    ),
    md("## Three runs of the same graph, watched live"),
    code(
        """
        runs = {}
        for name, distribution in PLACEMENTS.items():
            A = tg.TiledMatrix.random_spd(N, tile=TILE, cluster=cluster, distribution=distribution)
            print(name, "->", A)
            runs[name] = run = cluster.run(cholesky(A, name=f"cholesky ({name})"))
            run.show()
            run.wait()
            del A
        """
    ),
    md(
        """
        ## Side by side

        From each run's `trace.summary()`: the makespan, the critical path measured on the
        tasks' real durations (and how many of its steps cross ranks, each a message on
        the critical path), the bytes moved, and how each rank spent its time.
        """
    ),
    code(
        """
        def mib(nbytes):
            return f"{nbytes / 2**20:.2f} MiB"


        def column(run):
            s = run.trace.summary()
            path = run.trace.critical["tasks"]
            owner = run.plan.placement
            hops = sum(owner[a] != owner[b] for a, b in zip(path, path[1:]))
            util = s["utilisation"]
            wall = sum(u["wall"] for u in util)
            return {
                "makespan": f"{s['makespan'] * 1e3:.1f} ms",
                "GFLOP/s": f"{cholesky_flops(N) / run.seconds / 1e9:.2f}",
                "critical path": f"{s['critical_path'] * 1e3:.1f} ms",
                "critical path / makespan": f"{s['critical_path_fraction']:.0%}",
                "tasks on critical path": str(len(path)),
                "rank changes on it": str(hops),
                "messages": str(int(np.sum(s["messages"]))),
                "bytes moved": mib(np.sum(s["bytes"])),
                "computing": f"{sum(u['compute'] for u in util) / wall:.0%}",
                "waiting on comm.": f"{sum(u['comm'] for u in util) / wall:.0%}",
                "idle": f"{sum(u['idle'] for u in util) / wall:.0%}",
                "tasks per rank": "/".join(map(str, np.bincount(owner, minlength=cluster.size))),
            }


        def side_by_side(columns):
            \"\"\"Print {column name: {row name: text}} as one table, one column each.\"\"\"
            names = list(columns)
            rows = list(next(iter(columns.values())))
            left = max(len(r) for r in rows)
            widths = [max(len(n), *(len(columns[n][r]) for r in rows)) for n in names]
            print(" " * left, *(n.rjust(w) for n, w in zip(names, widths)), sep="  ")
            for r in rows:
                cells = (columns[n][r].rjust(w) for n, w in zip(names, widths))
                print(r.ljust(left), *cells, sep="  ")


        print(f"Cholesky n={N}, tile={TILE}, on {cluster.size} ranks")
        side_by_side({name: column(run) for name, run in runs.items()})
        """
    ),
    md("## Communication matrices\n\nBytes sent from each rank (row) to each rank (column)."),
    code(
        """
        for name, run in runs.items():
            print(f"{name}:")
            for r, row in enumerate(run.trace.summary()["bytes"]):
                print(f"  from rank {r}:", "  ".join(f"{mib(b):>11}" for b in row))
        """
    ),
    md(
        """
        ## What 4 ranks would do: the plan alone

        `graph.preview(ranks=4)` places the graph on 4 ranks (each matrix keeps its kind
        of distribution, re-dealt) and counts the messages the plan implies — nothing
        runs, so this works for any rank count. With 4 ranks the 2-D grid is 2×2 and the
        difference from 1×4 shows.
        """
    ),
    code(
        """
        predicted = {}
        for name, run in runs.items():
            p = run.graph.preview(ranks=4)
            predicted[name] = {
                "messages": str(p.total_messages),
                "bytes moved": mib(p.total_bytes),
                "tasks per rank": "/".join(map(str, p.tasks)),
            }
        print(f"predicted on 4 ranks, n={N}, tile={TILE}")
        side_by_side(predicted)
        """
    ),
    md("The preview draws the DAG too, each task coloured by the rank that would run it:"),
    code(
        """
        runs["2-D block-cyclic"].graph.preview(ranks=4)
        """
    ),
    code("cluster.close()"),
]


# -- 04 ---------------------------------------------------------------------------------

MANY_TASKS = [
    md(
        """
        # 04 · Many small Python tasks

        An ensemble: 1,000 independent simulations — each a seeded 2-D random walk in
        NumPy — then a reduction tree that adds their results up. Plain Python functions
        become tasks with `@tg.task`; independent tasks are spread over the ranks, and
        each addition runs where most of its inputs already are.

        For a random walk of *s* unit-variance steps per axis, the mean squared
        end-to-end distance is ⟨r²⟩ = 2*s*: the ensemble mean should come within a
        standard error or two.
        """
    ),
    setup(
        """
        NSIM = 1000  # always 1,000 tasks; QUICK only shortens each walk
        STEPS = 1_000 if QUICK else 200_000
        """
    ),
    code(
        """
        cluster = tg.Cluster(n=2)
        cluster
        """
    ),
    code(
        """
        @tg.task
        def simulate(seed, steps):
            \"\"\"Squared end-to-end distance of a seeded 2-D random walk.\"\"\"
            rng = np.random.default_rng(seed)
            end = rng.standard_normal((steps, 2)).cumsum(axis=0)[-1]
            return float(end @ end)


        @tg.task
        def add(a, b):
            return a + b


        def tree_sum(values):
            \"\"\"Add in pairs, level by level (depth log2 n): value i with value i + n/2.

            Independent tasks are dealt round-robin, so while n/2 is even, i and i + n/2
            are on the same rank and a level adds without any message.
            \"\"\"
            while len(values) > 1:
                half = len(values) // 2
                pairs = [add(a, b) for a, b in zip(values[:half], values[half : 2 * half])]
                values = pairs + values[2 * half :]
            return values[0]


        with tg.Graph("ensemble") as g:
            total = tree_sum([simulate(seed, STEPS) for seed in range(NSIM)])

        print(g)
        """
    ),
    code(
        """
        run = cluster.run(g)
        run.show()
        run.wait()
        msd = total.result() / NSIM
        se = 2 * STEPS / np.sqrt(NSIM)  # r² is 2·STEPS times an Exp(1) variable: sd = mean
        print(f"{NSIM} walks of {STEPS} steps: <r^2> = {msd:.1f} (theory {2 * STEPS} ± {se:.0f})")
        print(f"{g.ntasks} tasks in {run.seconds:.3f} s")
        """
    ),
    md(
        """
        Outside a graph, task functions simply run: the same tree, computed here in the
        notebook, must give the same sum.
        """
    ),
    code(
        """
        expected = tree_sum([simulate(seed, STEPS) for seed in range(NSIM)])
        ok = np.isclose(total.result(), expected, rtol=1e-12)
        verdict = "(ok)" if ok else "(MISMATCH)"
        print(f"reduction: {total.result():.6g}, in the notebook: {expected:.6g}", verdict)
        """
    ),
    md(
        """
        ## Where the time went

        Each rank's wall time (times its workers) splits into computing tasks, waiting on
        communication (a ready task needed a message), idle (no task was ready), and
        runtime overhead (the scheduler itself). With tasks this small, overhead shows.
        """
    ),
    code(
        """
        s = run.trace.summary()
        tasks_on = np.bincount(run.plan.placement, minlength=cluster.size)
        print(f"utilisation breakdown, {s['tasks']} tasks, makespan {s['makespan'] * 1e3:.1f} ms")
        print("rank  tasks   wall s  computing    comm    idle  overhead")
        for u in s["utilisation"]:
            w = u["wall"] or 1.0
            parts = [u["compute"] / w, u["comm"] / w, u["idle"] / w, u["overhead"] / w]
            print(
                f"{u['rank']:>4}  {tasks_on[u['rank']]:>5}  {u['wall']:>7.3f}  "
                + "  ".join(f"{x:>{n}.0%}" for x, n in zip(parts, (9, 6, 6, 8)))
            )
        print(f"messages between ranks: {int(np.sum(s['messages']))}")
        """
    ),
    md(
        """
        ## An ensemble that fails sometimes

        Real ensembles mix Python with programs, and some members fail. Below, each
        member is a shell pipeline that writes its output file (`tg.shell`), read back by
        a Python task. Every fifth member's reader hits a "flaky file system" on its first
        attempt (`retries=2` runs it again), and one member's program is broken for good:
        with `on_failure="ignore"` its reader gets the exception as its input, passes it
        on, and the reduction leaves it out (`"skip"` would skip all that follows it).
        The run keeps each finished call's value in a checkpoint directory, so making the
        same run again (say, after the job was killed) does nothing twice.
        """
    ),
    code(
        """
        import pathlib
        import shutil

        work = pathlib.Path("ensemble-work").resolve()  # an absolute path: engines share it
        work.mkdir(exist_ok=True)
        for old in work.glob("tried-*"):
            old.unlink()
        shutil.rmtree(work / "checkpoint", ignore_errors=True)  # (a fresh start each time)
        BROKEN = 7  # this member's program exits with code 3


        @tg.task(retries=2)
        def read_member(result, seed, work):
            \"\"\"The member's number from its output file (the first attempt of every fifth
            member fails, as a busy shared file system sometimes does).\"\"\"
            if isinstance(result, Exception):
                return result  # the member failed: pass its error on
            marker = pathlib.Path(work) / f"tried-{seed}"
            if seed % 5 == 0 and not marker.exists():
                marker.touch()
                raise OSError(f"member {seed}: stale file handle")
            return float(pathlib.Path(str(result)).read_text())


        @tg.task(on_failure="ignore")
        def member(seed, work):
            \"\"\"One member: a program (here a shell pipeline) that writes its output file.\"\"\"
            out = pathlib.Path(work) / f"member-{seed}.txt"
            pipeline = "seq 1 {n} | awk '{{s += $1 % 7}} END {{print s}}'"
            cmd = "exit 3" if seed == BROKEN else pipeline
            return tg.shell(cmd, n=1000 * (seed + 1), stdout=out)


        @tg.task
        def total(values):
            ok = [v for v in values if not isinstance(v, Exception)]
            return sum(ok), len(values) - len(ok)


        with tg.Graph("sweep") as sweep:
            reads = [read_member(member(s, str(work)), s, str(work)) for s in range(24)]
            answer = total(reads)

        run = cluster.run(sweep, checkpoint=work / "checkpoint")
        run.wait()
        value, left_out = answer.result()
        print(f"sum over the members: {value:.0f} ({left_out} left out)")
        run.summary()
        """
    ),
    md(
        """
        `member` runs `tg.shell` on its worker (an executable inside a Python task; in a
        graph, `tg.shell(...)` is a task of its own). The summary counts the retries,
        and the broken member as failed, with its command, exit code and stderr.

        Making the same run again reads every finished call from the checkpoint:
        """
    ),
    code(
        """
        again = cluster.run(sweep, checkpoint=work / "checkpoint")
        again.wait()
        assert again.result(answer) == (value, left_out)
        again.summary()
        """
    ),
    md(
        """
        Where each call's time went, as RADICAL-Pilot breaks it down (waiting for a
        core, launching, running), and what each core did over the first run:
        """
    ),
    code(
        """
        o = run.trace.overheads()
        print("median seconds:", {k: round(v, 4) for k, v in o["median"].items()})
        cores = run.trace.core_utilisation()
        print({k: v for k, v in cores.items() if k != "lanes"})
        """
    ),
    code("cluster.close()"),
]

# -- 06 ---------------------------------------------------------------------------------

DYNAMIC = [
    md(
        """
        # 06 · Tasks that make tasks

        The graphs of 01–04 are known in full before they run. Many computations are not:
        a search tree unfolds as it is walked, and an adaptive ensemble picks its next
        members from the results so far. Here:

        1. **recursion**: a task spawns tasks (`tg.spawn`) and waits for them, at any depth;
        2. **work stealing**: a rank that runs out of work takes the oldest waiting call of
           another rank (nearest the root: the most work), and the result goes back;
        3. **errors** in a spawned call reach the task that waits for it;
        4. **calls added to a running run** from the notebook (`run.submit`,
           `tg.as_completed`);
        5. **two runs in flight** on one cluster.

        The leaves are numba functions (`nogil`): the recursion above them is Python.
        """
    ),
    setup(
        """
        FIB_N, CUTOFF = (36, 26) if QUICK else (40, 28)  # fib(n), leaves at n <= CUTOFF
        QUEENS = 11 if QUICK else 14  # N-Queens: the board's size
        SEARCH = 14 if QUICK else 15  # ... of the search that runs beside the analytics
        SCORE_SECONDS, BUDGET = (0.005, 40) if QUICK else (0.05, 120)  # the adaptive search
        """,
        stdlib="import time",
        numba=True,
    ),
    code(
        """
        cluster = tg.Cluster(n=2)
        cluster
        """
    ),
    md(
        """
        ## Recursion: fib with a cutoff

        `tg.spawn(f, *args)` starts a call and returns its future at once; `.result()`
        waits for it. A waiting worker is not idle: it runs other spawned calls
        meanwhile (its own children first), so deep recursion needs no extra threads.
        Below the cutoff a call is one numba leaf.
        """
    ),
    code(
        """
        @numba.njit(nogil=True)
        def fib_leaf(n):
            return n if n < 2 else fib_leaf(n - 1) + fib_leaf(n - 2)


        @tg.task
        def fib(n, cutoff):
            if n <= cutoff:
                return fib_leaf(n)
            a = tg.spawn(fib, n - 1, cutoff)  # may run on another rank
            b = fib(n - 2, cutoff)  # this half runs here
            return a.result() + b


        with tg.Graph("fib") as g:
            f = fib(FIB_N, CUTOFF)

        cluster.run(g).wait()  # the first run compiles the leaf on each engine
        run = cluster.run(g)
        run.show()
        run.wait()

        fib_leaf(CUTOFF)  # (compiles it here)
        t0 = time.perf_counter()
        serial = fib_leaf(FIB_N)
        serial_s = time.perf_counter() - t0
        verdict = "(ok)" if f.result() == serial else "(MISMATCH)"
        print(f"fib({FIB_N}) = {f.result()} {verdict}")
        print(f"{run.seconds:.3f} s on {cluster.size} ranks, serial {serial_s:.3f} s")
        """
    ),
    md(
        """
        ## An uneven search: N-Queens

        How many ways can *n* queens stand on an *n*×*n* board with none attacking
        another? Each task places a queen on the next row, once for every safe column,
        and spawns a task for each; after three rows a numba leaf counts the rest.
        Subtrees differ a lot in size, so a split made in advance leaves a rank idle;
        here idle ranks steal. The live view draws each steal as a line between lanes.
        """
    ),
    code(
        """
        @numba.njit(nogil=True)
        def queens_leaf(n, cols, left, right):
            \"\"\"Solutions below a partial board: ``cols`` marks the columns taken,
            ``left`` and ``right`` the diagonals attacked on the next row (bit masks).\"\"\"
            full = (1 << n) - 1
            if cols == full:
                return 1
            count = 0
            free = full & ~(cols | left | right)
            while free:
                bit = free & -free
                free ^= bit
                count += queens_leaf(n, cols | bit, ((left | bit) << 1) & full, (right | bit) >> 1)
            return count


        @tg.task
        def queens(n, cols=0, left=0, right=0, rows=3):
            if rows == 0:
                return queens_leaf(n, cols, left, right)
            full = (1 << n) - 1
            free = full & ~(cols | left | right)
            children = []
            while free:
                bit = free & -free
                free ^= bit
                below = (n, cols | bit, ((left | bit) << 1) & full, (right | bit) >> 1, rows - 1)
                children.append(tg.spawn(queens, *below))
            return sum(tg.wait(children))


        with tg.Graph("queens") as g:
            q = queens(QUEENS)

        cluster.run(g).wait()  # (compiles the leaf on each engine)
        run = cluster.run(g)
        run.show()
        run.wait()
        verdict = "(ok)" if q.result() == queens_leaf(QUEENS, 0, 0, 0) else "(MISMATCH)"
        print(f"{QUEENS}-Queens: {q.result()} solutions {verdict}")
        """
    ),
    md(
        """
        What the ranks did: how many calls were spawned and stolen, how long a steal took
        from request to arrival, and each rank's time computing and looking for work.
        """
    ),
    code(
        """
        d = run.trace.dynamic()
        print(f"spawned calls: {d['spawned']}, steals: {d['steals']}, pushes: {d['pushes']}")
        if d["steals"]:
            print(f"median steal latency: {d['steal_latency_median'] * 1e6:.0f} us")
        print("rank  computing  stealing  idle")
        for u in run.trace.utilisation():
            w = u["wall"] or 1.0
            shares = (u["compute"] / w, u["stealing"] / w, u["idle"] / w)
            print(f"{u['rank']:>4}  {shares[0]:>9.0%}  {shares[1]:>8.1%}  {shares[2]:>4.0%}")
        """
    ),
    md(
        """
        ## Errors in spawned calls

        A spawned call that raises fails its future; `.result()` raises a
        `tg.SpawnedTaskError` that is also of the error's own class, so the waiting task
        can catch it as usual. It names the call and the rank where it failed;
        `e.original` is the first exception of the chain and `e.traceback` the remote
        traceback. An error that nobody catches fails the run on every rank.
        """
    ),
    code(
        """
        @tg.task
        def step(depth):
            \"\"\"A chain of spawned calls; the deepest one fails.\"\"\"
            if depth == 0:
                raise ValueError("negative pressure")
            return tg.spawn(step, depth - 1).result()


        @tg.task
        def careful():
            try:
                return tg.spawn(step, 3).result()
            except ValueError as e:  # a SpawnedTaskError of class ValueError too
                return f"{e.task} failed on rank {e.rank}; first error: {e.original!r}"


        with tg.Graph("careful") as g:
            c = careful()
        cluster.run(g).wait()
        print("caught:", c.result())
        """
    ),
    md(
        """
        ## Adding calls while a run goes: an adaptive search

        `cluster.run(open=True)` starts a run that takes calls from the notebook:
        `run.submit(f, *args)` returns a future at once, and `tg.as_completed(futures)`
        yields them as they end. Each "simulation" below scores a parameter *x*; every
        result that beats the best so far gets two new members beside it, closer and
        closer, until the budget is spent. `run.wait()` closes the run.

        (In a batch job every rank runs each cell: there rank 0 submits, and the other
        ranks take submitted calls as they take spawned ones.)
        """
    ),
    code(
        """
        def score(x):
            \"\"\"A simulation at parameter x: some work, then its cost (lower is better).\"\"\"
            time.sleep(SCORE_SECONDS)
            return float((x - 0.3) ** 2 + 0.05 * np.sin(25 * x))


        run = cluster.run(open=True)
        if cluster.rank in (None, 0):  # None: the notebook; in a batch job, rank 0
            rng = np.random.default_rng(1)
            params = {run.submit(score, x): x for x in rng.uniform(0, 1, 8)}
            best, ran, width = (np.inf, None), 0, 0.05
            while params and ran < BUDGET:
                new = {}
                for fut in tg.as_completed(list(params)):
                    x, y = params[fut], fut.result()
                    ran += 1
                    if y < best[0]:
                        best = (y, x)
                        for x2 in (x - width, x + width):
                            new[run.submit(score, x2)] = x2
                params, width = new, width / 2
            run.wait()
            print(f"adaptive search: {ran} calls, best score {best[0]:.4f} at x = {best[1]:.4f}")
        else:
            run.wait()
        """
    ),
    md(
        """
        ## Two runs in flight

        A new run starts at once beside one that goes on: its messages never mix with
        the other's, and a failure of one leaves the other running. Here a small
        analysis runs while the search goes, as analytics of one iteration can run
        while the next computes.
        """
    ),
    code(
        """
        @tg.task
        def describe(values):
            return float(np.mean(values)), float(np.std(values))


        with tg.Graph("search") as big:
            q = queens(SEARCH)
        with tg.Graph("analytics") as small:
            stats = describe(np.arange(1000.0))

        search = cluster.run(big)
        analytics = cluster.run(small)  # does not wait for the search
        analytics.wait()
        state = "was still running" if not search.done() else "had ended"
        mean = stats.result()[0]
        print(f"analytics: mean {mean:.1f}, in {analytics.seconds:.3f} s; the search {state}")
        search.wait()
        print(f"{SEARCH}-Queens: {q.result()} solutions in {search.seconds:.3f} s")
        """
    ),
    code("cluster.close()"),
]


NOTEBOOKS = {
    "01-quickstart": QUICKSTART,
    "02-tiled-cholesky": CHOLESKY,
    "03-placement-and-communication": PLACEMENT,
    "04-many-tasks": MANY_TASKS,
    "06-dynamic-tasks": DYNAMIC,
}


def build() -> dict[str, nbformat.NotebookNode]:
    """Every generated notebook, by name (without ``.ipynb``), outputs stripped."""
    out = {}
    for name, cells in NOTEBOOKS.items():
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
            "name": "python3",
        }
        nb.metadata["language_info"] = {"name": "python"}
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: regenerating changes nothing
        nbformat.validate(nb)
        out[name] = nb
    return out


def main() -> None:
    for name, nb in build().items():
        path = HERE / f"{name}.ipynb"
        nbformat.write(nb, path)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
