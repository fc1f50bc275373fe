"""The direct-run path: a task run by the polling worker the moment its tile lands.

Where the oldest posted receive is the last thing a short task waits for
(:func:`direct_task`), the idle worker that polls for it resolves the task's arguments
while the tile is on its way (:meth:`DirectPath.stage`: a :class:`Staged`), and the
moment it lands runs the task and posts the task's sends before any bookkeeping
(:meth:`DirectPath.run_direct`: a :class:`DirectRun`); the counters and the trace
follow (:meth:`DirectPath.direct_done`). On the way from a message to the next message
no thread hands work to another. The task moves WAITING -> RUNNING at once
(:meth:`~taskgraph.run.schedstate.SchedState.run_at_once`), recorded once its sends are
out: no other thread reaches it before, and the move is then off the message's way.

While the tasks run this way are short (``direct_mean``), the task runs with the
network token held, so that its send goes out with nothing in between; else the token
is free while it runs, and the send goes out if the token is free again after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..dsl.tasks import Ref
from ..plan.planner import Message
from ..trace.recorder import TASK_DONE, TASK_FAILED
from . import comm as commlib
from .schedstate import WAITING


class Staged(NamedTuple):
    """A task staged to run the moment the receive ``req`` lands."""

    req: Any  # the oldest posted receive
    entry: tuple  # its (message, buffer, posting time)
    task: int
    fn: Callable
    args: list
    tile: Any  # the tile of the task's one send, if it is a tile (else None)


class DirectRun(NamedTuple):
    """What a task run the moment its tile landed did (:meth:`DirectPath.run_direct`)."""

    entry: tuple  # the receive's (message, buffer, posting time)
    done_at: float  # when the receive was seen complete
    task: int
    value: Any
    exc: BaseException | None
    ran: bool  # False: the run was stopping, the task was not run
    start: float
    end: float
    sent: bool  # its sends are posted (or queued) already


# made without the NamedTuples' Python-level __new__ (0.5 us each, twice a message)
_new = tuple.__new__


def direct_task(
    msg: Message, waits: dict, state: dict, long: set, sending: list | tuple = ()
) -> int | None:
    """The task a receive may hand straight to the worker that polls for it, or None.

    That is the one task that reads the message's tile, when nothing but the message
    and sends of this rank still in flight (``sending``, their messages) hold it back,
    and it is not a long task. The sends are those of a tile the task overwrites: in a
    ping-pong the send of a rank's last version completes just before the next
    message comes. A pure decision: ``waits`` and ``state`` by task, ``long`` the
    tasks during which the network must stay free for the progress thread."""
    if msg.kind != "tile" or len(msg.consumers) != 1:
        return None
    t = msg.consumers[0]
    if state[t] != WAITING or t in long:
        return None
    left = waits[t] - 1
    if left:
        left -= sum(t in m.release for m in sending)
    return t if left == 0 else None


class DirectPath:
    """The executor's direct-run methods (a mixin of :class:`~taskgraph.run.executor.
    Executor`: its fields are the executor's, documented there)."""

    def stage(self: Any, req) -> Staged | None:
        """The task the oldest posted receive ``req`` releases, staged to run the
        moment it lands; None if there is no such task. Token held."""
        tr = self.transfers
        entry = tr.recvs_active_msgs[0]
        msg, buf, _ = entry
        sending = [e[0] for e in tr.sends_active_msgs] if tr.sends_active else ()
        sched = self.sched
        t = direct_task(msg, sched.waits, sched.state, self._not_direct, sending)
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
        tile = tr.payload(sends[0]) if len(sends) == 1 and sends[0].kind == "tile" else None
        return _new(Staged, (req, entry, t, task.fn.fn, args, tile))

    def run_direct(self: Any, index: int, staged: Staged, done_at: float) -> DirectRun:
        """The receive :meth:`stage` staged a task for landed: take it off the posted
        receives, run the task, post its sends. Token held on entry and released
        before this returns (or raises), lock not held; the caller then calls
        :meth:`direct_done` with what this returns."""
        t = staged.task
        tr = self.transfers
        token = tr.token
        held = True
        try:
            now = self.trace.clock
            self.current[index] = t
            self.started[index] = start = now()
            del tr.recvs_active[0]
            del tr.recvs_active_msgs[0]
            if self.direct_mean >= self.tuning.short_task:
                token.release()
                held = False
            value = exc = None
            ran = not self.stopping
            try:
                if ran:
                    value = staged.fn(*staged.args)
                    if self._frames[index]:  # it spawned calls: join them, token free
                        if held:
                            token.release()
                            held = False
                        self.join_root(index)
                    if t in self._pickle_here:
                        self.pickled[t] = commlib.dumps(value)
            except BaseException as e:  # noqa: BLE001 - reported to every rank
                self._frames[index].clear()
                exc = e
            end = now()
            sent = False
            if exc is None and ran and t in self.plan.sends and index not in self._abandoned:
                if not held:
                    held = token.acquire(blocking=False)
                if held:
                    sent = True
                    tr.post_task_sends(t, staged.tile, end)  # (its tile looked up when staged)
            if ran:  # (no other thread reaches t: the move waits until its sends are out)
                self.sched.run_at_once(t)
            return _new(DirectRun, (staged.entry, done_at, t, value, exc, ran, start, end, sent))
        finally:
            if held:
                token.release()

    def direct_done(self: Any, index: int, run: DirectRun) -> None:
        """The counters and the trace of a task :meth:`run_direct` ran. Lock not held
        on entry, held on exit."""
        self.lock.acquire()
        if index in self._abandoned:
            return  # back after the run ended without this task: touch nothing
        t, start, end = run.task, run.start, run.end
        try:
            self.started[index] = 0.0
            self.current[index] = -1
            self.transfers.deliver(run.entry, run.done_at, None)
            # (the worker counts its idle time from before it polled: this was not idle)
            self.trace.waits[index][0] -= end - start
            if not run.ran:  # the run is stopping: the tile is counted, the task not run
                self.sched.count_down((t,))
                return
            if run.exc is not None:
                self.trace.task(t, index, start, end, TASK_FAILED)
                self._fail(t, run.exc)
                return
            took = min(end - start, 2 * self.tuning.short_task)
            self.mean_task += 0.1 * (took - self.mean_task)
            self.direct_mean += 0.25 * (took - self.direct_mean)
            self.trace.task(t, index, start, end, TASK_DONE)
            self.stats.direct += 1
            self._finish(t, run.value, run.sent)
        except BaseException as e:  # noqa: BLE001 - a runtime bug: fail loudly
            self._fail(None, e)
