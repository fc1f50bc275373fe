"""The scheduling state, asserted whole after each single step (as dask's scheduler
tests do), on this graph (priorities in brackets)::

    a[3]   b[2]
      \\   /  \\
       c[1]   d[0]     c waits for a and b; d for b and one message
"""

import pytest

from taskgraph.run.schedstate import (
    DONE,
    FAILED,
    LEGAL,
    READY,
    RUNNING,
    WAITING,
    IllegalMove,
    SchedState,
    State,
)

A, B, C, D = 1, 2, 3, 4


def fresh() -> SchedState:
    return SchedState({A: 0, B: 0, C: 2, D: 2}, {A: 3, B: 2, C: 1, D: 0})


def whole(
    waiting=(), ready=(), running=(), done=(), failed=(), waits=None, ndone=0, nfailed=0, n=4
):
    return {
        "waiting": set(waiting),
        "ready": list(ready),
        "running": set(running),
        "done": set(done),
        "failed": set(failed),
        "waits": waits or {},
        "done_count": ndone,
        "failed_count": nfailed,
        "ntasks": n,
    }


def test_a_fresh_state_has_the_tasks_without_waits_ready_in_priority_order():
    assert fresh().snapshot() == whole(waiting={C, D}, ready=[A, B], waits={C: 2, D: 2})


def test_each_step_changes_the_whole_state_as_described():
    s = fresh()
    assert s.pop() == A
    assert s.snapshot() == whole(waiting={C, D}, ready=[B], running={A}, waits={C: 2, D: 2})
    s.move(A, DONE)
    assert s.count_down([C]) == 0
    assert s.snapshot() == whole(waiting={C, D}, ready=[B], done={A}, waits={C: 1, D: 2}, ndone=1)
    assert s.pop() == B
    s.move(B, DONE)
    assert s.count_down([C, D]) == 1
    assert s.snapshot() == whole(waiting={D}, ready=[C], done={A, B}, waits={D: 1}, ndone=2)
    assert s.pop() == C
    s.move(C, FAILED)
    assert s.snapshot() == whole(
        waiting={D}, failed={C}, done={A, B}, waits={D: 1}, ndone=2, nfailed=1
    )


def test_a_task_whose_tile_lands_runs_at_once_from_waiting():
    s = fresh()
    s.count_down([D])  # b's event
    s.run_at_once(D)  # its message landed: run by the polling worker
    assert s.snapshot() == whole(waiting={C}, ready=[A, B], running={D}, waits={C: 2})
    s.move(D, DONE)
    assert s.snapshot() == whole(waiting={C}, ready=[A, B], done={D}, waits={C: 2}, ndone=1)


def test_run_at_once_rejects_a_task_that_waits_for_more_than_its_tile():
    s = fresh()
    with pytest.raises(IllegalMove, match="task 4 waits for 2"):
        s.run_at_once(D)
    assert s.snapshot() == fresh().snapshot()


@pytest.mark.parametrize(
    "steps, task, new",
    [
        ((), C, DONE),  # WAITING has not run
        ((), A, DONE),  # READY has not run
        ((), A, READY),  # READY already
        (("pop",), A, READY),  # back to READY: never
        (("pop", "done"), A, FAILED),  # DONE is final
        (("pop", "done"), A, RUNNING),
    ],
)
def test_an_illegal_move_is_rejected_and_changes_nothing(steps, task, new):
    s = fresh()
    for step in steps:
        if step == "pop":
            s.pop()
        else:
            s.move(A, DONE)
    before = s.snapshot()
    with pytest.raises(IllegalMove, match=f"illegal move of task {task}"):
        s.move(task, new)
    assert s.snapshot() == before


def test_the_table_lists_exactly_the_moves_of_the_design():
    legal = {(State(o).name, State(n).name) for o in State for n in State if LEGAL[o][n]}
    assert legal == {
        ("WAITING", "READY"),
        ("WAITING", "RUNNING"),
        ("READY", "RUNNING"),
        ("RUNNING", "DONE"),
        ("RUNNING", "FAILED"),
    }


def test_a_task_added_while_the_run_goes_on_runs_after_the_known_ones():
    s = fresh()
    assert s.pop() == A
    s.add(9, 0)  # ready at once
    s.add(10, 1)
    assert s.snapshot() == whole(
        waiting={C, D, 10}, ready=[B, 9], running={A}, waits={C: 2, D: 2, 10: 1}, n=6
    )
    assert s.count_down([10]) == 1
    assert s.snapshot()["ready"] == [B, 9, 10]
    with pytest.raises(ValueError, match="task 9 is already scheduled"):
        s.add(9, 0)


def test_states_are_plain_ints_on_the_hot_path():
    assert (WAITING, READY, RUNNING, DONE, FAILED) == (0, 1, 2, 3, 4)
