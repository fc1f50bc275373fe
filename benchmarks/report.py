"""The suite's report: ``results/README.md`` (Markdown tables) and PNG plots.

    python -m benchmarks report [--out DIR]

Reads the ``<suite>.json`` files that ``python -m benchmarks all`` wrote and nothing
else, so a report can be rebuilt (or restyled) without measuring again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

Row = dict


def load(out: Path) -> list[Row]:
    rows: list[Row] = []
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        rows += data if isinstance(data, list) else [data]
    return rows


def of(rows: list[Row], kind: str) -> list[Row]:
    return [r for r in rows if r.get("benchmark") == kind]


def table(rows: Sequence[Row], columns: Sequence[tuple[str, str | Callable[[Row], object]]]) -> str:
    """A Markdown table: each column is (heading, key or function of the row)."""
    if not rows:
        return "_(not measured)_\n"
    head = "| " + " | ".join(h for h, _ in columns) + " |"
    rule = "| " + " | ".join("---:" if i else "---" for i in range(len(columns))) + " |"
    lines = [head, rule]
    for r in rows:
        cells = []
        for _, get in columns:
            v = get(r) if callable(get) else r.get(get)
            cells.append(_fmt(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return " / ".join(_fmt(x) for x in v)
    return str(v)


def config(r: Row) -> str:
    label = f"{r.get('ranks')}×{r.get('workers_per_rank', r.get('workers', 1))}"
    return label + (" (oversubscribed)" if r.get("oversubscribed") else "")


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


# -- sections ----------------------------------------------------------------------------


def machine_section(rows: list[Row]) -> str:
    m = next((r["machine"] for r in rows if "machine" in r), None)
    if not m:
        return ""
    return "Machine: " + ", ".join(f"{k} {v}" for k, v in m.items() if k != "env") + "\n"


def targets_section(rows: list[Row]) -> str:
    out = ["| target | goal | measured | |", "| --- | --- | --- | --- |"]
    for t in of(rows, "cholesky_targets"):
        dt = "f64" if t["dtype"] == "float64" else "f32"
        for key, label, sign in (
            ("fraction_of_peak_1x2", f"Cholesky n=8192 {dt}, 1 × 2, fraction of in-run peak", "≥"),
            ("fraction_of_peak_2x1", f"Cholesky n=8192 {dt}, 2 × 1, fraction of in-run peak", "≥"),
            ("fraction_of_peak", f"Cholesky n=8192 {dt}, fraction of in-run peak", "≥"),  # (older)
            ("seconds_2x1_over_1x2", "… time at 2 × 1 against 1 × 2", "≤"),
            ("vs_lapack", "… against scipy LAPACK (2 BLAS threads)", "≥"),
            ("vs_lapack_any_threads", "… against LAPACK at its better thread count", "≥"),
            ("vs_dask", "… against dask.array (threaded, best chunk)", "≥"),
        ):
            g = t.get(key)
            if g is not None:
                out.append(f"| {label} | {sign} {g['target']} | {g['value']} | {met(g['ok'])} |")
        rss = t["rss"]
        out.append(
            f"| peak RSS per rank ≤ 1.5 × matrix share + 400 MiB | | "
            f"{_fmt(rss['value']['peak_rss_mib'])} MiB (limit "
            f"{_fmt(rss['value']['limit_mib'])}) | {met(rss['ok'])} |"
        )
    for t in of(rows, "overhead_targets"):
        out.append(
            f"| scheduler overhead, 1 rank | ≤ {t['target_run_us_per_task_1rank']} µs/task | "
            f"{t['worst_run_us_per_task_1rank']} (worst shape) | "
            f"{met(t['worst_run_us_per_task_1rank'] <= t['target_run_us_per_task_1rank'])} |"
        )
        two = t.get("worst_run_us_per_task_1rank_2workers")
        if two is not None:
            out.append(
                f"| … with 2 workers (the default on 2 cores), 50,000 tasks | "
                f"≤ {t['target_run_us_per_task_1rank']} µs/task | {two} (worst shape) | "
                f"{met(two <= t['target_run_us_per_task_1rank'])} |"
            )
        out.append(
            f"| … against dask threaded | ≥ {t['target_vs_dask_threaded']}× less | "
            f"{t['least_vs_dask_threaded_1rank']}× (least) | "
            f"{met(t['least_vs_dask_threaded_1rank'] >= t['target_vs_dask_threaded'])} |"
        )
    for t in of(rows, "comm_targets"):
        lat_ok = t["worst_small_latency_ratio"] <= t["target_small_latency_ratio"]
        bw_ok = t["worst_large_bandwidth_fraction"] >= t["target_large_bandwidth_fraction"]
        out.append(
            f"| small-message latency against raw mpi4py | ≤ "
            f"{t['target_small_latency_ratio']}× | {t['worst_small_latency_ratio']}× (worst) | "
            f"{met(lat_ok)} |"
        )
        out.append(
            f"| bandwidth ≥ 1 MiB against raw mpi4py | ≥ "
            f"{t['target_large_bandwidth_fraction']} | {t['worst_large_bandwidth_fraction']} "
            f"(worst) | {met(bw_ok)} |"
        )
    for r in of(rows, "graphsize"):
        if r.get("size", r["tasks"]) >= 10**6:
            out.append(
                f"| {r['shape']} graph of {r['tasks']:,} tasks built and planned | ≤ 10 s, "
                f"≤ 1 KiB/task | {r['total_s']} s, {r['bytes_per_task']} B/task | "
                f"{met(r['target_ok'])} |"
            )
    for r in of(rows, "tracing_cost"):
        out.append(
            f"| tracing cost (Cholesky n={r['n']}, {r['ranks']} ranks) | ≤ 3 % | "
            f"{(1 - r['ratio_on_over_off']) * 100:.1f} % | "
            f"{met(r['ratio_on_over_off'] >= 0.97)} |"
        )
    return "\n".join(out) + "\n" if len(out) > 2 else ""


def cholesky_section(rows: list[Row]) -> str:
    runs = sorted(
        of(rows, "cholesky"),
        key=lambda r: (r["dtype"], r["n"], r["tile"], r["ranks"], r.get("workers_per_rank", 1)),
    )
    s = "### Tiled Cholesky\n\nEvery run (best of its repeats):\n\n"
    s += table(
        runs,
        [
            ("dtype", "dtype"),
            ("n", "n"),
            ("tile", "tile"),
            ("ranks × workers", config),
            ("seconds", "seconds"),
            ("GFLOP/s", "gflops"),
            ("GEMM peak", "gemm_peak_gflops"),
            ("fraction", "fraction_of_peak"),
            ("peak RSS MiB", "peak_rss_mib"),
            ("RSS ok", "rss_target_ok"),
        ],
    )
    s += "\nAgainst the baselines (best taskgraph run at each n):\n\n"
    s += table(
        of(rows, "cholesky_baseline"),
        [
            ("dtype", "dtype"),
            ("n", "n"),
            ("taskgraph GFLOP/s", "taskgraph_gflops"),
            (
                "best run",
                lambda r: "tile {tile}, {ranks}×{workers_per_rank}".format(**r["taskgraph_best"]),
            ),
            ("fraction of peak", "fraction_of_peak"),
            ("LAPACK 2 thr", "lapack_gflops"),
            ("LAPACK 1 thr", "lapack_1_thread_gflops"),
            ("dask (chunk)", lambda r: f"{r['dask_gflops']} ({r['dask_chunk']})"),
            ("vs LAPACK", "vs_lapack"),
            ("vs LAPACK any", "vs_lapack_any_threads"),
            ("vs dask", "vs_dask"),
        ],
    )
    for kind, title in (("cholesky_strong", "Strong scaling"), ("cholesky_weak", "Weak scaling")):
        s += f"\n{title} (1 worker per rank; ranks beyond the cores are oversubscribed):\n\n"
        cols = [
            ("ranks", config),
            ("n", "n"),
            ("seconds", "seconds"),
            ("GFLOP/s", "gflops"),
            ("fraction of peak", "fraction_of_peak"),
        ]
        if kind == "cholesky_strong":
            cols.append(("speedup", "speedup"))
        cols.append(("efficiency", "efficiency"))
        s += table(of(rows, kind), cols)
    return s


def tiles_section(rows: list[Row]) -> str:
    if not of(rows, "tiles"):
        return ""
    s = "### Tile kernels alone, 1 thread, against the 1-thread GEMM peak\n\n"
    columns: list[tuple[str, str | Callable[[Row], object]]] = [("tile", "tile")]
    columns.append(("GEMM peak GFLOP/s", "gemm_peak_gflops"))
    for name in ("gemm", "syrk", "trsm", "potrf"):
        columns.append((f"{name} (fraction)", f"{name}_fraction_of_peak"))
    return s + table(of(rows, "tiles"), columns)


def overhead_section(rows: list[Row]) -> str:
    s = "### Scheduler overhead (empty tasks)\n\n"
    s += table(
        sorted(of(rows, "overhead"), key=lambda r: (r["ranks"], r["shape"], r["tasks"])),
        [
            ("shape", "shape"),
            ("tasks", "tasks"),
            ("ranks", config),
            ("run µs/task", "run_us_per_task"),
            ("build µs/task", "build_us_per_task"),
            ("plan µs/task", "plan_us_per_task"),
            ("dask sync µs", "dask_sync_us_per_task"),
            ("dask threaded µs", "dask_threaded_us_per_task"),
            ("× less than dask threaded", "vs_dask_threaded"),
            ("× less than dask sync", "vs_dask_sync"),
        ],
    )
    s += "\nDAGuE's micro-benchmark: Nb independent N×N GEMM tasks, 2 workers, 1 rank:\n\n"
    s += table(
        of(rows, "micro"),
        [
            ("N", "n"),
            ("Nb", "nb"),
            ("task µs", "task_us"),
            ("sequential s", "seq_seconds"),
            ("ideal s", "ideal_seconds"),
            ("taskgraph s", "seconds"),
            ("efficiency (ideal / ours)", "efficiency"),
            ("overhead µs/task", "overhead_us_per_task"),
        ],
    )
    return s


def comm_section(rows: list[Row]) -> str:
    s = "### Communication: task-to-task ping-pong between 2 ranks\n\n"
    s += table(
        of(rows, "comm"),
        [
            ("bytes", "bytes"),
            ("latency µs", "latency_us"),
            ("raw mpi4py µs", "raw_latency_us"),
            ("latency ratio", "latency_ratio"),
            ("raw, polled µs", "raw_polled_us"),
            ("raw, NumPy arrays µs", "raw_numpy_us"),
            ("MiB/s", "bandwidth_mib_s"),
            ("raw MiB/s", "raw_bandwidth_mib_s"),
            ("bandwidth fraction", "bandwidth_fraction"),
            ("raw, one buffer µs", "raw_same_buffer_us"),
            ("fraction of one buffer", "bandwidth_fraction_same_buffer"),
        ],
    )
    s += "\nWhere a hop goes (`python -m benchmarks hops`, medians from the run's trace):\n\n"
    s += table(
        of(rows, "hops"),
        [
            ("bytes", "bytes"),
            ("hop µs", "hop_us"),
            ("raw µs", "raw_us"),
            ("task µs", "task_us"),
            ("receive → task start µs", "recv_to_start_us"),
            ("task end → send posted µs", "end_to_send_us"),
            ("send posted → received µs", "transfer_us"),
            ("polls/hop", "polls_per_hop"),
        ],
    )
    if of(rows, "cma"):
        s += (
            "\nWhy large messages move in one copy (`python -m benchmarks cma`, raw mpi4py): "
            "one-way µs of a ping-pong, blocking and polled with Python work between "
            "tests, with MPICH's cross-memory attach off and on:\n\n"
        )
        s += table(
            of(rows, "cma"),
            [
                ("bytes", "bytes"),
                ("single copy", "single_copy"),
                ("blocking µs", "blocking_us"),
                ("polled, 0 µs between tests", "polled_0us_us"),
                ("5 µs", "polled_5us_us"),
                ("20 µs", "polled_20us_us"),
                ("5 µs / blocking", "polled_5us_vs_blocking"),
            ],
        )
    if of(rows, "pages"):
        s += (
            "\nWhy tiles live on huge pages (`python -m benchmarks pages`, raw mpi4py): "
            "one-way µs of a two-buffer ping-pong on NumPy's arrays, on 4 KiB pages only, "
            "and on 2 MiB-aligned huge-page blocks as the runtime's tiles are:\n\n"
        )
        s += table(
            of(rows, "pages"),
            [
                ("bytes", "bytes"),
                ("NumPy arrays µs", "numpy_us"),
                ("4 KiB pages µs", "small_pages_us"),
                ("huge pages µs", "huge_pages_us"),
                (
                    "huge pages each rank got, NumPy / huge (MiB)",
                    lambda r: f"{r['numpy_anon_huge_mib']} / {r['huge_pages_anon_huge_mib']}",
                ),
                ("NumPy / huge", "huge_vs_numpy"),
            ],
        )
    if of(rows, "binding"):
        s += (
            "\nRanks bound to cores of their own (`python -m benchmarks binding`): runs of a "
            "1,000-hop 8 B chain in 2-rank jobs of MPICH's `mpiexec`, with "
            "`TASKGRAPH_BIND=0` (unbound) and by default (each rank binds itself); slow "
            "runs took more than twice the fastest:\n\n"
        )
        s += table(
            of(rows, "binding"),
            [
                ("TASKGRAPH_BIND", "bind"),
                ("CPUs of each rank", lambda r: r["bound_cpus"] if any(r["bound_cpus"]) else "all"),
                ("runs", "runs"),
                ("min ms", "min_ms"),
                ("median ms", "median_ms"),
                ("p90 ms", "p90_ms"),
                ("max ms", "max_ms"),
                ("slow runs", "slow_runs"),
            ],
        )
    return s


def graphsize_section(rows: list[Row]) -> str:
    s = "### Size of graphs: build and plan\n\n"
    s += table(
        of(rows, "graphsize"),
        [
            ("shape", "shape"),
            ("tasks", "tasks"),
            ("build s", "build_s"),
            ("plan s", "plan_s"),
            ("total s", "total_s"),
            ("µs/task", "us_per_task"),
            ("bytes/task held", "bytes_per_task"),
            ("peak bytes/task", "peak_bytes_per_task"),
        ],
    )
    return s


def tracing_section(rows: list[Row]) -> str:
    s = "### Tracing cost\n\n"
    s += table(
        of(rows, "tracing_cost"),
        [
            ("n", "n"),
            ("tile", "tile"),
            ("ranks", "ranks"),
            ("GFLOP/s traced", "gflops_tracing_on"),
            ("GFLOP/s untraced", "gflops_tracing_off"),
            ("ratio", "ratio_on_over_off"),
        ],
    )
    return s


# -- plots -------------------------------------------------------------------------------


CONFIG_COLOURS = {"1×1": "C4", "1×2": "C0", "2×1": "C1", "4×1": "C3"}


def plots(rows: list[Row], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra is not installed: tables only
        return []
    made = []

    base = {(r["n"], r["dtype"]): r for r in of(rows, "cholesky_baseline")}
    runs = of(rows, "cholesky")
    if runs:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
        for ax, dtype in zip(axes, ("float64", "float32")):
            here = [r for r in runs if r["dtype"] == dtype]
            if not here:
                ax.set_visible(False)
                continue
            sizes = sorted({r["n"] for r in here})
            for cfg in sorted({config(r) for r in here}):
                ns = sorted({r["n"] for r in here if config(r) == cfg and (r["n"], dtype) in base})
                if len(ns) < 2:
                    continue  # a scaling run at one size only: in the scaling plot
                best = [
                    max(r["gflops"] for r in here if r["n"] == n and config(r) == cfg) for n in ns
                ]
                colour = CONFIG_COLOURS.get(cfg.split(" ")[0], None)
                ax.plot(ns, best, "o-", color=colour, label=f"taskgraph {cfg} (best tile)")
            for key, label, style in (
                ("lapack_gflops", "scipy LAPACK, 2 threads", "s--"),
                ("dask_gflops", "dask.array, best chunk", "^--"),
            ):
                ns = [n for n in sizes if (n, dtype) in base]
                if ns:
                    colour = "grey" if key == "lapack_gflops" else "black"
                    ax.plot(ns, [base[n, dtype][key] for n in ns], style, color=colour, label=label)
            sizes = sorted({n for n in sizes if (n, dtype) in base}) or sizes
            peaks = [
                max((r["gemm_peak_gflops"] for r in here if r["n"] == n), default=0) for n in sizes
            ]
            ax.plot(sizes, peaks, ":", color="silver", label="GEMM peak (in-run)")
            ax.set_title(f"tiled Cholesky, {dtype}")
            ax.set_xlabel("n")
            ax.set_ylabel("GFLOP/s")
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "cholesky.png", dpi=110)
        plt.close(fig)
        made.append("cholesky.png")

    strong, weak = of(rows, "cholesky_strong"), of(rows, "cholesky_weak")
    if strong or weak:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for rows_, title, ax in (
            (strong, "strong scaling", axes[0]),
            (weak, "weak scaling", axes[1]),
        ):
            if not rows_:
                ax.set_visible(False)
                continue
            ranks = [r["ranks"] for r in rows_]
            ax.plot(ranks, [r["seconds"] for r in rows_], "o-", color="C0", label="time (s)")
            ax.set_xlabel("ranks (1 worker each; beyond the cores: oversubscribed)")
            ax.set_ylabel("seconds", color="C0")
            ax.set_xticks(ranks)
            ax2 = ax.twinx()
            ax2.plot(ranks, [r["gflops"] for r in rows_], "s--", color="C1", label="GFLOP/s")
            ax2.set_ylabel("GFLOP/s", color="C1")
            ns = sorted({r["n"] for r in rows_})
            ax.set_title(f"{title}, n = {', '.join(map(str, ns))}")
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=110)
        plt.close(fig)
        made.append("scaling.png")

    comm = sorted(of(rows, "comm"), key=lambda r: r["bytes"])
    if comm:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        size = [r["bytes"] for r in comm]
        axes[0].loglog(size, [r["latency_us"] for r in comm], "o-", label="taskgraph task→task")
        axes[0].loglog(size, [r["raw_latency_us"] for r in comm], "s--", label="raw mpi4py")
        axes[0].set_ylabel("one-way time (µs)")
        axes[1].semilogx(size, [r["bandwidth_mib_s"] for r in comm], "o-", label="taskgraph")
        axes[1].semilogx(size, [r["raw_bandwidth_mib_s"] for r in comm], "s--", label="raw")
        axes[1].set_ylabel("MiB/s")
        for ax in axes:
            ax.set_xlabel("message bytes")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "comm.png", dpi=110)
        plt.close(fig)
        made.append("comm.png")

    over = of(rows, "overhead")
    micro = sorted(of(rows, "micro"), key=lambda r: r["n"])
    if over or micro:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        if over:
            shapes = sorted({r["shape"] for r in over})
            biggest = {s: max(r["tasks"] for r in over if r["shape"] == s) for s in shapes}
            bars = {
                "taskgraph 1 rank": [
                    _pick(over, s, biggest[s], 1, "run_us_per_task") for s in shapes
                ],
                "taskgraph 2 ranks": [
                    _pick(over, s, biggest[s], 2, "run_us_per_task") for s in shapes
                ],
                "dask threaded": [
                    _pick(over, s, biggest[s], 1, "dask_threaded_us_per_task") for s in shapes
                ],
                "dask sync": [
                    _pick(over, s, biggest[s], 1, "dask_sync_us_per_task") for s in shapes
                ],
            }
            width = 0.2
            for k, (label, ys) in enumerate(bars.items()):
                xs = [i + (k - 1.5) * width for i in range(len(shapes))]
                axes[0].bar(xs, [y or 0 for y in ys], width, label=label)
            axes[0].set_xticks(range(len(shapes)), [f"{s}\n({biggest[s]:,})" for s in shapes])
            axes[0].set_yscale("log")
            axes[0].set_ylabel("µs per empty task")
            axes[0].legend(fontsize=7)
            axes[0].set_title("scheduler overhead")
        if micro:
            axes[1].plot([r["n"] for r in micro], [r["efficiency"] for r in micro], "o-")
            axes[1].axhline(1.0, color="grey", ls=":")
            axes[1].set_xscale("log", base=2)
            axes[1].set_xlabel("GEMM tile N")
            axes[1].set_ylabel("ideal time / measured")
            axes[1].set_title("independent GEMM tasks (DAGuE micro-benchmark)")
        fig.tight_layout()
        fig.savefig(out / "overhead.png", dpi=110)
        plt.close(fig)
        made.append("overhead.png")
    return made


def _pick(rows: list[Row], shape: str, tasks: int, ranks: int, key: str):
    for r in rows:
        if r["shape"] == shape and r["tasks"] == tasks and r["ranks"] == ranks:
            return r[key]
    return None


def write_report(out: Path) -> str:
    """Write ``out/README.md`` and the plots from the JSON files in ``out``."""
    out = Path(out)
    rows = load(out)
    pngs = plots(rows, out)
    parts = [
        "# Benchmark results\n",
        "Generated by `python -m benchmarks report` from the JSON files beside it "
        "(written by `python -m benchmarks all`). Every figure that matters is a ratio "
        "against a baseline measured in the same run on the same machine.\n",
        machine_section(rows),
        "## Targets\n",
        targets_section(rows),
        "## Tables\n",
        cholesky_section(rows),
        tiles_section(rows),
        overhead_section(rows),
        comm_section(rows),
        graphsize_section(rows),
        tracing_section(rows),
        "## Plots\n",
        "".join(f"![{p}]({p})\n\n" for p in pngs),
    ]
    path = out / "README.md"
    path.write_text("\n".join(parts))
    return str(path)
