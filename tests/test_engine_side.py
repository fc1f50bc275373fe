"""The engine side of a run: whatever goes wrong in the thread that watches a run, the
notebook still gets a summary (it waits for one; a silent watcher meant a hang)."""

from __future__ import annotations

import pytest

from taskgraph.cluster import engine_side

pytestmark = pytest.mark.timeout(30)


class FailingRun:
    """A run whose first join raises, as a bug in the watcher's path would."""

    def __init__(self):
        self.calls = 0

    def join(self, timeout=None) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise ValueError("boom in the watcher")
        return True


def test_a_failing_watcher_still_publishes_a_summary_with_the_error():
    published: list[dict] = []
    engine_side._watch(FailingRun(), published.append, 0.01)
    assert published, "nothing published: the notebook would wait forever"
    summary = published[-1]["summary"]
    assert "boom in the watcher" in str(summary["error"])
    assert summary["stats"] == {} and summary["values"] == []
