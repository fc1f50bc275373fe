"""Short runs on engines end in the notebook, every time.

A run's engines answer its request as soon as it has started, and publish its summary
under that request when it ends. ipyparallel drops a request's record once the request
has answered and files what comes later in a new one: the summary of a short run could
land in the dropped record, and ``wait()`` then waited forever (notebook 02's strong
scaling cell hung 1 time in 3)."""

from __future__ import annotations

import sys

import pytest

import taskgraph as tg

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


@tg.task
def same(i: int) -> int:
    return i


def test_many_short_runs_on_new_engines_all_end_with_their_values():
    from conftest import assert_no_new_children, child_pids, engines_marker

    before = child_pids()
    for size in (1, 2):
        with engines_marker(sys.modules[__name__]), tg.Cluster(n=size) as c:
            for i in range(40):
                with tg.Graph("short") as g:
                    f = same(i)
                run = c.run(g)
                run.wait(timeout=20)  # (a lost summary: TimeoutError, not a hang)
                assert run.result(f) == i
            records = c.client.metadata
            assert all(records.get(m) is None for m in run.ar.msg_ids), "records left"
    assert_no_new_children(before)
