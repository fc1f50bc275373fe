"""The worker threads of one rank's run: take the ready task of highest priority, run
it (the GIL released in a kernel), then, under the lock, count down its successors and
post its sends (or hand them to the progress thread).

Cooperative progress: an idle worker that waits for a message polls the network itself
(:meth:`WorkerLoop._idle_poll`), so the worker that runs the released task is the one
that finds the message, and runs it at once where it can
(:mod:`taskgraph.run.direct`). It polls back to back for ``spin`` seconds after the
last message (longer by ``spin_per_byte`` per byte of the receives it waits for), then
backs off (:func:`~taskgraph.run.comm.next_sleep`). With several workers and short
tasks (under ``short_task`` on average), one worker runs them and the others park
(:meth:`WorkerLoop._park`): Python runs one thread at a time.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from ..dsl.tasks import Ref
from ..trace.recorder import TASK_DONE, TASK_FAILED
from . import comm as commlib
from . import context
from .direct import Staged
from .dynamic import refuse_future
from .schedstate import DONE
from .tuning import BOUNDARY_POLLS

# a waiting worker runs a ready static task on its stack only this shallow (the task's
# own calls may nest NEST_LIMIT deep above it: the interpreter's stack holds both)
NEST_STATIC_BELOW = 2


def _new_buffer(datum) -> np.ndarray:
    """A buffer for a version of ``datum`` written without being read first."""
    if datum.tile is not None:
        return np.empty(datum.tile.shape, datum.tile.dtype, order="F")  # (tiles are F)
    return np.empty_like(datum.item.value)  # (its layout, as the messages expect)


class WorkerLoop:
    """The executor's worker-thread methods (a mixin of
    :class:`~taskgraph.run.executor.Executor`: its fields are the executor's,
    documented there)."""

    def _worker(self: Any, index: int) -> None:
        lock = self.lock
        sched, tr = self.sched, self.transfers
        ready = sched.ready
        now = self.trace.clock
        waits = self.trace.waits  # (trace.waited, inline: it is on a message's path)
        multi = self.net.size > 1
        spool = self.spool
        context.enter_worker(self, index, self._frames[index])
        lock.acquire()
        try:
            while True:
                if not ready and not self.stopping:
                    if spool:  # spawned work, only when no static task is ready
                        if not self.run_spawned_idle(index):
                            return
                        continue
                    # waiting on the network if a task here still needs a message
                    on_network = tr.recvs_left > 0
                    t_idle = now()
                    if on_network and multi and self.pollers == 0:
                        # poll for it here; waking the progress thread now would only
                        # make the two take the network token from each other
                        if not self._idle_poll(index):
                            return
                    else:
                        self.wake.set()  # the progress thread should poll sooner
                    while not ready and not self.stopping and not spool:
                        self.waiting += 1
                        lock.wait()
                        self.waiting -= 1
                    waits[index][0 if on_network else 1] += now() - t_idle
                    if not ready and not self.stopping:
                        continue  # woken for spawned work
                if self.stopping:
                    return
                if self._running and self.mean_task < self.tuning.short_task:
                    if self._park(index):
                        continue  # another worker ran the tasks meanwhile: look again
                t = sched.pop()
                self._running += 1
                self.current[index] = t
                self.started[index] = start = now()
                lock.release()
                if multi and t in self._long and self._poll_computing:
                    self.wake.set()  # the progress thread polls while this task runs
                if not self._run_task(index, t, start):
                    return
        finally:
            lock.release()
            context.leave_worker()

    def _run_task(self: Any, index: int, t: int, start: float) -> bool:
        """Run task t popped by worker ``index`` (lock not held on entry, held on
        exit), post its sends and count down; False if the worker should stop."""
        lock, tr = self.lock, self.transfers
        try:
            value = self._call(t)
            if self._frames[index]:  # it spawned calls: they end before it does
                self.join_root(index)
                refuse_future(value)
            if t in self._pickle_here:  # a value another rank (or every one) reads
                self.pickled[t] = commlib.dumps(value)
        except BaseException as exc:  # noqa: BLE001 - reported to every rank
            self._frames[index].clear()
            lock.acquire()
            if index in self._abandoned:
                return False  # the run ended without this task: touch nothing
            self._running -= 1
            self.trace.task(t, index, start, self.trace.clock(), TASK_FAILED)
            self._fail(t, exc)
            return False
        if index in self._abandoned:  # back after the run ended without it
            lock.acquire()
            return False
        end = self.trace.clock()
        multi = self.net.size > 1
        # its sends first, if the network is free: they are the critical path of
        # another rank, the bookkeeping below is not
        sent = False
        if multi and (t in self.plan.sends or not self._poll_computing):
            try:
                if t in self.plan.sends:
                    sent = tr.post_now(t)
                if not self._poll_computing and self.sched.ready:
                    # nobody polled while it ran: land what came, each landing posts
                    # the next receive (the budget holds one large tile at a time).
                    # Only with a task to go on to: else this worker polls idle, and
                    # runs the task a tile releases the moment it lands (direct.py)
                    for _ in range(BOUNDARY_POLLS):
                        if not tr.try_poll():
                            break
            except BaseException as exc:  # noqa: BLE001 - reported to every rank
                lock.acquire()
                self._running -= 1
                self._fail(None, exc)
                return False
        lock.acquire()
        self._running -= 1
        self.started[index] = 0.0
        self.current[index] = -1
        # capped: a tiny task that waited for the GIL mid-way must not count as long
        short = self.tuning.short_task
        self.mean_task += 0.1 * (min(end - start, 2 * short) - self.mean_task)
        self.trace.task(t, index, start, end, TASK_DONE)
        try:
            self._finish(t, value, sent)
        except BaseException as exc:  # noqa: BLE001 - a runtime bug: fail loudly
            self._fail(t, exc, running=False)
            return False
        if tr.outbox and multi:  # post this task's sends now
            lock.release()
            try:
                if tr.try_poll() is None:  # another thread polls: hand over
                    self.wake.set()
            except BaseException as exc:  # noqa: BLE001 - reported to every rank
                lock.acquire()
                self._fail(None, exc)
                return False
            lock.acquire()
        return True

    def released(self: Any, woken: int, keep: int = 0) -> None:
        """``woken`` static tasks became ready (lock held): wake idle workers for them,
        less the ``keep`` this thread runs itself, and the workers waiting in a spawned
        call, which may run one meanwhile (see :meth:`run_static_nested`)."""
        if woken > keep and self.waiting:
            self.lock.notify(woken - keep)
        if self.spawn_waiting:
            self.spawn_cv.notify_all()

    def run_static_nested(self: Any, index: int, frames: list) -> None:
        """Worker ``index``, waiting in a spawned call (``frames``: its stack) with no
        deeper call to run, runs a ready static task on its stack, under a frame stack
        of its own (the wait goes on after it): a waiting task never holds a worker
        idle while other work is runnable (a rank of one worker whose call was stolen
        sat 1.5 s beside five ready tasks). Lock held on entry and exit; a failure
        stops the run, which the wait sees next."""
        t = self.sched.pop()
        self._running += 1
        outer = self.current[index], self.started[index]
        self.current[index] = t
        self.started[index] = start = self.trace.clock()
        own: list = []
        self._frames[index] = own
        self._nested_static[index] += 1
        context.enter_worker(self, index, own)
        self.lock.release()
        try:
            self._run_task(index, t, start)  # (lock held when it returns)
        finally:
            context.enter_worker(self, index, frames)
            self._frames[index] = frames
            self._nested_static[index] -= 1
        self.current[index], self.started[index] = outer
        if self.sched.ready and self.waiting:  # (_finish left one for this worker)
            self.lock.notify(len(self.sched.ready))

    def may_nest_static(self: Any, index: int, frames: list) -> bool:
        """Whether worker ``index``, waiting with ``frames`` on its stack and nothing
        deeper to run, runs a ready static task meanwhile (lock held): no other worker
        is idle to run it, the run has no time limits (an interrupt would land in the
        task below), no static task waits below on this stack already, and the stack
        is shallow (the nested task gets its own NEST_LIMIT); and ``frames`` is the
        worker's own (not a thread running a call a timed wait handed over: it would
        take the worker's place, its stack and its task's join)."""
        return (
            frames is self._frames[index]
            and bool(self.sched.ready)
            and not self.waiting
            and not self._limits
            and not self._nested_static[index]
            and len(frames) <= NEST_STATIC_BELOW
            and not self.watch.timed_on(threading.get_ident(), index)
        )

    def _park(self: Any, index: int) -> bool:
        """Leave the ready tasks to the worker running short ones, until one of its
        tasks runs longer than ``park``. Lock held; True if this worker waited."""
        now = self.trace.clock
        t0 = now()
        parked = False
        ready, park, short = self.sched.ready, self.tuning.park, self.tuning.short_task
        while ready and not self.stopping and self.mean_task < short:
            busy = [s for s in self.started if s]
            # (its age counted from when this worker began to wait: before, this
            # worker held the GIL, and the other's task may only have waited for it)
            if not busy or now() - max(min(busy), t0) > park:
                break  # no worker runs a task, or one runs long: take a task
            parked = True
            self.waiting += 1
            self.lock.wait(park)
            self.waiting -= 1
        if parked:
            self.trace.waited(index, now() - t0, False)
        return parked

    def _call(self: Any, t: int):
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

    def _call_foreign(self: Any, t: int):
        """:meth:`_call` on a rank with tasks that write data of other ranks (see
        :attr:`~taskgraph.plan.planner.RankPlan.foreign`): such a task writes the
        version it read here (or a new buffer, if it only writes), which is then the
        version it made, kept here (never pooled) for readers here and its sends."""
        away = self.plan.foreign.get(t)
        if away is None:
            return WorkerLoop._call(self, t)
        task = self.graph.tasks[t]
        tr = self.transfers
        made: dict[int, Any] = {}
        with self.lock:
            for d, prev in away:
                if (d, prev) in task.reads:
                    buf = tr.received[d, prev]
                    tr.refs.pop((d, prev), None)  # written now: never back to the pool
                else:
                    buf = _new_buffer(self.graph.data[d])
                tr.received[d, t] = made[d] = buf
        args = [
            (made[a.data] if a.data in made else self._fetch(a.data, task.reads))
            if a.__class__ is Ref
            else a
            for a in task.args
        ]
        kwargs = {
            k: (made[v.data] if v.data in made else self._fetch(v.data, task.reads))
            if v.__class__ is Ref
            else v
            for k, v in (task.kwargs or {}).items()
        }
        return task.fn.fn(*args, **kwargs)

    def _fetch(self: Any, d: int, reads: tuple):
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
        received = self.transfers.received
        for data, producer in reads:  # received: the version this task reads
            if data == d:
                return received[d, producer]
        raise KeyError(f"task reads data {d} but no version of it")

    def _finish(self: Any, t: int, value, sent: bool = False) -> None:
        """Task t ended well: count down what waited for it (``sent``: its sends are
        taken already). Lock held."""
        tr, sched = self.transfers, self.sched
        if tr.recv_rows:
            tr.record_receives()
        sched.move(t, DONE)
        task = self.graph.tasks[t]
        fn = task.fn
        keep = self._keeps_value.get(fn)
        if keep is None:  # a kernel writes its tiles; a plain function returns a value
            keep = self._keeps_value[fn] = not hasattr(fn, "modes")
        if keep:
            self.values[t] = value
        woken = sched.count_down(self.plan.successors[t])
        if tr.refs:  # received data this task was among the last to read
            tr.release_reads(task.reads)
        if woken:
            self.released(woken, keep=1)  # this worker takes one itself
        if not sent and t in self.plan.sends:
            tr.outbox.append(t)  # the worker posts them itself if it can (see _worker)
            if self.net.size == 1:
                self.wake.set()
        if sched.done == sched.ntasks:
            self.wake.set()

    def _idle_poll(self: Any, index: int) -> bool:
        """An idle worker polls for the message it waits for. Lock held on entry and
        exit; False if the network failed (the run is then failing).

        Polls back to back for ``spin`` seconds after the last message (plus
        ``spin_per_byte`` per byte of the receives posted), then backs off, as the
        progress thread does; stops as soon as a task is ready, and hands polling back
        to the progress thread.

        Where the oldest receive releases a task, the worker stages it first (once per
        receive, and again whenever counters moved), then tests that receive alone,
        and every 4th time the rest of the network too and that receive once more; the
        moment it lands (in any of those calls) the worker runs the task
        (:meth:`~taskgraph.run.direct.DirectPath.run_direct`). Each pass is kept
        tight, and the landing is inline: a large message moves as fast as the two
        ranks call MPI (benchmarks/abtest.py, 1 MiB)."""
        lock, tr, stats, tuning = self.lock, self.transfers, self.stats, self.tuning
        ready, waits, spool = self.sched.ready, self.sched.waits, self.spool
        token, active = tr.token, tr.recvs_active
        spin, per_byte, poll_max = tuning.spin, tuning.spin_per_byte, tuning.poll_max
        clock = time.perf_counter
        self.pollers += 1
        sleep, last = 0.0, clock()
        tried = None  # the receive a task was last staged for (or tried)
        staged: Staged | None = None
        sreq = stask = None  # staged.req and .task as locals: a NamedTuple field is a slow
        # attribute in the spin (benchmarks/abtest.py, 1 MiB)
        try:
            while not ready and not self.stopping and tr.recvs_left > 0:
                lock.release()
                got = False
                ran = None
                if token.acquire(blocking=False):  # (try_poll, inline)
                    held = True
                    try:
                        if active and active[0] is not tried and not ready:
                            tried = active[0]
                            staged = self.stage(tried)
                            if staged is not None:
                                sreq, stask = staged.req, staged.task
                        if staged is None or not active or active[0] is not sreq:
                            if tr.poll(True):
                                got, tried = True, None
                        else:
                            if tr.sends_active and waits[stask] > 1:
                                got = tr.test_sends()  # (a send the task waits for)
                            landed = sreq.Test()
                            if not landed and stats.polls & 3 != 3:
                                stats.polls += 1
                            elif not landed:
                                # the rest of the network too, and then this receive
                                # again (at polls = 3 mod 4: poll counts itself, and
                                # probes when it brings the count to 0 mod 8)
                                got = tr.poll(True, skip_oldest=True) or got
                                landed = sreq.Test()
                            if landed:  # (the landing, inline: it is on a message's way)
                                done_at = clock()
                                if waits[stask] > 1 and tr.sends_active:
                                    # the test that landed the tile may have completed
                                    # the send too
                                    got = tr.test_sends() or got
                                if waits[stask] == 1:
                                    held = False  # (run_direct releases it)
                                    ran = self.run_direct(index, staged, done_at)
                                else:  # a send it waits for is still out: as usual
                                    got = tr.received_at([0], done_at) or got
                                staged = None
                        if held:
                            held = False
                            token.release()
                    except BaseException as exc:  # noqa: BLE001 - reported to every rank
                        if held:
                            token.release()
                        lock.acquire()
                        self._fail(None, exc)
                        return False
                if ran is not None:
                    self.direct_done(index, ran)  # (returns with the lock held)
                    sleep, last = 0.0, clock()
                    continue
                if got:
                    lock.acquire()
                    if ready:
                        break  # (the clock below is on a message's way)
                    sleep, last = 0.0, clock()
                elif clock() - last < spin + tr.posted_bytes * per_byte:
                    # a message came moments ago: the next is likely close. Longer for
                    # large messages: a rank asleep when one comes stalls its transfer.
                    # A core to another thread every 4th time (a sched_yield costs a
                    # quarter of an idle poll)
                    spins = stats.spins = stats.spins + 1
                    if not spins & 3:
                        os.sched_yield()
                    lock.acquire()
                else:
                    lock.acquire()  # nothing came for a while
                    sleep = commlib.next_sleep(sleep, clock() - last, poll_max)
                    stats.sleeps += 1
                    self.waiting += 1
                    lock.wait(sleep)
                    self.waiting -= 1
                    if spool:  # spawned work (looked for here only: not in the spin)
                        break
        finally:
            if tr.outbox or (not ready and not self.stopping):
                # no message left to wait for (sends may still be out), or a task's
                # sends wait for the token
                self.wake.set()
            # for a task, the progress thread is woken only if the task is long (see
            # _worker), or takes over within polled_sleep: a short task has this worker
            # back polling before it would matter
            self.pollers -= 1
        return True
