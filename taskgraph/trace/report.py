"""A standalone HTML report of a trace: the widget's own views, with the data inside.

The page inlines ``static/view.js`` (the renderer the notebook widget uses) and the
trace as JSON, so it opens from a file, offline, and shows what the widget showed.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from string import Template

from ..core.files import write_atomic

STATIC = Path(__file__).parent / "static"

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>$title: taskgraph report</title>
<style>
body { margin: 16px; font-family: system-ui, sans-serif; background: #f4f5f7; }
$css
</style>
</head>
<body>
<div id="taskgraph-report"></div>$ensemble
<script type="application/json" id="taskgraph-data">$data</script>
<script type="module">
$js
const data = JSON.parse(document.getElementById("taskgraph-data").textContent);
renderStatic(document.getElementById("taskgraph-report"), data);
</script>
</body>
</html>
""")


def static_file(name: str) -> str:
    path = STATIC / name
    return path.read_text() if path.exists() else ""


def report_html(trace) -> str:
    rows = trace.event_rows(trace.tasks, trace.messages, trace.spawned, trace.steals)
    data = {"state": trace.state(), "events": [rows]}
    text = json.dumps(data).replace("</", "<\\/")  # safe inside a script element
    return PAGE.substitute(
        title=html.escape(trace.title),
        css=static_file("view.css"),
        data=text,
        js=static_file("view.js"),
        ensemble=ensemble_html(trace) if trace.attempt_rows else "",
    )


COLOURS = {  # RADICAL-Pilot's states of a core, in the view's palette
    "running": "#4e79a7",
    "launching": "#f28e2b",
    "overhead": "#b07aa1",
    "idle": "#d0d4da",
}
STEP_TEXT = {
    "wait": "ready → launched (scheduled)",
    "launch": "launched → running",
    "run": "running → done",
    "total": "ready → done",
}
WIDTH, LABEL_W = 900, 110  # px of the chart, and of its lane labels


def ensemble_html(trace) -> str:
    """A run with managed calls: each core over time, coloured by state, the state
    counts and the overheads of the attempts (medians); a section of HTML."""
    util = trace.core_utilisation()
    counts = trace.state_counts()
    shown = {k: v for k, v in counts.items() if v is not None}
    parts = [
        '<section id="tg-ensemble" style="margin-top:16px">',
        "<h3>Cores over time</h3>",
        f"<p>utilisation {util['utilisation']:.1%} (running ÷ cores × makespan) · "
        + " · ".join(f"{v} {k}" for k, v in shown.items())
        + "</p>",
        core_chart(util["lanes"], trace.makespan),
        _legend(util["seconds"]),
        overhead_table(trace.overheads()),
        "</section>",
    ]
    return "\n".join(parts)


def core_chart(lanes: list[dict], end: float) -> str:
    """An SVG: one lane per core, its ``[t0, t1, state]`` pieces as coloured bars."""
    lane_h = max(2, min(14, 480 // max(1, len(lanes))))
    height = lane_h * len(lanes) + 20
    scale = (WIDTH - LABEL_W) / end if end > 0 else 0.0
    out = [
        f'<svg class="tg-cores" width="{WIDTH}" height="{height}" '
        f'data-lanes="{len(lanes)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, lane in enumerate(lanes):
        y = i * lane_h
        if lane_h >= 9:
            out.append(
                f'<text x="0" y="{y + lane_h - 2}" font-size="{lane_h - 2}">'
                f"rank {lane['rank']} · core {lane['slot']}</text>"
            )
        for t0, t1, state in lane["spans"]:
            x, w = LABEL_W + t0 * scale, max(0.3, (t1 - t0) * scale)
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane_h - 1}" '
                f'fill="{COLOURS[state]}"><title>{state} {t0:.4f}–{t1:.4f} s</title></rect>'
            )
    out.append(f'<text x="{LABEL_W}" y="{height - 4}" font-size="11">0 s</text>')
    out.append(
        f'<text x="{WIDTH - 4}" y="{height - 4}" font-size="11" text-anchor="end">'
        f"{end:.3f} s</text></svg>"
    )
    return "".join(out)


def _legend(seconds: dict) -> str:
    items = [
        f'<span style="margin-right:12px"><span style="display:inline-block;width:10px;'
        f'height:10px;background:{COLOURS[k]}"></span> {k} {v:.3f} s</span>'
        for k, v in seconds.items()
    ]
    return f'<p class="tg-core-legend">{"".join(items)}</p>'


def overhead_table(o: dict) -> str:
    """The attempts' overheads: per step, the median, mean and largest seconds."""
    rows = o["rows"]
    head = "<tr><th>step</th><th>median</th><th>mean</th><th>max</th></tr>"
    body = []
    for step, text in STEP_TEXT.items():
        xs = [r[step] for r in rows]
        mean = sum(xs) / len(xs) if xs else 0.0
        body.append(
            f"<tr><td>{html.escape(text)}</td><td>{_ms(o['median'][step])}</td>"
            f"<td>{_ms(mean)}</td><td>{_ms(max(xs, default=0.0))}</td></tr>"
        )
    return (
        f"<h3>Overheads of {o['count']} attempts</h3>"
        f'<table class="tg-overheads">{head}{"".join(body)}</table>'
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def write_report(trace, path) -> str:
    """Write the report of ``trace`` to ``path``, whole or not at all
    (:func:`~taskgraph.core.files.write_atomic`); returns ``path`` as a string."""
    return write_atomic(path, report_html(trace))
