"""Trace: the events a run records (:mod:`~taskgraph.trace.events`), their Chrome
and HTML exports (:mod:`~taskgraph.trace.report`), and the notebook widgets
(:mod:`~taskgraph.trace.widgets`, imported only where shown: it needs anywidget).
"""

from .events import Trace, TraceError

__all__ = ["Trace", "TraceError"]
