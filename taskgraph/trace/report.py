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
<div id="taskgraph-report"></div>
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
    )


def write_report(trace, path) -> str:
    """Write the report of ``trace`` to ``path``, whole or not at all
    (:func:`~taskgraph.core.files.write_atomic`); returns ``path`` as a string."""
    return write_atomic(path, report_html(trace))
