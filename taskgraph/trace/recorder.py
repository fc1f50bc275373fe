"""Events of a run, recorded cheaply enough to leave on.

Each rank records into lists preallocated from its plan (one row per task it runs,
one row per message it sends or receives), so recording costs a few stores and the
float objects of its times, never a list growing. Times are seconds since the run's
start on that rank: ranks leave a barrier together and start their clocks then; when
merged, ranks on one host are put on one time base exactly (they share the host's
monotonic clock).

``batch(cursor)`` hands out what was recorded since the last batch: live viewers
(a notebook, a progress line) pull batches at their own pace, and the executor never
knows who watches.

Task rows:    task id, worker, start, end, state (1 done, 2 failed)
Message rows: peer, bytes, tag, posted, completed, direction (+1 sent, -1 received)
Spawned rows: worker, start, end, name, state: a call made by ``tg.spawn`` that ran here
Steal rows:   victim, name, requested, arrived, pushed: a spawned call this rank stole (or
              was pushed: see taskgraph.run.steal)
              (latency = arrived - requested)
Attempt rows: worker, label, task, attempt, state, ready, launched, started, ended,
              cores: one attempt of a managed call (one with retries, resources, a
              timeout, a checkpoint...; task -1 for a spawned or submitted call)

Spawned, steal and attempt rows are not known from the plan: they are appended, one tuple per
row (a single ``list.append``, atomic under the GIL, so any thread may record and a
batch never sees half a row). A static graph records none. ``looking`` sums the
seconds this rank had a steal request out (request to reply, found work or not).

The executor stores raw ``time.perf_counter()`` readings (:attr:`Recorder.clock`, a
builtin, so that no Python call sits on a task's path); :meth:`Recorder.batch` hands
them out as seconds since the start.
"""

from __future__ import annotations

import time
from typing import Any

TASK_DONE, TASK_FAILED = 1, 2

# how an attempt of a managed call ended (the state of an attempt row)
ATTEMPT_DONE = "done"
ATTEMPT_FAILED = "failed"  # the last attempt failed: the failure policy applies
ATTEMPT_RETRIED = "retried"  # failed, and another attempt follows
ATTEMPT_SKIPPED = "skipped"  # never ran: a task it depends on failed (on_failure="skip")
ATTEMPT_CHECKPOINT = "checkpoint-hit"  # not run: its value came from the checkpoint
ATTEMPT_STATES = (
    ATTEMPT_DONE,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_SKIPPED,
    ATTEMPT_CHECKPOINT,
)


class Recorder:
    """Preallocated task and message events of one rank in one run."""

    def __init__(
        self,
        ntasks: int,
        nmessages: int,
        enabled: bool = True,
        workers: int = 1,
        rank: int = 0,
        host: str = "",
    ):
        self.enabled = enabled
        self.rank = rank
        self.host = host
        self.workers = workers
        self.start()
        # seconds each worker spent waiting: [waiting on communication, idle]
        self.waits = [[0.0, 0.0] for _ in range(workers)]  # lists: cheaper += than NumPy
        self.wall = 0.0  # the run's duration on this rank, set at the end
        self.compile_seconds = 0.0  # compiling kernels before the run (not in its time)
        n = ntasks if enabled else 0
        m = nmessages if enabled else 0
        # Python lists: a store is cheaper than into NumPy (benchmarks.tracing, performance.md)
        # and ids, tags and sizes stay the plan's own ints: the times are the only new objects
        self.task_id: list[int] = [-1] * n
        self.task_worker = [0] * n
        self.task_start = [0.0] * n
        self.task_end = [0.0] * n
        self.task_state = [0] * n
        self.ntasks = 0  # rows finished (done or failed)
        self.msg_peer = [0] * m
        self.msg_bytes = [0] * m
        self.msg_tag = [0] * m
        self.msg_posted = [0.0] * m
        self.msg_done = [0.0] * m
        self.msg_dir = [0] * m
        self.nmsgs = 0
        self.spawn_rows: list[tuple[int, float, float, str, int]] = []
        self.steal_rows: list[tuple[int, str, float, float, bool]] = []
        self.attempt_rows: list[tuple] = []
        self.begun: list[None] = []  # one entry per attempt launched (len: atomic count)
        self.looking = 0.0

    def start(self) -> None:
        """Time zero: called right after the ranks leave a barrier, so they line up."""
        self.t0 = time.perf_counter()
        self.epoch = time.time()

    clock = staticmethod(time.perf_counter)  # what times given to task() are read from

    def now(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.t0

    def waited(self, worker: int, seconds: float, on_network: bool) -> None:
        """A worker waited for work (called with the executor's lock held)."""
        self.waits[worker][0 if on_network else 1] += seconds

    def task(self, tid: int, worker: int, start: float, end: float, state: int) -> None:
        """A task ended (called with the executor's lock held); times from ``clock``."""
        if not self.enabled:
            return
        i = self.ntasks
        self.task_id[i] = tid
        self.task_worker[i] = worker
        self.task_start[i] = start
        self.task_end[i] = end
        self.task_state[i] = state
        self.ntasks = i + 1

    def message(
        self,
        peer: int,
        nbytes: int,
        tag: int,
        posted: float,
        direction: int,
        done: float | None = None,
    ) -> None:
        """A send or receive completed (called with the executor's lock held);
        ``posted`` and ``done`` (None: now) read from ``clock``."""
        if not self.enabled or self.nmsgs >= len(self.msg_peer):
            return
        i = self.nmsgs
        self.msg_peer[i] = peer
        self.msg_bytes[i] = nbytes
        self.msg_tag[i] = tag
        self.msg_posted[i] = posted
        self.msg_done[i] = time.perf_counter() if done is None else done
        self.msg_dir[i] = direction
        self.nmsgs = i + 1

    def spawned(self, worker: int, start: float, end: float, name: str, state: int) -> None:
        """A spawned call ``name`` ran on ``worker`` (any thread); times from ``clock``."""
        if self.enabled:
            self.spawn_rows.append((worker, start, end, name, state))

    def stole(
        self, victim: int, name: str, requested: float, arrived: float, pushed: bool = False
    ) -> None:
        """This rank stole the call ``name`` from ``victim``: asked at ``requested``, it
        arrived at ``arrived`` (both from ``clock``); ``pushed``: the victim sent it
        unasked, at ``requested`` (see taskgraph.run.steal)."""
        if self.enabled:
            self.steal_rows.append((victim, name, requested, arrived, pushed))

    def begin(self) -> None:
        """An attempt of a managed call was launched (any thread): until its
        :meth:`attempt` row comes, it counts as running in the live state counts."""
        if self.enabled:
            self.begun.append(None)

    def attempt(
        self,
        worker: int,
        label: str,
        task: int,
        attempt: int,
        state: str,
        ready: float | None,
        launched: float | None,
        started: float | None,
        ended: float | None,
        cores: int = 1,
    ) -> None:
        """One attempt of a managed call ended (any thread). ``worker``: the worker that
        ran it; ``label``: what it is (``"f(3)"``); ``task``: its static task id, -1 for
        a spawned or submitted call; ``attempt``: 1, 2, ...; ``state``: one of
        :data:`ATTEMPT_STATES`; ``ready`` (it could start), ``launched`` (its resources
        were taken and its launch began), ``started`` (its code ran), ``ended``: times
        from ``clock``, None for a stamp it never reached (a skipped call has none);
        ``cores``: the cores it held (``ranks`` x ``cores``)."""
        if self.enabled:
            self.attempt_rows.append(
                (worker, label, task, attempt, state, ready, launched, started, ended, cores)
            )

    def looked(self, seconds: float) -> None:
        """A steal request of this rank was answered ``seconds`` after it was sent."""
        self.looking += seconds

    def batch(self, cursor: tuple = (0, 0)) -> tuple[dict, tuple]:
        """Events recorded since ``cursor`` (the one the last batch returned; (0, 0) at
        first), as plain lists, and the new cursor."""
        t, m = self.ntasks, self.nmsgs
        ns, nk, na = len(self.spawn_rows), len(self.steal_rows), len(self.attempt_rows)
        ct, cm, cs, ck, ca = (tuple(cursor) + (0, 0, 0))[:5]
        t0 = self.t0
        spawn = self.spawn_rows[cs:ns]
        steal = self.steal_rows[ck:nk]
        events: dict[str, Any] = {
            "tasks": {
                "id": self.task_id[ct:t],
                "worker": self.task_worker[ct:t],
                "start": [x - t0 for x in self.task_start[ct:t]],
                "end": [x - t0 for x in self.task_end[ct:t]],
                "state": self.task_state[ct:t],
            },
            "messages": {
                "peer": self.msg_peer[cm:m],
                "bytes": self.msg_bytes[cm:m],
                "tag": self.msg_tag[cm:m],
                "posted": [x - t0 for x in self.msg_posted[cm:m]],
                "done": [x - t0 for x in self.msg_done[cm:m]],
                "dir": self.msg_dir[cm:m],
            },
            "spawned": {
                "worker": [r[0] for r in spawn],
                "start": [r[1] - t0 for r in spawn],
                "end": [r[2] - t0 for r in spawn],
                "name": [r[3] for r in spawn],
                "state": [r[4] for r in spawn],
            },
            "steals": {
                "victim": [r[0] for r in steal],
                "name": [r[1] for r in steal],
                "requested": [r[2] - t0 for r in steal],
                "arrived": [r[3] - t0 for r in steal],
                "pushed": [r[4] for r in steal],
            },
        }
        if na > ca:  # (only with rows: a static run's batch stays as it was)
            events["attempts"] = self._attempts(self.attempt_rows[ca:na])
        nb = len(self.begun)
        out = {
            "rank": self.rank,
            "host": self.host,
            "t0": self.t0,  # this rank's time zero on its host's monotonic clock
            "workers": self.workers,
            "waits": [list(w) for w in self.waits],
            "wall": self.wall or self.now(),
            "compile": self.compile_seconds,
            "looking": self.looking,
            "events": events,
        }
        if nb:
            out["begun"] = nb  # attempts launched so far on this rank
        return out, (t, m, ns, nk, na)

    def _attempts(self, rows: list[tuple]) -> dict[str, list]:
        """Attempt rows as columns, their times as seconds since the start."""
        t0 = self.t0

        def since(i: int) -> list:
            return [None if r[i] is None else r[i] - t0 for r in rows]

        return {
            "worker": [r[0] for r in rows],
            "label": [r[1] for r in rows],
            "task": [r[2] for r in rows],
            "attempt": [r[3] for r in rows],
            "state": [r[4] for r in rows],
            "ready": since(5),
            "launched": since(6),
            "started": since(7),
            "ended": since(8),
            "cores": [r[9] for r in rows],
        }
