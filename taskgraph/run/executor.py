"""Per-rank execution of a plan: the threads of one rank's run, and how they meet.

Every rank runs one :class:`Executor` over its :class:`~taskgraph.plan.RankPlan`;
there is no central scheduler. The executor starts the threads and wires the parts::

    workers (N, taskgraph.run.workers)     progress thread (the one that called run)
    ──────────────────────────────────     ─────────────────────────────────────────
    pop the ready task of highest          polls the network (taskgraph.run.transfers)
    priority (taskgraph.run.schedstate),   while no worker does: posts sends and
    run it, then under the lock count ──►  receives, tests them, probes for values,
    down its successors, post its sends    signals and aborts; watches time limits
    (or hand them over)                    and cancels

- :mod:`~taskgraph.run.schedstate`: the scheduling state (task states, counters, ready
  heap) and its one ``move``;
- :mod:`~taskgraph.run.transfers`: the network token and every MPI call of a run;
- :mod:`~taskgraph.run.workers` and :mod:`~taskgraph.run.direct`: the worker loop, and
  tasks run the moment their tile lands;
- :mod:`~taskgraph.run.dynamic` and :mod:`~taskgraph.run.steal`: calls that running
  tasks spawn (``tg.spawn``), the pool workers help from while they wait, and the
  stealing of those calls between ranks (only where the graph has plain functions);
- :mod:`~taskgraph.run.outcome`: fail, abort, and every rank agreeing on the outcome;
- :mod:`~taskgraph.run.tuning`: the numbers the loops run by.

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

import threading
import time
from collections import deque

import numpy as np

from ..core.errors import RunError
from ..dsl.graph import Graph
from ..dsl.options import NO_RUN_OPTIONS, RunOptions
from ..plan.planner import RankPlan
from ..trace.recorder import TASK_FAILED, Recorder
from . import attempts, doorbell
from . import comm as commlib
from .buffers import BufferPool, Stats, gc_frozen
from .context import TaskAbandoned, interrupt_thread
from .direct import DirectPath, direct_task
from .dynamic import SpawnRunner
from .launcher import Launcher
from .outcome import Failure, OutcomeProtocol
from .schedstate import DONE, FAILED, READY, RUNNING, WAITING, SchedState, State
from .steal import Stealer, idle_depth
from .transfers import Transfers, _take
from .tuning import (
    SHORT_KERNEL,
    SHORT_TASK,
    STOP_GRACE,
    Tuning,
    poll_while_computing,
    short_task_limit,
    timeouts_by_function,
)
from .workers import WorkerLoop

__all__ = [
    "DONE",
    "FAILED",
    "READY",
    "RUNNING",
    "SHORT_KERNEL",
    "SHORT_TASK",
    "STOP_GRACE",
    "WAITING",
    "BufferPool",
    "Executor",
    "Failure",
    "State",
    "Stats",
    "TaskAbandoned",
    "Tuning",
    "_take",
    "direct_task",
    "gc_frozen",
    "interrupt_thread",
    "short_task_limit",
    "timeouts_by_function",
]


class Executor(WorkerLoop, DirectPath, SpawnRunner, OutcomeProtocol):
    """Runs one rank's share of a plan.

    Guarded by ``lock`` (a Condition): ``sched`` (the scheduling state), ``stopping``,
    ``failure`` and ``exception`` (the first failure), ``values`` (values of the tasks
    run here), ``waiting`` (workers in ``lock.wait``: a notify with none is skipped),
    ``pollers`` (idle workers polling: at most one), ``_running`` (workers in a task),
    ``current``/``started`` (each worker's task and its start; written by their worker
    also without the lock, read by others as a hint), ``_abandoned`` and ``_stuck``,
    ``mean_task`` and ``direct_mean`` (running averages of task times),
    ``_keeps_value``, and the spawned calls' fields (see
    :class:`~taskgraph.run.dynamic.SpawnRunner`). Guarded by the network token
    (``transfers.token``): ``transfers``' queues (see :class:`~taskgraph.run.transfers.Transfers`).
    ``pickled`` is written by the thread that ran the task, before its sends are
    posted. ``_cancel`` is written without a lock (see :meth:`cancel`). ``results``:
    set when :meth:`run` ends (values made here and every sink's)."""

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
        open: bool = False,
        options: RunOptions = NO_RUN_OPTIONS,
    ):
        """``graph`` and ``plan``: what to run (this rank's share); ``network``: this
        run's communicator; ``workers``: worker threads; ``pool``: receive buffers kept
        between runs; ``trace``: record events; ``task_timeout``: seconds a task may run
        unless its function has a ``timeout`` of its own (None: no limit). A task past
        its limit fails the run with a TaskError naming it, on every rank; its thread is
        interrupted and abandoned (see :func:`interrupt_thread`). ``compile_seconds``:
        the time spent compiling kernels before the run, traced apart from its time.
        ``open``: the run takes calls from outside its tasks (:meth:`submit`) and does
        not end before :meth:`close_submissions`. ``options``: the run's failure policy,
        checkpoint and launch throttle (:class:`~taskgraph.dsl.options.RunOptions`)."""
        self.graph = graph
        self.options = options
        self.plan = plan
        self.net = network
        self.nworkers = max(1, workers)
        self.pool = pool if pool is not None else BufferPool()
        self.stats = Stats()
        self.launcher = Launcher(self)
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
        fns = {graph.tasks[t].fn for t in plan.tasks}
        self.tuning = Tuning.from_config(fns, self.nworkers)
        base = threading.Lock()
        self.lock = threading.Condition(base)
        # threads waiting for a spawned call wait apart: a static task's notify is
        # for an idle worker
        self.spawn_cv = threading.Condition(base)
        self.spool: deque = deque()  # spawned calls not started yet (oldest first)
        self.spawn_waiting = 0
        self.calls_ended = 0  # spawned calls that ended here (tg.as_completed waits on it)
        self.calls_failed = 0  # ... of them failed (tg.wait and the join raise at once)
        self.calls_finished = 0  # calls spawned or submitted here that ended (anywhere)
        self.orphans: set[int] = set()  # ids of calls running whose failed parent went on
        self.spawned_running = 0
        self.wait_depths: list[int] = []
        self.accepting = open
        self.submitted_left = 0
        self._frames: list[list] = [[] for _ in range(self.nworkers)]
        self._handed: dict[threading.Thread, list] = {}  # timed waits' calls' threads: stacks
        self._nested_static = [0] * self.nworkers  # static tasks run inside a wait (workers)
        self.wake: threading.Event | doorbell.Doorbell = threading.Event()  # workers -> progress
        self.pollers = 0
        self.waiting = 0
        self.sched = SchedState({t: plan.waits[t] for t in plan.tasks}, plan.priority)
        self._keeps_value: dict = {}  # task function -> whether its value is kept
        self._tile_arrays: dict[int, np.ndarray] = {}  # data -> its local tile
        self._remote_tiles: set[int] = set()  # data: tiles of other ranks
        self.failure: Failure | None = None  # first local failure, or a remote abort
        self.exception: BaseException | None = None
        self.stopping = False
        self.values: dict[int, object] = {}
        self.results: dict[int, object] = {}
        self._running = 0
        self.started = [0.0] * self.nworkers  # each worker's task start, 0.0: none
        self.current = [-1] * self.nworkers  # each worker's task, -1: none
        self._abandoned: set[int] = set()  # workers the run no longer waits for
        self._stuck: list[str] = []  # their tasks, described for the error
        self.abort_sent = False  # this rank's failure went out before the join (outcome)
        self._cancel: str | None = None  # a cancel's reason, until the progress thread acts
        self.mean_task = 1.0  # seconds, a running average (no task seen yet: long)
        # ... of the tasks run the moment their tile landed (none yet: short, so the
        # first holds the network token, and one long one is enough to stop that)
        self.direct_mean = 0.0
        self.pickled: dict[int, bytes] = {}
        self._pickle_here = {
            t for t, msgs in plan.sends.items() if any(m.kind == "value" for m in msgs)
        }
        # sink values are shared with every rank at the end: pickled as their task ends,
        # so that one that cannot be pickled fails its task instead of the collective
        if network.size > 1:
            self._pickle_here.update(plan.results)
        self.trace_parts: list | None = None
        # tasks long enough that the progress thread should poll while they run
        self._long = {t for t in plan.tasks if graph.tasks[t].cost >= self.tuning.long_task}
        # tasks the direct path leaves alone: long ones, and writers of other ranks' data
        self._not_direct = self._long | set(plan.foreign) if plan.foreign else self._long
        if plan.foreign:  # (an instance attribute: the usual _call stays as it is)
            self._call = self._call_foreign  # type: ignore[method-assign]
        for d, home in plan.homes.items():  # plain data homed here: the user's own object
            if home == network.rank:
                self._tile_arrays[d] = graph.data[d].item.value  # type: ignore[union-attr]
        self._limits = timeouts_by_function(fns, task_timeout)
        self.transfers = Transfers(
            self,
            network,
            graph,
            plan,
            self.sched,
            self.pool,
            self.tuning,
            self._tile_arrays,
            self.pickled,
        )
        # spawned calls may move between ranks where plain functions run (a graph of
        # kernels alone never asks: every rank decides alike, from the same graph)
        self.steal: Stealer | None = None
        if network.size > 1 and graph._values:
            self.steal = self.transfers.steal = Stealer(self, network)
            self.wake = doorbell.make()  # (other ranks ring it: see Stealer.connect)
        # whether the progress thread polls while every worker computes (see there)
        self._poll_computing = poll_while_computing(
            network.cores > self.nworkers, network.single_copy_node, self.steal is not None
        )
        attempts.install(self)  # failure policies, checkpoint (plain runs: no change)

    @property
    def net_token(self) -> threading.Lock:
        """The network token (owned by :attr:`transfers`)."""
        return self.transfers.token

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
                if attempts.expire(self, i, now):
                    continue  # an attempt under a failure policy: that attempt failed
                self._abandoned.add(i)
                self.trace.task(t, i, start, now, TASK_FAILED)
                self._fail(t, TimeoutError(f"timed out after {limit:g} s"))

    def _join_workers(self, threads: list[threading.Thread]) -> None:
        """Wait for the workers to stop (the run is stopping). A worker whose task timed
        out is interrupted at once; one still in its task ``stop_grace`` seconds later
        is interrupted and abandoned: the run ends without it, it touches nothing of
        the run if it ever comes back, and its task is named in the error. It holds
        neither the lock nor the network token meanwhile (both are free while a task
        runs, but for a short task run the moment its tile lands, whose token no call
        of the ending run needs). Nothing waits for an abandoned thread: it is a
        daemon, and a task stuck in a C call stays stuck until the process exits."""
        for i in sorted(self._abandoned):
            interrupt_thread(threads[i])
        grace = self.tuning.stop_grace
        deadline = time.monotonic() + grace
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        with self.lock:  # (threads running calls that timed waits handed over)
            handed = list(self._handed)
        for th in handed:
            th.join(max(0.0, deadline - time.monotonic()))
            if th.is_alive():
                interrupt_thread(th)  # (as a worker's: it stops at its next bytecode)
        late = [i for i, th in enumerate(threads) if th.is_alive()]
        if not late:
            return
        with self.lock:
            cancel = self.failure is not None and self.failure.cancel
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
                    f"still running {when} (abandoned after {grace:g} s)"
                )
        for i in late:
            interrupt_thread(threads[i])

    def progress(self) -> tuple[int, int]:
        """(tasks done, tasks in all) on this rank; (0, 0) in a run of submitted calls
        only (its one task is the runtime's: see cluster.submit.ensemble_graph)."""
        if self.graph.internal:
            return 0, 0
        return self.sched.done, self.sched.ntasks

    def counts(self) -> dict[str, int]:
        """What a progress batch counts on this rank: tasks ``done`` of ``total``, and
        the spawned and submitted ``calls`` ended (see ``calls_finished``)."""
        done, total = self.progress()
        return {"done": done, "total": total, "calls": self.calls_finished}

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

    def run(self) -> None:
        """Run this rank's tasks; raise TaskError if any rank failed (RunError for a
        cancel or a runtime fault). :attr:`results` is set either way."""
        t0 = time.perf_counter()
        self.transfers.barrier()  # line the ranks' clocks up
        if self.steal is not None:
            bell = getattr(self.wake, "address", None)
            me = (self.net.host, self.steal.board_path, bell, bool(self.plan.tasks))
            self.steal.connect(self.net.allgather(me))
        self.trace.start()
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
                self.drop_spawned()
            self._abort_early()
            self._join_workers(threads)
            self.launcher.close()
            if self.steal is not None:
                self.steal.close()
            if isinstance(self.wake, doorbell.Doorbell):
                self.wake.close()
        self.trace.wall = self.trace.now()
        self.transfers.record_receives()
        self._conclude()
        self.stats.tasks = self.sched.done
        self.stats.seconds = time.perf_counter() - t0

    def _progress(self) -> None:
        net, tr, sched, tuning = self.net, self.transfers, self.sched, self.tuning
        clock = time.perf_counter
        sleep, idle_since = 0.0, clock()
        steal, depth = self.steal, None
        wake = self.wake
        while True:
            # cleared before looking, not after: a wake-up that comes while this thread
            # looks is for the next look (a steal request's ring was lost so)
            wake.clear()
            with self.lock:
                if self._cancel is not None and self.failure is None:
                    self._fail(None, RunError(self._cancel), cancel=True)
                if self._limits:
                    self._check_timeouts()
                failed = self.failure is not None
                all_done = sched.done == sched.ntasks
                all_done = all_done and not self.accepting and not self.submitted_left
                all_done = all_done and not self.orphans  # (their results are still due)
                quiet = all_done and not self.spool and not self.spawned_running
                pollers = self.pollers
                if steal is not None:  # every worker waits, and none has work here
                    depth = idle_depth(
                        bool(sched.ready), self.spool, self.waiting, self.wait_depths,
                        self.nworkers,
                    )  # fmt: skip
            if failed:
                return
            busy = False
            if net.size > 1 and not pollers:  # else an idle worker polls: let it
                busy = bool(tr.try_poll())
            if steal is not None:
                # (not after work came: the idleness seen before the poll is stale)
                if self._steal_step(None if busy else depth, all_done, quiet):
                    return
            elif all_done:
                with tr.token:  # no worker is half-way through a poll
                    if not tr.left():
                        return
            if busy:
                sleep, idle_since = 0.0, clock()
                continue
            if not pollers and steal is None and (net.size == 1 or not tr.left()):
                # nothing to poll: sleep until a worker hands over (or a cancel)
                wake.wait(tuning.watch if net.size > 1 or self._limits else None)
            else:
                if pollers:
                    # a worker polls, and wakes this thread when it starts a long task
                    # or stops polling: look now and then only, not to take its core
                    # on the path of every message (benchmarks/comm.py)
                    sleep = tuning.polled_sleep
                else:
                    # back off: poll often while a worker is idle; while every worker
                    # computes, latency is hidden, so leave their cores alone
                    busy_workers = self._computing() >= self.nworkers
                    cap = 10 * tuning.busy_poll if busy_workers else tuning.poll_max
                    if busy_workers and not self._poll_computing:
                        sleep = tuning.watch  # (the workers poll between their tasks)
                    elif steal is None:
                        sleep = commlib.next_sleep(sleep, clock() - idle_since, cap)
                    else:  # (the spool and the queues: hints, without the lock or token)
                        planned = bool(tr.recvs_left or tr.recvs_active or tr.sends_active)
                        waited = clock() - idle_since
                        computing = tuning.watch if busy_workers else None
                        sleep = steal.next_sleep(
                            sleep, waited, cap, bool(self.spool), planned, computing
                        )
                self.stats.sleeps += 1
                if wake.wait(sleep):
                    # handed work (a worker stopped polling, or starts a long task):
                    # back off afresh, not from when that worker began to poll; but
                    # while every worker computes, from busy_poll: the doubling from
                    # 20 µs after each handover took 16 % of a rank's one core
                    # (2 ranks x 1 worker, docs/performance.md#cholesky-on-intel)
                    busy_workers = self._computing() >= self.nworkers
                    sleep = tuning.busy_poll if busy_workers else 0.0
                    if busy_workers and not self._poll_computing:
                        sleep = tuning.watch
                    idle_since = clock()

    def _computing(self) -> int:
        """Workers that compute (a hint, without the lock): in a task, or in a spawned
        call taken when idle; less those waiting for calls other ranks run, where one
        of those is on another host (its result comes unrung: poll for it). On one host
        every result rings: polling for it cost an idle rank 3.3 -> 5.6-6.6 % of a core."""
        steal = self.steal
        unrung = steal is not None and not steal.all_rung
        return self._running + self.spawned_running - (self.spawn_waiting if unrung else 0)

    def _steal_step(self, depth: int | None, all_done: bool, quiet: bool) -> bool:
        """One step of stealing (see :meth:`~taskgraph.run.steal.Stealer.step`), if
        the network token is free; ``depth``: see :func:`~taskgraph.run.steal.idle_depth`;
        ``quiet``: ``all_done``, and no spawned call in the pool or running here. True
        when the run may end on this rank."""
        tr = self.transfers
        if not tr.token.acquire(blocking=False):
            return False
        try:
            assert self.steal is not None
            left = tr.left()
            return self.steal.step(depth, all_done and not left, quiet and not left)
        finally:
            tr.token.release()
