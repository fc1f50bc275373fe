"""Events of a run, recorded cheaply enough to leave on.

Each rank records into arrays preallocated from its plan (one row per task it runs,
one row per message it sends or receives), so recording costs a few stores, never an
allocation. Times are seconds since the run's start on that rank.

``batch(cursor)`` hands out what was recorded since the last batch: live viewers
(a notebook, a progress line) pull batches at their own pace, and the executor never
knows who watches.

Task rows:    task id, worker, start, end, state (1 done, 2 failed)
Message rows: peer, bytes, tag, posted, completed, direction (+1 sent, -1 received)
"""

from __future__ import annotations

import time

import numpy as np

TASK_DONE, TASK_FAILED = 1, 2


class Recorder:
    """Preallocated task and message events of one rank in one run."""

    def __init__(self, ntasks: int, nmessages: int, enabled: bool = True):
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self.epoch = time.time()  # wall clock at t0, to line ranks up
        n = ntasks if enabled else 0
        m = nmessages if enabled else 0
        self.task_id = np.full(n, -1, np.int64)
        self.task_worker = np.zeros(n, np.int16)
        self.task_start = np.zeros(n)
        self.task_end = np.zeros(n)
        self.task_state = np.zeros(n, np.int8)
        self.ntasks = 0  # rows finished (done or failed)
        self.msg_peer = np.zeros(m, np.int32)
        self.msg_bytes = np.zeros(m, np.int64)
        self.msg_tag = np.zeros(m, np.int64)
        self.msg_posted = np.zeros(m)
        self.msg_done = np.zeros(m)
        self.msg_dir = np.zeros(m, np.int8)
        self.nmsgs = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def task(self, tid: int, worker: int, start: float, end: float, state: int) -> None:
        """A task ended (called with the executor's lock held)."""
        if not self.enabled:
            return
        i = self.ntasks
        self.task_id[i] = tid
        self.task_worker[i] = worker
        self.task_start[i] = start
        self.task_end[i] = end
        self.task_state[i] = state
        self.ntasks = i + 1

    def message(self, peer: int, nbytes: int, tag: int, posted: float, direction: int) -> None:
        """A send or receive completed (called by the progress thread only)."""
        if not self.enabled or self.nmsgs >= len(self.msg_peer):
            return
        i = self.nmsgs
        self.msg_peer[i] = peer
        self.msg_bytes[i] = nbytes
        self.msg_tag[i] = tag
        self.msg_posted[i] = posted
        self.msg_done[i] = self.now()
        self.msg_dir[i] = direction
        self.nmsgs = i + 1

    def batch(self, cursor: tuple[int, int] = (0, 0)) -> tuple[dict, tuple[int, int]]:
        """Events recorded since ``cursor``, as plain lists, and the new cursor."""
        t, m = self.ntasks, self.nmsgs
        ct, cm = cursor
        out = {
            "tasks": {
                "id": self.task_id[ct:t].tolist(),
                "worker": self.task_worker[ct:t].tolist(),
                "start": self.task_start[ct:t].tolist(),
                "end": self.task_end[ct:t].tolist(),
                "state": self.task_state[ct:t].tolist(),
            },
            "messages": {
                "peer": self.msg_peer[cm:m].tolist(),
                "bytes": self.msg_bytes[cm:m].tolist(),
                "tag": self.msg_tag[cm:m].tolist(),
                "posted": self.msg_posted[cm:m].tolist(),
                "done": self.msg_done[cm:m].tolist(),
                "dir": self.msg_dir[cm:m].tolist(),
            },
        }
        return out, (t, m)
