"""Plan: a pure function from a graph and a number of ranks to what each rank does
(:mod:`~taskgraph.plan.planner`), and a preview of it (:mod:`~taskgraph.plan.preview`).
"""

from . import preview  # noqa: F401 - installs Graph.preview
from .planner import CONTROL_TAG, Message, Plan, RankPlan, make_plan

__all__ = ["CONTROL_TAG", "Message", "Plan", "RankPlan", "make_plan"]
