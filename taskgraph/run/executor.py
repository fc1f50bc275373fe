"""Per-rank execution of a plan: dependency counters, a priority queue, workers.

Every rank runs one :class:`Executor` over its :class:`~taskgraph.plan.RankPlan`;
there is no central scheduler. Two kinds of threads::

    workers (N)                          progress thread (the one that called run)
    ───────────                          ─────────────────────────────────────────
    pop the ready task of highest        posts sends of finished tasks (at most
    priority, run its kernel (GIL        max_sends in flight), posts receives ahead
    released), then, under the lock:     (up to a byte budget and a count), tests
    count down local successors,         them, takes unexpected messages (values,
    push the ones that reach zero,  ──►  signals, aborts) with a probe, and counts
    post its sends (or hand them over)   down the tasks a completed message releases.

Cooperative progress: one thread at a time holds the network token and may call MPI.
An idle worker that waits for a message polls the network itself (and the progress
thread steps back), so the worker that runs the released task is the one that finds
the message; a worker posts its finished task's sends itself when the token is free,
before its own bookkeeping. On the way from a message to the next message no thread
hands work to another. Where the oldest receive is the last thing a short task waits
for (:func:`direct_task`), the polling worker resolves that task's arguments while the
tile is on its way and, the moment it lands, runs the task and posts its sends before
any bookkeeping (:meth:`Executor._run_direct`). While a worker polls, the progress
thread sleeps (up to ``POLLED_SLEEP``): the worker wakes it when it starts a long task
(``LONG_TASK`` flops) or stops polling, so that transfers go on while every worker
computes.
Receives are posted ahead up to a byte budget small enough to stay in cache.
With several workers and short tasks (on average under :func:`short_task_limit`: 50
µs, or 20 µs where every task is a kernel that runs without the GIL), one worker runs
them and the others park (:meth:`Executor._park`): Python runs one thread at a time,
so more workers on tiny tasks only pass the lock and the GIL around.

Task states move WAITING -> READY -> RUNNING -> DONE (or FAILED), through
:meth:`Executor._move` (or its check, inline, on a message's path; a task run the
moment its tile lands goes from WAITING to RUNNING at once: :func:`direct_task` saw it
WAITING, and no other thread can reach it before that tile's count). A task is READY
when its counter reaches zero: one count per local predecessor, per incoming message
it reads, and per outgoing send of the tile version it overwrites (a cross-rank
write-after-read).

A polling worker keeps polling (yielding the GIL) for ``spin`` seconds after the last
message (longer by ``spin_per_byte`` per byte of the receives it waits for), then
sleeps, doubling the sleep up to ``poll_max`` and, past it, up to 5 % of the time it
has waited (:func:`~taskgraph.run.comm.next_sleep`); the progress thread backs off that
way too and wakes at once when a worker hands it work: a rank that
waits for a message does not burn a core.

A task that raises stops this rank's workers, sends an abort to every other rank,
and all ranks agree on the outcome (``Ibarrier`` then ``allgather``)
before the run's communicator is freed, so every rank raises the same
:class:`~taskgraph.core.errors.TaskError`, and the next run starts clean.

Time limits and stuck tasks: the progress thread fails the run when a task runs past
its limit (the function's ``timeout``, else ``task_timeout``). A cancel only records
its reason and wakes the progress thread (no lock: safe from any thread, any number
of times). When the run stops, a worker still in its task after ``STOP_GRACE``
seconds (or at once, for a task past its limit) gets :class:`TaskAbandoned` raised
in its thread and is abandoned: the run concludes without it, names its task, and
the next run starts beside it. A pure-Python loop ends there; a call into C that
never returns keeps its (daemon) thread until the process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import gc
import heapq
import os
import threading
import time
import traceback
from collections import deque

import numpy as np

from ..core import config
from ..core.errors import RemoteTraceback, RunError, TaskError
from ..dsl import memory
from ..dsl.graph import Graph
from ..dsl.tasks import INITIAL, Ref
from ..plan.planner import CONTROL_TAG, Message, RankPlan
from ..trace.events import TASK_DONE, TASK_FAILED, Recorder
from . import comm as commlib

POLLED_SLEEP = 4e-3  # the progress thread's longest sleep while a worker polls
LONG_TASK = 4e6  # flops: a worker starting a longer task hands polling to that thread
# tasks shorter than this (a running average) are run by one worker at a time: Python
# runs one thread at a time, and two workers taking turns at tiny tasks spent their
# time handing the lock and the GIL to each other (independent empty tasks: 11 us a
# task on 2 workers against 5 on 1)
SHORT_TASK = 50e-6
# ... and this, where every task is a kernel that runs without the GIL: two workers
# then overlap one's kernel with the other's bookkeeping. Independent 64x64 GEMM
# tasks (33 us) on 2 workers, the limits alternating in one process, best of 4, two
# runs: 0.45 and 0.45 of the ideal time with 50 us, 0.63 and 0.73 with 20 us (a plain
# thread pool: 0.9); 32x32 (9 us) 0.27 and 0.24 with 50 us, 0.26 and 0.26 with 20 us.
# With 15 us, 32x32 lost 7-11 % in three runs: its tasks, with their wrapper, are near
# that limit, and the workers took turns at them
SHORT_KERNEL = 20e-6
PARK = 200e-6  # a parked worker looks again this often, and helps with a task this old
# seconds a worker still in its task when the run stops (a failure, a cancel, a
# timeout) is given before it is interrupted and abandoned: the other ranks and the
# next run do not wait for it
STOP_GRACE = 2.0
WATCH = 0.05  # the progress thread looks at least this often for tasks past their timeout


class TaskAbandoned(BaseException):
    """Raised in a worker thread whose task ran past its timeout, or was still running
    when its run stopped: the run has ended without it (a BaseException, so that a task's
    own ``except Exception`` does not swallow it)."""


def interrupt_thread(thread: threading.Thread) -> bool:
    """Raise :class:`TaskAbandoned` in ``thread`` (``PyThreadState_SetAsyncExc``).

    A pure-Python loop sees it within a few bytecodes, a ``time.sleep`` when the sleep
    ends; a call into C that never returns (a kernel, a blocking read) never sees it.
    True if the exception was set."""
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return False
    setexc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    n = setexc(ctypes.c_ulong(ident), ctypes.py_object(TaskAbandoned))
    if n > 1:  # (never for one thread id, but the C API asks for the undo)
        setexc(ctypes.c_ulong(ident), None)
    return n == 1


def timeouts_by_function(fns, default: float | None) -> dict:
    """Each function's time limit in seconds: its own ``timeout`` attribute (from
    ``@tg.task(timeout=)`` or ``tg.kernel(timeout=)``), else ``default``; functions
    without a limit are left out."""
    out = {}
    for fn in fns:
        limit = getattr(fn, "timeout", None)
        if limit is None:
            limit = default
        if limit is not None:
            out[fn] = float(limit)
    return out


class State(enum.IntEnum):
    WAITING = 0
    READY = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


# the states as plain ints on the hot path: an enum member's lookup and hash cost
# ~0.1 us each, and every task moves three times
WAITING, READY, RUNNING, DONE, FAILED = (int(s) for s in State)
_FROM = (None, WAITING, READY, RUNNING, RUNNING)  # the one state each state is entered from


def _take(done: list[int], handles: list, entries: list) -> list:
    """Remove the completed requests (indices ``done``) from ``handles`` and their
    entries from ``entries``, in place; return those entries."""
    if len(done) == 1:  # the common case, without rebuilding the lists
        del handles[done[0]]
        return [entries.pop(done[0])]
    keep = set(done)
    taken = [entries[i] for i in done]
    handles[:] = [h for i, h in enumerate(handles) if i not in keep]
    entries[:] = [e for i, e in enumerate(entries) if i not in keep]
    return taken


def short_task_limit(fns) -> float:
    """The mean task time under which one worker of a rank runs the tasks while the
    others park, for a rank whose tasks call ``fns``: ``SHORT_KERNEL`` if every one
    is a kernel that runs without the GIL (``nogil``), else ``SHORT_TASK``."""
    return SHORT_KERNEL if all(getattr(fn, "nogil", False) for fn in fns) else SHORT_TASK


def direct_task(
    msg: Message, waits: dict, state: dict, long: set, sending: list | tuple = ()
) -> int | None:
    """The task a receive may hand straight to the worker that polls for it, or None.

    That is the one task that reads the message's tile, when nothing but the message
    and sends of this rank still in flight (``sending``, their messages) hold it back,
    and it is not a long task: the worker then resolves its arguments while the
    message is on its way, and when it lands (those sends done) runs the task and
    posts the task's sends at once, counting down after (:meth:`Executor._run_direct`).
    The sends are those of a tile the task overwrites: in a ping-pong or a pipeline
    the send of a rank's last version completes just before the next message comes.
    A pure decision, on the executor's state: ``waits`` and ``state`` by task, ``long``
    the tasks during which the network must stay free for the progress thread."""
    if msg.kind != "tile" or len(msg.consumers) != 1:
        return None
    t = msg.consumers[0]
    if state[t] != WAITING or t in long:
        return None
    left = waits[t] - 1
    if left:
        left -= sum(t in m.release for m in sending)
    return t if left == 0 else None


@contextlib.contextmanager
def gc_frozen():
    """Collections leave the objects that exist now alone, for the duration.

    The graph, its plan and the data of a run are up to millions of long-lived objects,
    and every full collection during the run (the executor's own allocations trigger
    them) walks them all. Nothing is done if the collector is off or the process froze
    objects itself.
    """
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


class BufferPool:
    """Receive buffers, kept by (shape, dtype) and handed out again instead of freed.

    Keyed by NumPy dtype objects, not their strings: ``arr.dtype.str`` makes a string
    each time (0.3 us), and a buffer goes back on every received tile's way."""

    def __init__(self):
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self.allocated = 0  # buffers ever made
        self.handed_out = 0  # buffers ever handed out
        self._slabs = memory.Slabs()  # large ones on huge pages (see taskgraph.dsl.memory)

    def get(self, shape: tuple, dtype: str) -> np.ndarray:
        self.handed_out += 1
        dt = self._dtypes.get(dtype)
        if dt is None:
            dt = self._dtypes[dtype] = np.dtype(dtype)
        stack = self._free.get((shape, dt))
        if stack:
            return stack.pop()
        self.allocated += 1
        return self._slabs.new(shape, dt)

    def put(self, arr: np.ndarray) -> None:
        key = (arr.shape, arr.dtype)
        stack = self._free.get(key)
        if stack is None:
            self._free[key] = [arr]
        else:
            stack.append(arr)

    def __len__(self) -> int:
        return sum(len(s) for s in self._free.values())


class Stats:
    """What a run did on one rank (kept tiny: it is returned to the caller)."""

    def __init__(self):
        self.tasks = 0
        self.sent = 0
        self.received = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.polls = 0
        self.sleeps = 0
        self.spins = 0
        self.peak_sends = 0  # most sends in flight at once
        self.direct = 0  # tasks run the moment their message landed (Executor._run_direct)
        self.seconds = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


class Executor:
    """Runs one rank's share of a plan."""

    def __init__(
        self,
        graph: Graph,
        plan: RankPlan,
        network: commlib.Network,
        workers: int = 1,
        pool: BufferPool | None = None,
        trace: bool = True,
        task_timeout: float | None = None,
        compile_seconds: float = 0.0,
    ):
        """``graph`` and ``plan``: what to run (this rank's share); ``network``: this
        run's communicator; ``workers``: worker threads; ``pool``: receive buffers kept
        between runs; ``trace``: record events; ``task_timeout``: seconds a task may run
        unless its function has a ``timeout`` of its own (None: no limit). A task past
        its limit fails the run with a TaskError naming it, on every rank; its thread is
        interrupted and abandoned (see :func:`interrupt_thread`). ``compile_seconds``:
        the time spent compiling kernels before the run, traced apart from its time."""
        self.graph = graph
        self.plan = plan
        self.net = network
        self.nworkers = max(1, workers)
        self.pool = pool if pool is not None else BufferPool()
        self.stats = Stats()
        nsends = sum(len(v) for v in plan.sends.values())
        self.trace = Recorder(
            len(plan.tasks),
            nsends + len(plan.recvs),
            trace,
            self.nworkers,
            network.rank,
            network.host,
        )
        self.trace.compile_seconds = compile_seconds
        self.max_sends = config.max_sends()
        self.recv_budget = config.recv_budget()
        self.poll_max = config.poll_max()
        self.spin = config.spin()
        self.spin_per_byte = config.spin_per_byte()
        self.max_recvs = config.max_recvs()

        self.lock = threading.Condition(threading.Lock())
        self.wake = threading.Event()  # workers -> progress thread
        # Whoever holds the token may call MPI: the progress thread, or an idle worker
        # that polls for the message it waits for (cooperative progress: the worker that
        # will run the released task finds the message itself, and a worker posts its
        # own sends, with no hand-over between threads on the way).
        self.net_token = threading.Lock()
        self.pollers = 0  # idle workers polling the network (at most one)
        self.waiting = 0  # workers in lock.wait (a notify with none is skipped: it costs)
        self.state = dict.fromkeys(plan.tasks, WAITING)
        self.waits = dict(plan.waits)
        # the ready queue is a heap of each task's place in priority order (highest
        # first, ties by id): ints compare several times faster than the (-priority,
        # id) tuples it held, and a pop was a quarter of an empty task's time
        by_id = sorted(plan.tasks)
        prio = plan.priority
        self.in_order = sorted(by_id, key=prio.__getitem__, reverse=True)  # stable
        self.place = {t: i for i, t in enumerate(self.in_order)}
        self.ready: list[int] = []
        self.ntasks = len(plan.tasks)
        self._keeps_value: dict = {}  # task function -> whether its value is kept
        self._tile_arrays: dict[int, np.ndarray] = {}  # data -> its local tile
        self._remote_tiles: set[int] = set()  # data: tiles of other ranks
        self.recv_rows: list[tuple[Message, float, float, int]] = []  # traced in _finish
        self.done = 0
        self.outbox: list[int] = []  # finished tasks whose sends are still to post
        self.failure: dict | None = None  # first local failure, or a remote abort
        self.stopping = False
        self.values: dict[int, object] = {}
        self.received: dict[tuple[int, int], object] = {}  # (data, producer) -> buffer
        self.refs: dict[tuple[int, int], int] = {}  # readers left per received buffer
        self._running = 0
        self.started = [0.0] * self.nworkers  # each worker's task start, 0.0: none
        self.current = [-1] * self.nworkers  # each worker's task, -1: none
        self._abandoned: set[int] = set()  # workers the run no longer waits for
        self._stuck: list[str] = []  # their tasks, described for the error
        self._cancel: str | None = None  # a cancel's reason, until the progress thread acts
        self.mean_task = 1.0  # seconds, a running average (no task seen yet: long)
        # ... of the tasks run the moment their tile landed (none yet: short, so the
        # first holds the network token, and one long one is enough to stop that)
        self.direct_mean = 0.0
        self.recvs_left = len(plan.recvs)
        self.pickled: dict[int, bytes] = {}
        self._pickle_here = {
            t for t, msgs in plan.sends.items() if any(m.kind == "value" for m in msgs)
        }
        # sink values are shared with every rank at the end: pickled as their task ends,
        # so that one that cannot be pickled fails its task (and the run, on every rank)
        # instead of the collective that shares them
        if network.size > 1:
            self._pickle_here.update(plan.results)
        self.exception: BaseException | None = None
        self.trace_parts: list | None = None
        # tasks long enough that the progress thread should poll while they run
        self._long = {t for t in plan.tasks if graph.tasks[t].cost >= LONG_TASK}
        fns = {graph.tasks[t].fn for t in plan.tasks}
        self.short_task = (
            short_task_limit(fns) if self.nworkers > 1 else SHORT_TASK  # (one never parks)
        )
        self._limits = timeouts_by_function(fns, task_timeout)
        for t in plan.tasks:
            if self.waits[t] == 0:
                self._make_ready(t)

    # -- state -----------------------------------------------------------------------

    def _move(self, t: int, new: int) -> None:
        old = self.state[t]
        if old != _FROM[new]:
            raise RuntimeError(f"illegal move of task {t}: {State(old).name} -> {State(new).name}")
        self.state[t] = new

    def _make_ready(self, t: int) -> None:
        if self.state[t] != WAITING:  # (_move's check, inline: once per task)
            self._move(t, READY)  # raises
        self.state[t] = READY
        heapq.heappush(self.ready, self.place[t])

    def _count_down(self, tasks) -> int:
        """One event each of ``tasks`` waited for happened (a task ended, a message
        came or went); how many became ready. Lock held. Called once per event, not
        per task: this is on the way of every message."""
        woken = 0
        waits, state = self.waits, self.state
        for t in tasks:
            left = waits[t] - 1
            waits[t] = left
            if not left:  # (_make_ready, inline)
                if state[t] != WAITING:
                    self._move(t, READY)  # raises
                state[t] = READY
                heapq.heappush(self.ready, self.place[t])
                woken += 1
        return woken

    # -- workers ---------------------------------------------------------------------

    def _worker(self, index: int) -> None:
        lock = self.lock
        now = self.trace.clock
        waits = self.trace.waits  # (trace.waited, inline: it is on a message's path)
        lock.acquire()
        try:
            while True:
                if not self.ready and not self.stopping:
                    # waiting on the network if a task here still needs a message
                    on_network = self.recvs_left > 0
                    t_idle = now()
                    if on_network and self.net.size > 1 and self.pollers == 0:
                        # poll for it here; waking the progress thread now would only
                        # make the two take the network token from each other
                        if not self._idle_poll(index):
                            return
                    else:
                        self.wake.set()  # the progress thread should poll sooner
                    while not self.ready and not self.stopping:
                        self.waiting += 1
                        lock.wait()
                        self.waiting -= 1
                    waits[index][0 if on_network else 1] += now() - t_idle
                if self.stopping:
                    return
                if self._running and self.mean_task < self.short_task and self._park(index):
                    continue  # another worker ran the tasks meanwhile: look again
                t = self.in_order[heapq.heappop(self.ready)]
                if self.state[t] != READY:  # (_move's check, inline)
                    self._move(t, RUNNING)  # raises
                self.state[t] = RUNNING
                self._running += 1
                self.current[index] = t
                self.started[index] = start = now()
                lock.release()
                if t in self._long and self.net.size > 1:
                    self.wake.set()  # the progress thread polls while this task runs
                try:
                    value = self._call(t)
                    if t in self._pickle_here:  # a value another rank (or every one) reads
                        self.pickled[t] = commlib.dumps(value)
                except BaseException as exc:  # noqa: BLE001 - reported to every rank
                    lock.acquire()
                    if index in self._abandoned:
                        return  # the run ended without this task: touch nothing
                    self._running -= 1
                    self.trace.task(t, index, start, now(), TASK_FAILED)
                    self._fail(t, exc)
                    return
                if index in self._abandoned:  # back after the run ended without it
                    lock.acquire()
                    return
                end = now()
                # its sends first, if the network is free: they are the critical path
                # of another rank, the bookkeeping below is not
                sent = False
                if t in self.plan.sends and self.net.size > 1:
                    try:
                        sent = self._post_now(t)
                    except BaseException as exc:  # noqa: BLE001 - reported to every rank
                        lock.acquire()
                        self._running -= 1
                        self._fail(None, exc)
                        return
                lock.acquire()
                self._running -= 1
                self.started[index] = 0.0
                self.current[index] = -1
                # capped: a tiny task that waited for the GIL mid-way must not count as
                # long (two workers taking turns then kept each other from parking)
                self.mean_task += 0.1 * (min(end - start, 2 * self.short_task) - self.mean_task)
                self.trace.task(t, index, start, end, TASK_DONE)
                try:
                    self._finish(t, value, sent)
                except BaseException as exc:  # noqa: BLE001 - a runtime bug: fail loudly
                    self._fail(t, exc, state=DONE)
                    return
                if self.outbox and self.net.size > 1:  # post this task's sends now
                    lock.release()
                    try:
                        if self._try_poll() is None:  # another thread polls: hand over
                            self.wake.set()
                    except BaseException as exc:  # noqa: BLE001 - reported to every rank
                        lock.acquire()
                        self._fail(None, exc)
                        return
                    lock.acquire()
        finally:
            lock.release()

    def _park(self, index: int) -> bool:
        """Leave the ready tasks to the worker running short ones, until one of its
        tasks runs longer than ``PARK``. Lock held; True if this worker waited."""
        now = self.trace.clock
        t0 = now()
        parked = False
        while self.ready and not self.stopping and self.mean_task < self.short_task:
            busy = [s for s in self.started if s]
            # (its age counted from when this worker began to wait: before, this
            # worker held the GIL, and the other's task may only have waited for it)
            if not busy or now() - max(min(busy), t0) > PARK:
                break  # no worker runs a task, or one runs long: take a task
            parked = True
            self.waiting += 1
            self.lock.wait(PARK)
            self.waiting -= 1
        if parked:
            self.trace.waited(index, now() - t0, False)
        return parked

    def _idle_poll(self, index: int) -> bool:
        """An idle worker polls for the message it waits for. Lock held on entry and
        exit; False if the network failed (the run is then failing).

        Polls back to back for ``spin`` seconds after the last message (plus
        ``spin_per_byte`` per byte of the receives posted), then backs off
        (:func:`~taskgraph.run.comm.next_sleep`), as the progress thread does; stops as
        soon as a task is ready, and hands polling back to the progress thread.

        Where the oldest receive releases a task (:func:`direct_task`), the worker
        resolves that task's arguments before it polls (:meth:`_stage`), then tests
        that receive alone, and every 4th time the rest of the network too and that
        receive once more; the moment it lands (in any of those calls: MPI moves a
        message in whichever call finds it) the worker runs the task
        (:meth:`_run_direct`).
        """
        lock = self.lock
        clock = time.perf_counter
        self.pollers += 1
        sleep, last = 0.0, clock()
        try:
            token = self.net_token
            stats = self.stats
            active = self.recvs_active
            tried = None  # the receive a task was last staged for (or tried)
            staged = None  # see _stage
            while not self.ready and not self.stopping and self.recvs_left > 0:
                lock.release()
                got = False
                ran = None
                if token.acquire(blocking=False):  # (_try_poll, inline)
                    try:
                        full = True
                        direct = None
                        # stage the task the oldest receive releases, if any, once per
                        # receive and again whenever counters moved; before polling, so
                        # that a tile already there is taken the same way
                        if active and active[0] is not tried and not self.ready:
                            tried = active[0]
                            staged = self._stage(tried)
                        if staged is not None and active and active[0] is staged[0]:
                            full = False
                            if self.sends_active and self.waits[staged[2]] > 1:
                                got = self._test_sends()  # (a send the task waits for)
                            landed = staged[0].Test()
                            if not landed and stats.polls & 3 != 3:
                                stats.polls += 1
                            elif not landed:
                                # every 4th time, the rest of the network too, and then
                                # this receive again: a tile that lands during one of
                                # those calls is still taken here (1 MiB: 12 % of hops).
                                # (at polls = 3 mod 4: _poll counts itself, and probes
                                # every time it brings the count to 0 mod 8)
                                got = self._poll(True, skip_oldest=True) or got
                                landed = staged[0].Test()
                            if landed:
                                done_at = clock()
                                if self.waits[staged[2]] > 1 and self.sends_active:
                                    # the test that landed the tile may have completed
                                    # the send too (its acknowledgement comes first)
                                    got = self._test_sends() or got
                                if self.waits[staged[2]] == 1:
                                    direct = staged
                                else:  # a send it waits for is still out: as usual
                                    got = self._received([0], done_at) or got
                                staged = None
                        if full:
                            if self._poll(True):
                                got, tried = True, None
                    except BaseException as exc:  # noqa: BLE001 - reported to every rank
                        token.release()
                        lock.acquire()
                        self._fail(None, exc)
                        return False
                    if direct is None:
                        token.release()
                    else:
                        try:  # (it releases the token)
                            ran = self._run_direct(index, direct, done_at)
                        except BaseException as exc:  # noqa: BLE001 - reported to every rank
                            lock.acquire()
                            self._fail(None, exc)
                            return False
                if ran is not None:
                    self._direct_done(index, *ran)  # (returns with the lock held)
                    sleep, last = 0.0, clock()
                    continue
                if got:
                    lock.acquire()
                    if self.ready:
                        break  # (the clock below is on a message's way)
                    sleep, last = 0.0, clock()
                elif clock() - last < self.spin + self.posted_bytes * self.spin_per_byte:
                    # a message came moments ago (or the progress thread holds the token
                    # for a moment): the next is likely close. Longer for large messages:
                    # a rank asleep when one comes stalls its transfer (a 4 MiB
                    # ping-pong hop took 1.4x raw mpi4py's time with a flat 300 us)
                    # (a core to another thread only every 4th time: a sched_yield
                    # is 0.6 us here, a quarter of an idle poll)
                    spins = self.stats.spins = self.stats.spins + 1
                    if not spins & 3:
                        os.sched_yield()
                    lock.acquire()
                else:
                    lock.acquire()  # nothing came for a while
                    sleep = commlib.next_sleep(sleep, clock() - last, self.poll_max)
                    self.stats.sleeps += 1
                    self.waiting += 1
                    lock.wait(sleep)
                    self.waiting -= 1
        finally:
            if self.outbox or (not self.ready and not self.stopping):
                # no message left to wait for (sends may still be out), or a task's
                # sends wait for the token
                self.wake.set()
            # for a task, the progress thread is woken only if the task is long (see
            # _worker), or takes over within POLLED_SLEEP: a short task has this worker
            # back polling before it would matter, and waking the thread would make
            # this worker wait for the GIL
            self.pollers -= 1
        return True

    def _stage(self, req) -> tuple | None:
        """What :meth:`_run_direct` needs to run, the moment it lands, the task that
        the oldest posted receive ``req`` releases (:func:`direct_task`): (req, its
        entry, the task, its function and arguments, the tile of its one send if that
        is a tile, else None); None if there is no such task. Token held."""
        entry = self.recvs_active_msgs[0]
        msg, buf, _ = entry
        sending = [m for m, _ in self.sends_active_msgs] if self.sends_active else ()
        t = direct_task(msg, self.waits, self.state, self._long, sending)
        if t is None:
            return None
        task = self.graph.tasks[t]
        if task.kwargs:
            return None
        args = []
        for a in task.args:
            if a.__class__ is not Ref:
                args.append(a)
            elif a.data == msg.data:
                args.append(buf)  # (a task reads one version of a data)
            else:  # every other thing it reads is here: the message is all it waits for
                arr = self._tile_arrays.get(a.data)
                if arr is None:
                    try:
                        arr = self._fetch(a.data, task.reads)
                    except KeyError:  # (then the usual way says what is missing)
                        return None
                args.append(arr)
        sends = self.plan.sends.get(t, ())
        tile = self._payload(sends[0]) if len(sends) == 1 and sends[0].kind == "tile" else None
        return req, entry, t, task.fn.fn, args, tile

    def _run_direct(self, index: int, staged: tuple, done_at: float) -> tuple:
        """The receive :meth:`_stage` staged a task for landed: take it off the posted
        receives, run the task, post its sends. Token held on entry and released
        before this returns (or raises), lock not held; the caller then calls
        :meth:`_direct_done` with what this returns.

        While the tasks run this way are short (``direct_mean``), the task runs with the
        token held, so that its send goes out with nothing in between; else the token
        is free while it runs, for the other threads, and the send goes out if the
        token is free again after it (else with the next poll)."""
        _, entry, t, fn, args, tile = staged
        token = self.net_token
        held = True
        try:
            now = self.trace.clock
            self.state[t] = RUNNING  # (READY, then RUNNING: no other thread can reach t)
            self.current[index] = t
            self.started[index] = start = now()
            del self.recvs_active[0]
            del self.recvs_active_msgs[0]
            if self.direct_mean >= self.short_task:
                token.release()
                held = False
            value = exc = None
            ran = not self.stopping
            try:
                if ran:
                    value = fn(*args)
                    if t in self._pickle_here:
                        self.pickled[t] = commlib.dumps(value)
            except BaseException as e:  # noqa: BLE001 - reported to every rank
                exc = e
            end = now()
            sent = False
            if exc is None and ran and t in self.plan.sends and index not in self._abandoned:
                if not held:
                    held = token.acquire(blocking=False)
                if held:
                    sent = True
                    self._post_task_sends(t, tile, end)  # (its tile looked up when staged)
            return entry, done_at, t, value, exc, ran, start, end, sent
        finally:
            if held:
                token.release()

    def _direct_done(self, index, entry, done_at, t, value, exc, ran, start, end, sent) -> None:
        """The counters and the trace of a task :meth:`_run_direct` ran. Lock not held
        on entry, held on exit."""
        self.lock.acquire()
        if index in self._abandoned:
            return  # back after the run ended without this task: touch nothing
        try:
            self.started[index] = 0.0
            self.current[index] = -1
            self.waits[t] = 0
            self._delivered(entry, done_at, None)
            # (the worker counts its idle time from before it polled: this was not idle)
            self.trace.waits[index][0] -= end - start
            if not ran:
                self.state[t] = READY  # not run: the run is stopping
                return
            if exc is not None:
                self.trace.task(t, index, start, end, TASK_FAILED)
                self._fail(t, exc)
                return
            took = min(end - start, 2 * self.short_task)
            self.mean_task += 0.1 * (took - self.mean_task)
            self.direct_mean += 0.25 * (took - self.direct_mean)
            self.trace.task(t, index, start, end, TASK_DONE)
            self.stats.direct += 1
            self._finish(t, value, sent)
        except BaseException as e:  # noqa: BLE001 - a runtime bug: fail loudly
            self._fail(None, e)

    def _call(self, t: int):
        task = self.graph.tasks[t]
        reads, fetch, local = task.reads, self._fetch, self._tile_arrays
        args = []  # a loop, not a comprehension: that is a function call of its own
        for a in task.args:
            if a.__class__ is Ref:
                arr = local.get(a.data)  # a local tile seen before: no call
                args.append(fetch(a.data, reads) if arr is None else arr)
            else:
                args.append(a)
        if task.kwargs:
            kwargs = {
                k: fetch(v.data, reads) if v.__class__ is Ref else v for k, v in task.kwargs.items()
            }
            return task.fn.fn(*args, **kwargs)
        return task.fn.fn(*args)

    def _fetch(self, d: int, reads: tuple):
        """The local array or value of the data a task uses (``reads``: the
        versions it reads)."""
        arr = self._tile_arrays.get(d)
        if arr is not None:
            return arr
        if d not in self._remote_tiles:
            item = self.graph.data[d]
            tile = item.tile
            if tile is not None:
                arr = tile.matrix.tiles.get((tile.i, tile.j))
                if arr is not None:
                    self._tile_arrays[d] = arr  # (tiles are made with their matrix)
                    return arr
                self._remote_tiles.add(d)  # another rank's: received, every time
            elif item.producer in self.values:
                return self.values[item.producer]
        for data, producer in reads:  # received: the version this task reads
            if data == d:
                return self.received[d, producer]
        raise KeyError(f"task reads data {d} but no version of it")

    def _post_now(self, t: int) -> bool:
        """Post task t's sends unless another thread polls; True if this thread took
        them (some may wait for a free slot). Lock not held."""
        token = self.net_token
        if not token.acquire(blocking=False):
            return False
        try:
            self._post_task_sends(t)
        finally:
            token.release()
        return True

    def _finish(self, t: int, value, sent: bool = False) -> None:
        """Task t ended well: count down what waited for it (``sent``: its sends are
        taken already). Lock held."""
        if self.recv_rows:
            self._record_receives()
        self._move(t, DONE)
        self.done += 1
        task = self.graph.tasks[t]
        fn = task.fn
        keep = self._keeps_value.get(fn)
        if keep is None:  # a kernel writes its tiles; a plain function returns a value
            keep = self._keeps_value[fn] = not hasattr(fn, "modes")
        if keep:
            self.values[t] = value
        woken = self._count_down(self.plan.successors[t])
        if self.refs:  # received data this task was among the last to read
            for d, prod in task.reads:
                key = (d, prod)
                readers = self.refs.get(key)
                if readers is not None:
                    if readers == 1:
                        del self.refs[key]
                        buf = self.received.pop(key)
                        if isinstance(buf, np.ndarray):
                            self.pool.put(buf)
                    else:
                        self.refs[key] = readers - 1
        if woken > 1 and self.waiting:
            self.lock.notify(woken - 1)  # this worker takes one itself
        if t in self.plan.sends and not sent:
            self.outbox.append(t)  # the worker posts them itself if it can (see _worker)
            if self.net.size == 1:
                self.wake.set()
        if self.done == self.ntasks:
            self.wake.set()

    def _record_receives(self) -> None:
        """Trace the receives completed since the last call. Lock held (or threads
        joined). A row (a call and six stores, 0.4 us with NumPy rows) was on the way
        from a message to the task it releases: the worker records it after that task."""
        rows, self.recv_rows = self.recv_rows, []
        message = self.trace.message
        for msg, posted, done_at, nbytes in rows:
            message(msg.src, nbytes, msg.tag, posted, -1, done_at)

    def _fail(
        self, t: int | None, exc: BaseException, state: int = RUNNING, cancel: bool = False
    ) -> None:
        """Task t raised (or the runtime did, t None; ``cancel``: a cancel): stop this
        rank. Lock held."""
        if t is not None and state == RUNNING:
            self._move(t, FAILED)
        if self.failure is None:
            self.failure = {
                "task": self.graph.label(t) if t is not None else None,
                "rank": self.net.rank,
                "size": self.net.size,
                "host": self.net.host,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc)),
                "origin": True,
                "cancel": cancel,
            }
            self.exception = exc
        self.stopping = True
        self.lock.notify_all()
        self.wake.set()

    def _check_timeouts(self) -> None:
        """Fail the run if a worker's task has run past its time limit; that worker is
        abandoned (interrupted by :meth:`_join_workers`). Lock held."""
        now = time.perf_counter()
        tasks = self.graph.tasks
        for i, t in enumerate(self.current):
            start = self.started[i]
            if t < 0 or not start or i in self._abandoned:
                continue
            limit = self._limits.get(tasks[t].fn)
            if limit is not None and now - start > limit:
                self._abandoned.add(i)
                self.trace.task(t, i, start, now, TASK_FAILED)
                self._fail(t, TimeoutError(f"timed out after {limit:g} s"))

    def _join_workers(self, threads: list[threading.Thread]) -> None:
        """Wait for the workers to stop (the run is stopping). A worker whose task timed
        out is interrupted at once; one still in its task ``STOP_GRACE`` seconds later
        is interrupted and abandoned: the run ends without it, it touches nothing of
        the run if it ever comes back, and its task is named in the error. It holds
        neither the lock nor the network token meanwhile (both are free while a task
        runs, but for a short task run the moment its tile lands, whose token no call
        of the ending run needs). Nothing waits for an abandoned thread: it is a
        daemon, and a task stuck in a C call stays stuck until the process exits."""
        for i in sorted(self._abandoned):
            interrupt_thread(threads[i])
        deadline = time.monotonic() + STOP_GRACE
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        late = [i for i, th in enumerate(threads) if th.is_alive()]
        if not late:
            return
        with self.lock:
            cancel = bool(self.failure and self.failure.get("cancel"))
            when = "after cancel" if cancel else "after the run stopped"
            now = time.perf_counter()
            for i in late:
                t, start = self.current[i], self.started[i]
                if i in self._abandoned or t < 0:
                    self._abandoned.add(i)
                    continue
                self._abandoned.add(i)
                if start:
                    self.trace.task(t, i, start, now, TASK_FAILED)
                self._stuck.append(
                    f"task {self.graph.label(t)} on rank {self.net.rank}/{self.net.size} "
                    f"still running {when} (abandoned after {STOP_GRACE:g} s)"
                )
        for i in late:
            interrupt_thread(threads[i])

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks in all) on this rank."""
        return self.done, len(self.plan.tasks)

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the run on this rank (and, through the abort, on every rank).

        Safe from any thread, any number of times, during or after the run, and from a
        signal handler: it takes no lock, only records ``reason`` (the first cancel's
        stands) and wakes the progress thread, which fails the run within ``WATCH``
        seconds. A task still running ``STOP_GRACE`` seconds later is abandoned and
        named in the error (see :meth:`_join_workers`)."""
        if self._cancel is None:
            self._cancel = reason
            self.wake.set()

    # -- the progress loop -----------------------------------------------------------

    def run(self) -> None:
        """Run this rank's tasks; raise TaskError if any rank failed."""
        t0 = time.perf_counter()
        if self.net.size > 1:
            self.net.barrier()  # line the ranks' clocks up
        self.trace.start()
        self._init_network()
        threads = [
            threading.Thread(
                target=self._worker, args=(i,), name=f"taskgraph-worker-{i}", daemon=True
            )
            for i in range(self.nworkers)
        ]
        for th in threads:
            th.start()
        try:
            self._progress()
        except BaseException as exc:  # noqa: BLE001 - a bug in the loop, or an interrupt
            with self.lock:
                self._fail(None, exc)
        finally:
            with self.lock:
                self.stopping = True
                self.lock.notify_all()
            self._join_workers(threads)
        self.trace.wall = self.trace.now()
        self._record_receives()
        self._conclude()
        self.stats.tasks = self.done
        self.stats.seconds = time.perf_counter() - t0

    def _init_network(self) -> None:
        self.sends_waiting: deque[Message] = deque(self.plan.sends.get(INITIAL, ()))
        self.sends_active: list = []
        self.sends_active_msgs: list[tuple[Message, float]] = []
        self.recvs_todo: deque[Message] = deque(m for m in self.plan.recvs if m.kind == "tile")
        self.expected = {(m.src, m.tag): m for m in self.plan.recvs}
        self.recvs_active: list = []
        self.recvs_active_msgs: list[tuple[Message, np.ndarray | bytearray, float]] = []
        self.posted_bytes = 0

    def _poll(self, quick: bool = False, skip_oldest: bool = False) -> bool:
        """One pass over the network; True if anything happened. Token held.

        ``quick`` (an idle worker spinning): of the receives posted, test the oldest
        only, and all of them every 4th poll. Messages mostly arrive in the order they
        were posted, and a Testsome over 16 receives was 2 of an idle poll's 5.4 us.
        ``skip_oldest``: the caller tests the oldest receive itself (see
        :meth:`_idle_poll`); the others are tested, all of them, whatever ``quick``.
        """
        busy = False
        if self.outbox:  # appended under the lock; a late one is taken next poll
            with self.lock:
                finished, self.outbox = self.outbox, []
            sends = self.plan.sends
            for t in finished:
                self.sends_waiting.extend(sends[t])
            busy = True
        # each step only when it has something to do: this is the path of every message
        if self.sends_waiting and self._post_sends():
            busy = True
        if self.recvs_todo and self._post_recvs():
            busy = True
        # sends first: a completed receive then ends the poll, and the task it releases
        # starts without the sends' bookkeeping in between
        if self.sends_active and self._test_sends():
            busy = True
        if skip_oldest:
            tested = len(self.recvs_active) > 1 and self._test_recvs(skip_oldest=True)
        elif self.recvs_active:
            tested = self._test_recvs(not quick or not self.stats.polls & 3)
        else:
            tested = False
        if tested:
            # a task may be ready: back to it now, and probe only every 8th time
            polls = self.stats.polls = self.stats.polls + 1
            if polls & 7:
                return True
            return self._probe() or True
        self.stats.polls += 1
        # unexpected messages (values, signals, aborts, tiles beyond the posted
        # window) when nothing else happened, and at least every 8th poll. Probing only
        # every 4th idle poll made the 8 B hop slower, not faster (18 -> 19-26 us over
        # three alternations), though each poll was shorter
        if (not busy or not self.stats.polls & 7) and self._probe():
            busy = True
        return busy

    def _try_poll(self, quick: bool = False) -> bool | None:
        """Poll unless another thread is polling (then None). Lock not held."""
        if not self.net_token.acquire(blocking=False):
            return None
        try:
            return self._poll(quick)
        finally:
            self.net_token.release()

    def _transfers_left(self) -> bool:
        return bool(
            self.outbox
            or self.sends_waiting
            or self.sends_active
            or self.recvs_left
            or self.recvs_active
        )

    def _progress(self) -> None:
        net = self.net
        ntasks = len(self.plan.tasks)
        clock = time.perf_counter
        sleep, idle_since = 0.0, clock()
        while True:
            with self.lock:
                if self._cancel is not None and self.failure is None:
                    self._fail(None, RunError(self._cancel), cancel=True)
                if self._limits:
                    self._check_timeouts()
                failed = self.failure is not None
                all_done = self.done == ntasks
                pollers = self.pollers
            if failed:
                return
            busy = False
            if net.size > 1 and not pollers:  # else an idle worker polls: let it
                busy = bool(self._try_poll())
            if all_done:
                with self.net_token:  # no worker is half-way through a poll
                    if not self._transfers_left():
                        return
            if busy:
                sleep, idle_since = 0.0, clock()
                continue
            if not pollers and (net.size == 1 or not self._transfers_left()):
                # nothing to poll: sleep until a worker hands over (or a cancel)
                self.wake.wait(WATCH if net.size > 1 or self._limits else None)
            else:
                if pollers:
                    # a worker polls, and wakes this thread when it starts a long task
                    # or stops polling: look now and then only. Waking every poll_max
                    # took the core (and the GIL) from the worker on the path of every
                    # message: a ping-pong's mean hop up to 1.4x, its p90 2.5x as long
                    # (at once, not doubling up to it: the wake-ups of that doubling
                    # slowed the first millisecond of a run, a dozen 1 MiB hops)
                    sleep = POLLED_SLEEP
                else:
                    # back off: poll often while a worker is idle; while every worker
                    # computes, latency is hidden, so leave their cores alone
                    busy_workers = self._running >= self.nworkers
                    cap = 10 * self.poll_max if busy_workers else self.poll_max
                    sleep = commlib.next_sleep(sleep, clock() - idle_since, cap)
                self.stats.sleeps += 1
                if self.wake.wait(sleep):
                    # handed work (a worker stopped polling, or starts a long task):
                    # back off afresh. Counting the whole time a worker polled as this
                    # thread's idle wait made its next sleep 5 % of the run so far: at
                    # the end of a ping-pong, the last send's completion noticed up to
                    # 5 ms late (1.3 ms in a 256-hop run of 1 MiB, 5 us a hop)
                    sleep, idle_since = 0.0, clock()
            self.wake.clear()

    def _post_sends(self) -> bool:
        posted = False
        while self.sends_waiting and len(self.sends_active) < self.max_sends:
            self._post_send(self.sends_waiting.popleft())
            posted = True
        return posted

    def _post_task_sends(self, t: int, payload=None, at: float | None = None) -> None:
        """Post task t's sends, or queue them for a free slot. Token held. ``payload``
        and ``at``: see :meth:`_post_send` (for a task with one send)."""
        msgs = self.plan.sends[t]
        if len(msgs) == 1 and not self.sends_waiting and len(self.sends_active) < self.max_sends:
            self._post_send(msgs[0], payload, at)  # the common case: one message, a free slot
        else:
            self.sends_waiting.extend(msgs)
            self._post_sends()

    def _post_send(self, msg: Message, payload=None, at: float | None = None) -> None:
        """Post one send (a slot is free). Token held. ``payload``: the message's
        buffer if known (else looked up); ``at``: the time traced as its posting (else
        now)."""
        if payload is None:
            payload = self._tile_arrays.get(msg.data) if msg.kind == "tile" else None
            if payload is None:
                payload = self._payload(msg)
        if at is None:
            at = self.trace.clock()  # before the call: the message may land before it returns
        active = self.sends_active
        active.append(self.net.isend(payload, msg.dst, msg.tag))
        self.sends_active_msgs.append((msg, at))
        stats = self.stats
        stats.sent += 1
        stats.bytes_sent += msg.nbytes if msg.kind != "value" else len(payload)
        if len(active) > stats.peak_sends:
            stats.peak_sends = len(active)

    def _payload(self, msg: Message):
        if msg.kind == "tile":
            arr = self._tile_arrays.get(msg.data)
            if arr is None:
                tile = self.graph.data[msg.data].the_tile
                arr = self._tile_arrays[msg.data] = tile.matrix.tiles[tile.i, tile.j]
            return arr
        if msg.kind == "value":
            return self.pickled[msg.producer]
        return b""

    def _post_recvs(self) -> bool:
        posted = False
        # ahead of need, but only as many bytes as stay in cache (and always one): a
        # receive lands in a pooled buffer, and a window of 16 buffers of 1 MiB made a
        # 1 MiB ping-pong 1.6x slower than one or two (in one job, 12 alternations of
        # 400 hops: a budget of 1 MiB 175 us a hop, 2 MiB 179, 4 MiB 206)
        while self.recvs_todo and (
            not self.recvs_active
            or (
                self.posted_bytes + self.recvs_todo[0].nbytes <= self.recv_budget
                and len(self.recvs_active) < self.max_recvs
            )
        ):
            msg = self.recvs_todo.popleft()
            if (msg.src, msg.tag) not in self.expected:
                continue  # arrived early, already taken by the probe
            del self.expected[msg.src, msg.tag]
            buf = self._tile_buffer(msg)
            self._start_recv(msg, self.net.irecv(buf, msg.src, msg.tag), buf)
            posted = True
        return posted

    def _tile_buffer(self, msg: Message) -> np.ndarray:
        assert msg.shape is not None and msg.dtype is not None
        return self.pool.get(msg.shape, msg.dtype)

    def _start_recv(self, msg: Message, req, buf) -> None:
        self.recvs_active.append(req)
        self.recvs_active_msgs.append((msg, buf, self.trace.clock()))
        self.posted_bytes += msg.nbytes

    def _probe(self) -> bool:
        got = False
        while True:
            found = self.net.probe()
            if found is None:
                return got
            got = True
            handle, src, tag, nbytes = found
            if tag == CONTROL_TAG:
                ctl = bytearray(nbytes)
                self.net.recv_probed(handle, ctl).Wait()
                info = commlib.loads(ctl)
                assert isinstance(info, dict)
                self._remote_abort(info)
                continue
            msg = self.expected.pop((src, tag), None)
            if msg is None:
                raise RunError(
                    f"rank {self.net.rank} got an unplanned message (source {src}, tag {tag})"
                )
            buf = self._tile_buffer(msg) if msg.kind == "tile" else bytearray(nbytes)
            self._start_recv(msg, self.net.recv_probed(handle, buf), buf)

    def _test_recvs(self, full: bool = True, skip_oldest: bool = False) -> bool:
        """Test the posted receives (``full`` False: the oldest only; ``skip_oldest``:
        all but the oldest, ``full`` or not), deliver those that completed; True if any
        did. Token held."""
        if skip_oldest:
            done = [i + 1 for i in self.net.test_some(self.recvs_active[1:])]
        else:
            done = self.net.test_some(self.recvs_active, full)
        if not done:
            return False
        # traced by the worker after its task (see _finish), not on the task's way
        return self._received(done, self.trace.clock())

    def _received(self, done: list[int], done_at: float) -> bool:
        """The posted receives at indices ``done`` completed: take them off, deliver
        them, count down their readers. Token held; True."""
        if len(done) == 1:  # (_take's common case, inline: this is a message's way)
            finished: list | tuple = (self.recvs_active_msgs.pop(done[0]),)
            del self.recvs_active[done[0]]
        else:
            finished = _take(done, self.recvs_active, self.recvs_active_msgs)
        values = None  # unpickled before the lock is taken
        for msg, buf, _ in finished:
            if msg.kind == "value":
                if values is None:
                    values = {}
                values[msg.tag, msg.src] = commlib.loads(buf)
        self.lock.acquire()  # (not `with`: Condition.__enter__ is a Python call)
        try:
            woken = 0
            for entry in finished:
                self._delivered(entry, done_at, values)
                woken += self._count_down(entry[0].consumers)
            if woken and self.waiting:
                self.lock.notify(woken)
        finally:
            self.lock.release()
        return True

    def _delivered(self, entry: tuple, done_at: float, values: dict | None) -> None:
        """A receive completed (``entry``: its message, buffer and posting time;
        ``values``: the unpickled values by (tag, source)): its data is here for its
        readers. Lock held; the caller counts down the readers."""
        msg, buf, posted = entry
        kind = msg.kind
        nbytes = msg.nbytes
        # (a value's planned size is a guess: its real one is the pickle received)
        real = nbytes if kind != "value" else len(buf)
        if self.trace.enabled:
            self.recv_rows.append((msg, posted, done_at, real))
        self.recvs_left -= 1
        self.posted_bytes -= nbytes
        stats = self.stats
        stats.received += 1
        stats.bytes_received += real
        if kind != "signal":
            key = (msg.data, msg.producer)
            self.received[key] = buf if kind == "tile" else values[msg.tag, msg.src]  # type: ignore[index]
            self.refs[key] = len(msg.consumers)

    def _test_sends(self) -> bool:
        done = self.net.test_some(self.sends_active)
        if not done:
            return False
        finished = _take(done, self.sends_active, self.sends_active_msgs)
        self.lock.acquire()
        try:
            woken = 0
            for msg, posted in finished:
                nbytes = msg.nbytes if msg.kind != "value" else len(self.pickled[msg.producer])
                self.trace.message(msg.dst, nbytes, msg.tag, posted, +1)
                woken += self._count_down(msg.release)
            if woken and self.waiting:
                self.lock.notify(woken)
        finally:
            self.lock.release()
        return True

    def _remote_abort(self, info: dict) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = dict(info, origin=False)
            self.stopping = True
            self.lock.notify_all()

    # -- the end: every rank agrees on the outcome -----------------------------------

    def _conclude(self) -> None:
        net = self.net
        failure = self.failure
        if net.size > 1:
            if failure is not None:
                if failure.get("origin"):
                    self._send_abort(failure)
                self._abandon_transfers()
            net.barrier_start()
            sleep, t0 = 0.0, time.perf_counter()
            while not net.barrier_done():
                if failure is None and self._cancel is not None:
                    failure = self._cancel_late()  # this rank's share is done, not the run
                found = net.probe()  # aborts sent to a rank that already finished
                if found is not None and found[2] == CONTROL_TAG:
                    buf = bytearray(found[3])
                    net.recv_probed(found[0], buf).Wait()
                    continue
                sleep = commlib.next_sleep(sleep, time.perf_counter() - t0, self.poll_max)
                time.sleep(sleep)
            outcomes = net.allgather(
                (failure if failure and failure.get("origin") else None, self._stuck)
            )
            origins = [o for o, _ in outcomes if o is not None]
            failure = origins[0] if origins else failure
            stuck = [s for _, part in outcomes for s in part]
        else:
            stuck = self._stuck
        if failure is not None and stuck:
            failure = dict(failure, error=f"{failure['error']}; " + "; ".join(stuck))
        if self.trace.enabled:  # every rank's events, on rank 0 (failed runs too)
            self.trace_parts = net.gather(self.trace.batch()[0], 0)
        results: dict[int, object] = dict(self.values)  # made here, and every sink
        try:
            if failure is None:  # (every sink value was pickled as its task ended)
                mine = {t: self.pickled[t] for t in self.plan.results if t in self.pickled}
                for rank, part in enumerate(net.allgather(mine)):
                    if rank != net.rank:
                        results.update((t, commlib.loads(b)) for t, b in part.items())
        finally:
            net.close(retire=failure is not None)
        self.graph.results.update(results)
        if failure is not None and failure["task"] is None:  # a cancel, or a runtime fault
            raise RunError(
                f"run {self.graph.name!r} stopped on rank {failure['rank']}/{failure['size']} "
                f"({failure['host']}): {failure['error']}"
            ) from (
                self.exception
                if failure["rank"] == net.rank
                else RemoteTraceback(failure["traceback"])
            )
        if failure is not None:
            err = TaskError(
                failure["task"],
                failure["rank"],
                failure["size"],
                failure["host"],
                failure["error"],
                failure["traceback"],
            )
            here = failure.get("origin") and failure["rank"] == net.rank
            cause = self.exception if here else None
            raise err from (cause or RemoteTraceback(failure["traceback"]))

    def _cancel_late(self) -> dict:
        """A cancel came after this rank's tasks ended, while it waits for the others:
        stop them (an abort), and be the origin of the outcome. Returns the failure."""
        with self.lock:
            self._fail(None, RunError(self._cancel), cancel=True)
            failure = self.failure
        assert failure is not None
        self._send_abort(failure)
        return failure

    def _send_abort(self, failure: dict) -> None:
        data = commlib.dumps(failure)
        reqs = [
            self.net.isend(data, r, CONTROL_TAG) for r in range(self.net.size) if r != self.net.rank
        ]
        deadline = time.monotonic() + 2.0
        pending = list(reqs)
        while pending and time.monotonic() < deadline:
            done = set(self.net.test_some(pending))
            pending = [r for i, r in enumerate(pending) if i not in done]
            time.sleep(1e-3)
        self.net.abandon(pending)

    def _abandon_transfers(self) -> None:
        self.net.cancel(self.recvs_active)
        self.net.abandon(self.sends_active)
        self.recvs_active, self.sends_active = [], []
