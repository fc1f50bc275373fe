"""The network side of one rank's run: every MPI call of a run goes through here.

:class:`Transfers` owns the network token (whoever holds it may call MPI: the progress
thread, or an idle worker polling for the message it waits for), the send and receive
queues, the receive window, the probe for unexpected messages, and the delivery of
what lands (counting down the tasks it releases in the scheduling state)::

    outbox ──► sends_waiting ──► sends_active ──(completed)──► count down `release`
    recvs_todo ──(window: bytes, count)──► recvs_active ──(landed)──► received, refs
    probe: values, signals, tiles beyond the window, aborts (CONTROL_TAG)

Receives are posted ahead up to a byte budget small enough to stay in cache (and
always one): a receive lands in a pooled buffer (benchmarks/comm.py, 1 MiB hops).

A version written away from its data's owner comes home in a ``home`` message that
lands in the owner's own storage (never a pool buffer, never in ``received``); only a
plan with such messages swaps in the methods that know them (:meth:`Transfers.
__init__`), so the single-owner path does no extra work per message. Posting that
receive ahead into storage still being read here is safe: its sender sends only after
the writer ran, and the writer waited for every reader of the old version (WAR edges).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import RunError
from ..dsl.tasks import INITIAL
from ..plan.planner import CONTROL_TAG, Message, RankPlan
from . import comm as commlib
from .buffers import BufferPool
from .schedstate import SchedState
from .tuning import Tuning

if TYPE_CHECKING:
    from ..dsl.graph import Graph


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


class Transfers:
    """Sends, receives and probes of one rank's run.

    Guarded by ``token`` (the network token): ``sends_waiting``, ``sends_active`` (with
    ``sends_active_msgs``: message, posting time, bytes), ``recvs_todo``, ``expected``,
    ``recvs_active`` (with ``recvs_active_msgs``: message, buffer, posting time).
    Guarded by the executor's ``lock``: ``outbox`` (finished tasks whose sends are
    still to post), ``recvs_left``, ``posted_bytes``, ``received`` ((data, producer)
    -> buffer or value), ``refs`` (readers left per received buffer), ``recv_rows``
    (receives to trace). ``owner``: the executor (its count of waiting workers, and
    its remote-abort handler)."""

    def __init__(
        self,
        owner: Any,
        net: commlib.Network,
        graph: Graph,
        plan: RankPlan,
        sched: SchedState,
        pool: BufferPool,
        tuning: Tuning,
        tiles: dict[int, np.ndarray],
        pickled: dict[int, bytes],
    ):
        """``tiles``: the executor's local tiles by data (shared, filled here too);
        ``pickled``: pickled values by producer task (shared)."""
        self.owner = owner
        self.net = net
        self.graph = graph
        self.plan = plan
        self.sched = sched
        self.lock = owner.lock
        self.stats = owner.stats
        self.trace = owner.trace
        self.pool = pool
        self.tuning = tuning
        self.tiles = tiles
        self.pickled = pickled
        self.token = threading.Lock()
        self.outbox: list[int] = []
        self.sends_waiting: deque[Message] = deque(plan.sends.get(INITIAL, ()))
        self.sends_active: list = []
        self.sends_active_msgs: list[tuple[Message, float, int]] = []
        self.recvs_todo: deque[Message] = deque(m for m in plan.recvs if m.kind == "tile")
        self.expected = {(m.src, m.tag): m for m in plan.recvs}
        self.recvs_active: list = []
        self.recvs_active_msgs: list[tuple[Message, Any, float]] = []
        self.posted_bytes = 0
        self.recvs_left = len(plan.recvs)
        self.received: dict[tuple[int, int], object] = {}
        self.refs: dict[tuple[int, int], int] = {}
        self.recv_rows: list[tuple[Message, float, float, int]] = []
        self.steal: Any = None  # the run's Stealer (taskgraph.run.steal), if it steals
        if any(m.home for m in plan.recvs):  # versions made elsewhere land in storage
            self.tile_buffer = self._home_buffer  # type: ignore[method-assign]
            self.deliver = self._deliver_home  # type: ignore[method-assign]

    # -- the start and the end -------------------------------------------------------

    def barrier(self) -> None:
        """Line the ranks' clocks up before the run (nothing on one rank)."""
        if self.net.size > 1:
            self.net.barrier()

    def left(self) -> bool:
        """Whether any send or receive of the run is still to do. Token held."""
        return bool(
            self.outbox
            or self.sends_waiting
            or self.sends_active
            or self.recvs_left
            or self.recvs_active
        )

    def abandon(self) -> None:
        """The run failed: cancel the posted receives, leave the sends in flight."""
        self.net.cancel(self.recvs_active)
        self.net.abandon(self.sends_active)
        if self.steal is not None:
            self.net.abandon([req for req, _ in self.steal.sends])
        self.recvs_active, self.sends_active = [], []

    def send_abort(self, failure: bytes) -> None:
        """Send the pickled failure record to every other rank (2 s to complete)."""
        net = self.net
        reqs = [net.isend(failure, r, CONTROL_TAG) for r in range(net.size) if r != net.rank]
        deadline = time.monotonic() + 2.0
        pending = list(reqs)
        while pending and time.monotonic() < deadline:
            done = set(net.test_some(pending))
            pending = [r for i, r in enumerate(pending) if i not in done]
            time.sleep(1e-3)
        net.abandon(pending)

    def agree(self, on_wait) -> None:
        """Wait at a barrier for every rank, draining aborts sent to a rank that has
        already finished; ``on_wait()`` is called each time round (a late cancel)."""
        net = self.net
        net.barrier_start()
        sleep, t0 = 0.0, time.perf_counter()
        while not net.barrier_done():
            on_wait()
            found = net.probe()
            if found is not None and found[2] == CONTROL_TAG:
                net.recv_probed(found[0], bytearray(found[3])).Wait()
                continue
            sleep = commlib.next_sleep(sleep, time.perf_counter() - t0, self.tuning.poll_max)
            time.sleep(sleep)

    # -- one pass over the network ---------------------------------------------------

    def poll(self, quick: bool = False, skip_oldest: bool = False) -> bool:
        """One pass over the network; True if anything happened. Token held.

        ``quick`` (an idle worker spinning): of the receives posted, test the oldest
        only, and all of them every 4th poll (messages mostly arrive in the order they
        were posted). ``skip_oldest``: the caller tests the oldest receive itself (see
        :mod:`taskgraph.run.workers`); the others are tested, all of them.
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
        if self.sends_waiting and self.post_sends():
            busy = True
        if self.recvs_todo and self.post_recvs():
            busy = True
        # sends first: a completed receive then ends the poll, and the task it releases
        # starts without the sends' bookkeeping in between
        if self.sends_active and self.test_sends():
            busy = True
        stats = self.stats
        if skip_oldest:
            tested = len(self.recvs_active) > 1 and self.test_recvs(skip_oldest=True)
        elif self.recvs_active:
            tested = self.test_recvs(not quick or not stats.polls & 3)
        else:
            tested = False
        if tested:
            # a task may be ready: back to it now, and probe only every 8th time
            polls = stats.polls = stats.polls + 1
            if polls & 7:
                return True
            return self.probe() or True
        stats.polls += 1
        # unexpected messages when nothing else happened, and at least every 8th poll
        # (probing less often made the 8 B hop slower: benchmarks/comm.py)
        if (not busy or not stats.polls & 7) and self.probe():
            busy = True
        return busy

    def try_poll(self, quick: bool = False) -> bool | None:
        """Poll unless another thread is polling (then None). Lock not held."""
        if not self.token.acquire(blocking=False):
            return None
        try:
            return self.poll(quick)
        finally:
            self.token.release()

    # -- sends -----------------------------------------------------------------------

    def post_now(self, t: int) -> bool:
        """Post task t's sends unless another thread polls; True if this thread took
        them (some may wait for a free slot). Lock not held."""
        token = self.token
        if not token.acquire(blocking=False):
            return False
        try:
            self.post_task_sends(t)
        finally:
            token.release()
        return True

    def post_sends(self) -> bool:
        """Post queued sends while a slot is free; True if any was. Token held."""
        posted = False
        while self.sends_waiting and len(self.sends_active) < self.tuning.max_sends:
            self.post_send(self.sends_waiting.popleft())
            posted = True
        return posted

    def post_task_sends(self, t: int, payload=None, at: float | None = None) -> None:
        """Post task t's sends, or queue them for a free slot. Token held. ``payload``
        and ``at``: see :meth:`post_send` (for a task with one send)."""
        msgs = self.plan.sends[t]
        if (
            len(msgs) == 1
            and not self.sends_waiting
            and len(self.sends_active) < self.tuning.max_sends
        ):
            self.post_send(msgs[0], payload, at)  # the common case: one message, a free slot
        else:
            self.sends_waiting.extend(msgs)
            self.post_sends()

    def post_send(self, msg: Message, payload=None, at: float | None = None) -> None:
        """Post one send (a slot is free). Token held. ``payload``: the message's
        buffer if known (else looked up); ``at``: the time traced as its posting (else
        now)."""
        if payload is None:
            payload = self.tiles.get(msg.data) if msg.kind == "tile" else None
            if payload is None:
                payload = self.payload(msg)
        if at is None:
            at = self.trace.clock()  # before the call: the message may land before it returns
        active = self.sends_active
        try:
            req = self.net.isend(payload, msg.dst, msg.tag)
        except (BufferError, KeyError):  # a dtype MPI has no type for: its bytes
            req = self.net.isend(commlib.wire(payload), msg.dst, msg.tag)
        active.append(req)
        # (a value's planned size is a guess: its real one is the pickle sent)
        nbytes = msg.nbytes if msg.kind != "value" else len(payload)
        self.sends_active_msgs.append((msg, at, nbytes))
        stats = self.stats
        stats.sent += 1
        stats.bytes_sent += nbytes
        if len(active) > stats.peak_sends:
            stats.peak_sends = len(active)

    def payload(self, msg: Message):
        """What a message carries: a local tile or array, a version written here of
        another rank's data, a pickled value or object, or nothing."""
        if msg.kind == "tile":
            arr = self.storage(msg.data)
            if arr is None:  # another rank's data, written here
                arr = self.received[msg.data, msg.producer]
            return arr
        if msg.kind == "value":
            plain = self.graph.data[msg.data].item
            if plain is not None:  # plain data: the object as it is now
                return commlib.dumps(plain.value)
            return self.pickled[msg.producer]
        return b""

    def storage(self, d: int):
        """The local storage of data d (a tile of this rank, or plain data homed
        here), or None if it lives elsewhere."""
        arr = self.tiles.get(d)
        if arr is None:
            tile = self.graph.data[d].tile
            if tile is not None:
                arr = tile.matrix.tiles.get((tile.i, tile.j))
                if arr is not None:
                    self.tiles[d] = arr
        return arr

    def test_sends(self) -> bool:
        """Test the sends in flight; count down what the completed ones release. Token
        held; True if any completed."""
        done = self.net.test_some(self.sends_active)
        if not done:
            return False
        finished = _take(done, self.sends_active, self.sends_active_msgs)
        lock = self.lock
        lock.acquire()
        try:
            woken = 0
            count_down = self.sched.count_down
            for msg, posted, nbytes in finished:
                self.trace.message(msg.dst, nbytes, msg.tag, posted, +1)
                woken += count_down(msg.release)
            if woken:
                self.owner.released(woken)
        finally:
            lock.release()
        return True

    # -- receives --------------------------------------------------------------------

    def post_recvs(self) -> bool:
        """Post receives ahead of need, within the byte budget and the count (always
        one); True if any was. Token held."""
        posted = False
        budget, most = self.tuning.recv_budget, self.tuning.max_recvs
        while self.recvs_todo and (
            not self.recvs_active
            or (
                self.posted_bytes + self.recvs_todo[0].nbytes <= budget
                and len(self.recvs_active) < most
            )
        ):
            msg = self.recvs_todo.popleft()
            if (msg.src, msg.tag) not in self.expected:
                continue  # arrived early, already taken by the probe
            del self.expected[msg.src, msg.tag]
            buf = self.tile_buffer(msg)
            try:
                req = self.net.irecv(buf, msg.src, msg.tag)
            except (BufferError, KeyError):  # (as in post_send)
                req = self.net.irecv(commlib.wire(buf), msg.src, msg.tag)
            self.start_recv(msg, req, buf)
            posted = True
        return posted

    def tile_buffer(self, msg: Message) -> np.ndarray:
        """A pooled buffer for a tile message."""
        assert msg.shape is not None and msg.dtype is not None
        return self.pool.get(msg.shape, msg.dtype, msg.order)

    def _home_buffer(self, msg: Message) -> np.ndarray:
        """:meth:`tile_buffer` of a plan with home messages: these land in storage."""
        if msg.home:
            arr = self.storage(msg.data)
            if arr is None:
                raise RunError(
                    f"rank {self.net.rank} has no storage for {self.graph.data[msg.data].label()}"
                )
            return arr
        return self.pool.get(msg.shape, msg.dtype, msg.order)  # type: ignore[arg-type]

    def start_recv(self, msg: Message, req, buf) -> None:
        """A receive was posted (or a probed message is being received)."""
        self.recvs_active.append(req)
        self.recvs_active_msgs.append((msg, buf, self.trace.clock()))
        self.posted_bytes += msg.nbytes

    def probe(self) -> bool:
        """Take the unexpected messages there are; True if any (of stealing, only
        work or a result). Token held."""
        got = False
        net = self.net
        again = self.steal is not None  # see below
        while True:
            found = net.probe()
            if found is None and again:
                # a steal message comes with a doorbell's ring: MPICH's probe moves it
                # in, and only the next probe sees it (not 90 µs later, after a sleep)
                again, found = False, net.probe()
            if found is None:
                return got
            handle, src, tag, nbytes = found
            steal = self.steal
            if steal is not None and tag >= steal.base:
                # (busy only if work came: a request answered or a "none" is no
                # reason for a poller to poll more often)
                got = steal.on_message(handle, src, tag, nbytes) or got
                # another may be right behind it, its ring taken by this one's wake-up
                # (a request behind a DONE waited 4 ms so): two probes before "none"
                again = True
                continue
            got = True
            if tag == CONTROL_TAG:
                ctl = bytearray(nbytes)
                net.recv_probed(handle, ctl).Wait()
                info = commlib.loads(ctl)
                assert isinstance(info, dict)
                self.owner.remote_abort(info)
                continue
            msg = self.expected.pop((src, tag), None)
            if msg is None:
                raise RunError(
                    f"rank {net.rank} got an unplanned message (source {src}, tag {tag})"
                )
            buf: Any
            if msg.kind == "tile":
                buf = self.tile_buffer(msg)
                wired: Any = commlib.wire(buf)  # (as in post_send)
            else:
                buf = wired = bytearray(nbytes)
            self.start_recv(msg, net.recv_probed(handle, wired), buf)

    def test_recvs(self, full: bool = True, skip_oldest: bool = False) -> bool:
        """Test the posted receives (``full`` False: the oldest only; ``skip_oldest``:
        all but the oldest), deliver those that completed; True if any did. Token held."""
        if skip_oldest:
            done = [i + 1 for i in self.net.test_some(self.recvs_active[1:])]
        else:
            done = self.net.test_some(self.recvs_active, full)
        if not done:
            return False
        # traced by the worker after its task (see record_receives), not on its way
        return self.received_at(done, self.trace.clock())

    def received_at(self, done: list[int], done_at: float) -> bool:
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
        lock = self.lock
        lock.acquire()  # (not `with`: Condition.__enter__ is a Python call)
        try:
            woken = 0
            count_down = self.sched.count_down
            for entry in finished:
                self.deliver(entry, done_at, values)
                woken += count_down(entry[0].consumers)
            if woken:
                self.owner.released(woken)
        finally:
            lock.release()
        return True

    def deliver(self, entry: tuple, done_at: float, values: dict | None) -> None:
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

    def _deliver_home(self, entry: tuple, done_at: float, values: dict | None) -> None:
        """:meth:`deliver` of a plan with home messages: the storage such a message
        landed in is the data's own, read there (never received, never pooled)."""
        Transfers.deliver(self, entry, done_at, values)
        msg = entry[0]
        if msg.home:
            key = (msg.data, msg.producer)
            del self.received[key]
            del self.refs[key]

    def release_reads(self, reads) -> None:
        """A task that read ``reads`` ((data, producer) pairs) ended: a received buffer
        it was the last to read goes back to the pool. Lock held."""
        refs = self.refs
        for d, prod in reads:
            key = (d, prod)
            readers = refs.get(key)
            if readers is not None:
                if readers == 1:
                    del refs[key]
                    buf = self.received.pop(key)
                    if isinstance(buf, np.ndarray):
                        self.pool.put(buf)
                else:
                    refs[key] = readers - 1

    def record_receives(self) -> None:
        """Trace the receives completed since the last call. Lock held (or threads
        joined): recorded after the task a receive released, not on its way."""
        rows, self.recv_rows = self.recv_rows, []
        message = self.trace.message
        for msg, posted, done_at, nbytes in rows:
            message(msg.src, nbytes, msg.tag, posted, -1, done_at)
