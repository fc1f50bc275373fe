"""The scheduling state of one rank's run: which task is where, and what it waits for.

One structure, :class:`SchedState`, changed by one function, :meth:`SchedState.move`,
which rejects a move the table :data:`LEGAL` does not list::

    WAITING ──(counter reaches 0)──► READY ──(a worker pops it)──► RUNNING ──► DONE
       │                                                             ▲    └──► FAILED
       └──(its tile landed: run at once, see taskgraph.run.direct)───┘

A task's counter (``waits``) holds one count per local predecessor, per incoming
message it reads, and per outgoing send of the tile version it overwrites (a cross-rank
write-after-read). The ready queue is a heap of each task's place in priority order
(highest first, ties by id): ints compare several times faster than (-priority, id)
tuples, and a pop is on every task's way.

Everything is keyed by task id in dicts, so a task may be added while a run goes on
(:meth:`SchedState.add`); it is placed after every task known before it.
"""

from __future__ import annotations

import enum
import heapq


class State(enum.IntEnum):
    """Where a task is in its run."""

    WAITING = 0
    READY = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


# the states as plain ints on the hot path: an enum member's lookup and hash cost
# ~0.1 us each, and every task moves three times
WAITING, READY, RUNNING, DONE, FAILED = (int(s) for s in State)

# LEGAL[old][new]: the moves a task may make (WAITING -> RUNNING: a task run the moment
# its tile lands, which no other thread can reach before that tile's count)
_MOVES = {
    (WAITING, READY),
    (WAITING, RUNNING),
    (READY, RUNNING),
    (RUNNING, DONE),
    (RUNNING, FAILED),
}
LEGAL = tuple(tuple((old, new) in _MOVES for new in range(5)) for old in range(5))


class IllegalMove(RuntimeError):
    """A task was asked to make a move :data:`LEGAL` does not list (a runtime bug)."""


class SchedState:
    """The state of every task of one rank's run.

    Fields (all guarded by the executor's lock, but for the one move of a task run the
    moment its tile lands, which no other thread can reach then):

    - ``state``: task -> its :class:`State` (as an int);
    - ``waits``: task -> events it still waits for (0 once READY);
    - ``ready``: heap of the READY tasks' places (``place[t]``; ``task_at[p]`` is t);
    - ``done``, ``failed``: how many tasks reached DONE, FAILED; ``ntasks``: in all.
    """

    def __init__(self, waits: dict[int, int], priority: dict[int, float]):
        """``waits``: each task's count of events to wait for; ``priority``: each
        task's priority (higher runs first). Tasks with nothing to wait for are READY."""
        self.state: dict[int, int] = dict.fromkeys(waits, WAITING)
        self.waits: dict[int, int] = dict(waits)
        in_order = sorted(sorted(waits), key=priority.__getitem__, reverse=True)  # stable
        self.task_at: dict[int, int] = dict(enumerate(in_order))
        self.place: dict[int, int] = {t: i for i, t in self.task_at.items()}
        self.ready: list[int] = []
        self.done = 0
        self.failed = 0
        self.ntasks = len(waits)
        for t in in_order:
            if self.waits[t] == 0:
                self.make_ready(t)

    def add(self, t: int, waits: int) -> None:
        """Add task ``t`` while the run goes on, waiting for ``waits`` events (READY at
        once if none), placed after every task known so far."""
        if t in self.state:
            raise ValueError(f"task {t} is already scheduled")
        place = len(self.task_at)
        self.task_at[place] = t
        self.place[t] = place
        self.state[t] = WAITING
        self.waits[t] = waits
        self.ntasks += 1
        if waits == 0:
            self.make_ready(t)

    def move(self, t: int, new: int) -> None:
        """Move task ``t`` to state ``new``; IllegalMove if :data:`LEGAL` forbids it."""
        old = self.state[t]
        if not LEGAL[old][new]:
            raise IllegalMove(f"illegal move of task {t}: {State(old).name} -> {State(new).name}")
        self.state[t] = new
        if new == DONE:
            self.done += 1
        elif new == FAILED:
            self.failed += 1

    def make_ready(self, t: int) -> None:
        """WAITING -> READY, onto the ready heap."""
        self.move(t, READY)
        heapq.heappush(self.ready, self.place[t])

    def pop(self) -> int:
        """The READY task of highest priority, now RUNNING (the heap is not empty)."""
        t = self.task_at[heapq.heappop(self.ready)]
        state = self.state
        if not LEGAL[state[t]][RUNNING]:  # move()'s check, inline: once a task
            self.move(t, RUNNING)  # raises
        state[t] = RUNNING
        return t

    def count_down(self, tasks) -> int:
        """One event each of ``tasks`` waited for happened (a task ended, a message
        came or went); how many became READY. Called once per event, not per task."""
        woken = 0
        waits, state = self.waits, self.state
        for t in tasks:
            left = waits[t] - 1
            waits[t] = left
            if not left:  # make_ready, inline (on a message's way): move()'s table
                if not LEGAL[state[t]][READY]:
                    self.move(t, READY)  # raises
                state[t] = READY
                heapq.heappush(self.ready, self.place[t])
                woken += 1
        return woken

    def snapshot(self) -> dict:
        """The whole state as plain data, for tests: each state's tasks (``ready`` in
        the order they will run), the counters and what each WAITING task waits for."""
        by_state: dict[str, set[int]] = {s.name.lower(): set() for s in State}
        for t, s in self.state.items():
            by_state[State(s).name.lower()].add(t)
        return {
            **by_state,
            "ready": [self.task_at[p] for p in sorted(self.ready)],
            "waits": {t: n for t, n in self.waits.items() if self.state[t] == WAITING},
            "done_count": self.done,
            "failed_count": self.failed,
            "ntasks": self.ntasks,
        }

    def run_at_once(self, t: int) -> None:
        """Task ``t``, WAITING for one last event (its tile, which just landed), runs
        at once: no count left, RUNNING. Safe without the lock: no other thread can
        reach ``t`` before that event is counted."""
        if self.waits[t] != 1:
            raise IllegalMove(f"task {t} waits for {self.waits[t]} events, not its tile alone")
        state = self.state
        if not LEGAL[state[t]][RUNNING]:  # move()'s check, inline: once a hop
            self.move(t, RUNNING)  # raises
        state[t] = RUNNING
        self.waits[t] = 0
