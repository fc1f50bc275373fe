"""The outcome protocol: how a run ends, the same way on every rank.

A task that raises (or the runtime, or a cancel) fails the run on its rank
(:meth:`OutcomeProtocol.fail`): the first :class:`Failure` stands, the workers stop,
and an abort goes to every other rank, which records the failure as not its own
(:meth:`OutcomeProtocol.remote_abort`). At the end (:meth:`OutcomeProtocol.conclude`)
all ranks agree on the outcome (a barrier that drains late aborts, then an
``allgather`` of each rank's own failure and stuck tasks) before the run's
communicator is closed, so that every rank raises the same
:class:`~taskgraph.core.errors.TaskError` (or :class:`~taskgraph.core.errors.RunError`
for a cancel or a runtime fault), and the next run starts clean::

    fail / remote_abort ──► stopping ──► abort sent (origin) ──► workers joined ──►
        conclude: barrier ─► allgather(failures, stuck) ─► raise

The abort goes out before this rank waits out its workers' grace (a cancelled rank of
long leaves was idle at 2 s, the others at 4 s, a trial); where it could not be sent
then, ``conclude`` sends it.
"""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from typing import Any

from ..core.errors import RemoteTraceback, RunError, TaskError
from . import attempts
from . import comm as commlib
from .schedstate import FAILED


@dataclass(frozen=True)
class Failure:
    """Why a run failed: the task (its label; None for a cancel or a runtime fault),
    the rank it failed on (of ``size``, on ``host``), the error and its traceback;
    ``origin``: it happened on this rank (else an abort brought it); ``cancel``: a
    cancel."""

    task: str | None
    rank: int
    size: int
    host: str
    error: str
    traceback: str
    origin: bool = True
    cancel: bool = False

    @classmethod
    def of(cls, task: str | None, exc: BaseException, net, cancel: bool = False) -> Failure:
        """The failure of ``task`` (a label, or None) on this rank of ``net``."""
        return cls(
            task=task,
            rank=net.rank,
            size=net.size,
            host=net.host,
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
            cancel=cancel,
        )

    def to_wire(self) -> dict:
        """As plain data, for the abort message and the agreement."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, info: dict, origin: bool | None = None) -> Failure:
        """A failure sent by another rank (``origin``: overrides the sender's)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in info.items() if k in fields}
        if origin is not None:
            data["origin"] = origin
        return cls(**data)

    def error_to_raise(self, run: str, here: BaseException | None) -> BaseException:
        """The exception every rank raises for this failure of the run named ``run``,
        its cause set: ``here`` (the exception itself, on the rank it happened on) or
        the remote traceback."""
        cause = here if here is not None else RemoteTraceback(self.traceback)
        if self.task is None:  # a cancel, or a runtime fault
            err: BaseException = RunError(
                f"run {run!r} stopped on rank {self.rank}/{self.size} ({self.host}): {self.error}"
            )
        else:
            err = TaskError(self.task, self.rank, self.size, self.host, self.error, self.traceback)
        err.__cause__ = cause
        return err


class OutcomeProtocol:
    """The executor's fail / abort / conclude methods (a mixin of
    :class:`~taskgraph.run.executor.Executor`: its fields are the executor's,
    documented there)."""

    failure: Failure | None
    exception: BaseException | None
    results: dict[int, object]

    def _fail(
        self: Any,
        t: int | None,
        exc: BaseException,
        running: bool = True,
        cancel: bool = False,
    ) -> None:
        """Task t raised (or the runtime did, t None; ``cancel``: a cancel): stop this
        rank. ``running``: t is RUNNING (else it has moved on already). Lock held."""
        if t is not None and running:
            self.sched.move(t, FAILED)
        if self.failure is None:
            label = self.graph.label(t) if t is not None else None
            self.failure = Failure.of(label, exc, self.net, cancel)
            self.exception = exc
        self.stopping = True
        self.lock.notify_all()
        self.drop_spawned()
        self.wake.set()

    def remote_abort(self: Any, info: dict) -> None:
        """Another rank failed (``info``: its failure, as sent). Lock not held."""
        with self.lock:
            if self.failure is None:
                self.failure = Failure.from_wire(info, origin=False)
            self.stopping = True
            self.lock.notify_all()
            self.drop_spawned()

    def _cancel_late(self: Any) -> Failure:
        """A cancel came after this rank's tasks ended, while it waits for the others:
        stop them (an abort), and be the origin of the outcome."""
        with self.lock:
            self._fail(None, RunError(self._cancel), cancel=True)
            failure = self.failure
        assert failure is not None
        self._send_abort(failure)
        return failure

    def _send_abort(self: Any, failure: Failure) -> None:
        """Send this rank's ``failure`` to every other rank."""
        self.transfers.send_abort(commlib.dumps(failure.to_wire()))

    def _abort_early(self: Any) -> None:
        """Send this rank's failure (a cancel too) as the run stops, before its workers
        are joined (see the module's doc). Not where the network token stays held (a
        task run the moment its tile landed), nor if the send fails: the cleanup after
        must run, and ``conclude`` tries again."""
        failure = self.failure
        if self.net.size == 1 or failure is None or not failure.origin:
            return
        tr = self.transfers
        if tr.token.acquire(timeout=0.2):  # (a worker mid-poll lets go at once)
            try:
                self._send_abort(failure)
                self.abort_sent = True
            except Exception:  # noqa: BLE001 - see above: conclude tries again
                pass
            finally:
                tr.token.release()

    def _conclude(self: Any) -> None:
        """Agree with every rank on the outcome, gather the trace and the results,
        close the run's communicator; raise the run's error if it failed."""
        net, tr = self.net, self.transfers
        failure: Failure | None = self.failure
        if net.size > 1:
            if failure is not None:
                if failure.origin and not self.abort_sent:  # (see _abort_early)
                    self._send_abort(failure)
                tr.abandon()
            late: list[Failure] = []

            def on_wait() -> None:  # this rank's share is done, not the run
                if failure is None and not late and self._cancel is not None:
                    late.append(self._cancel_late())

            tr.agree(on_wait)
            if late:
                failure = late[0]
            mine = failure.to_wire() if failure and failure.origin else None
            outcomes = net.allgather((mine, self._stuck, attempts.wire(self)))
            origins = [Failure.from_wire(o) for o, _, _ in outcomes if o is not None]
            failure = origins[0] if origins else failure
            stuck = [s for _, part, _ in outcomes for s in part]
            attempts.conclude(self, [tally for _, _, tally in outcomes], failure is None)
        else:
            stuck = self._stuck
            attempts.conclude(self, None, failure is None)
        if failure is not None and stuck:
            failure = dataclasses.replace(failure, error=f"{failure.error}; " + "; ".join(stuck))
        if self.trace.enabled:  # every rank's events, on rank 0 (failed runs too)
            self.trace_parts = net.gather(self.trace.batch()[0], 0)
        results: dict[int, object] = dict(self.values)  # made here, and every sink
        try:
            if failure is None:  # (every sink value was pickled as its task ended)
                mine_values = {t: self.pickled[t] for t in self.plan.results if t in self.pickled}
                for rank, part in enumerate(net.allgather(mine_values)):
                    if rank != net.rank:
                        results.update((t, commlib.loads(b)) for t, b in part.items())
        finally:
            net.close(retire=failure is not None)
        self.results = results
        if failure is not None:
            self._raise(failure)

    def _raise(self: Any, failure: Failure) -> None:
        """Raise ``failure`` here, caused by this rank's own exception where it
        happened here, else by the remote traceback."""
        here = failure.rank == self.net.rank and (failure.origin or failure.task is None)
        err = failure.error_to_raise(self.graph.name, self.exception if here else None)
        raise err from err.__cause__
