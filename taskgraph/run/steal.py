"""Work stealing between the ranks of a run: spawned calls move to idle ranks.

An idle rank (no static task ready, no spawned call in its pool, every worker waiting)
asks one other rank at a time for work; the victim's poller answers with its oldest
stealable spawned call (nearest the root: the most work), pickled, or "none". Only a
call deeper than the thief's waiting workers' frames goes (they run only deeper ones,
which bounds their stacks, see taskgraph.run.dynamic; an idle worker runs any). The
thief runs it as its own, and sends the result back to the victim, where the waiting
parent's future completes. Static tasks (those with a placement) are never stolen.

On one host a thief first looks on the other ranks' boards (taskgraph.run.board): each
rank keeps the oldest stealable call of each depth pickled in shared memory, and a
thief takes one there without waking its owner (tens of µs, against 75-170 µs for the
owner's poller to get its core back and answer). Only when no board has a call deep
enough does it ask::

    thief                          victim (whichever thread holds its network token)
    ─────                          ──────
    REQUEST (depth) ─────────────► probe: its oldest call deeper, pickled ─┐
      ◄──────────────────────────────────────────────────────────── REPLY ┘
    run it (its children are the thief's: they may be stolen again)
    RESULT (value, or the failure) ──► the parent's future: DONE or FAILED

Handlers never wait: a reply is posted (``Isend``) from the probe that found the
request, and a result made by a worker is queued for the token holder. A rank with
nothing to steal waits between attempts with a doubling back-off (:class:`Backoff`).

Pushed work: a rank told "none" (and, from the start, a rank with no static task:
:func:`hungry_at_start`) is *hungry*. The next call spawned on the victim goes to it at
once, sent by the worker that spawned it (PUSH), if the network token is free: the
victim's progress thread, asleep on a core its worker computes on, answered a request
or sent an OFFER a wake-up later (1-9 ms at the start of a 2-rank UTS run). Else that
thread sends an OFFER, and the hungry rank asks again. A push is not a request: the
thief's own request, if one is out, is answered as usual.

Termination (:class:`Termination`, pure): a rank whose static tasks are done (its
spawned calls are joined by then) keeps stealing and answering. Point to point, through
rank 0, in two rounds: DONE from every rank -> FINISH to every rank (no rank has work:
stop asking), then DRAINED (this rank's last request is answered, and it runs no spawned
call: one that a failed call let go, after its rank's DONE, still runs, and its result
is due) -> CLOSE (no request or result is in flight anywhere). No collective: a run
that fails half-way leaves no rank in a barrier the others never enter.

The decisions (victim, back-off, termination) are pure and unit-tested
(tests/test_steal.py); :class:`Stealer` carries them out over the run's network.
"""

from __future__ import annotations

import bisect
import pickle
import random
import struct
import threading
import time
import traceback
import types
from typing import Any

from ..core import pickling
from ..dsl.graph import TaskFunction
from . import board as boardlib
from . import comm as commlib
from . import doorbell
from .context import tls as _tls
from .dynamic import PENDING, RUNNING, SpawnFuture, plain, read_only

REQUEST, REPLY, RESULT, TERM, PUSH = range(5)  # tag offsets from the stealing tags' base
NTAGS = 5
DONE, FINISH, DRAINED, CLOSE = b"D", b"F", b"R", b"C"  # termination messages (TERM)
NO_DEPTH = 1 << 30  # deeper than any call: wanted by no rank
OFFER = b"O"  # (on TERM's tag too) work is here now: ask again at once
REPLY_SLEEP = 1e-4  # seconds: the longest sleep of a rank waiting for a reply
GIVE_SLEEP = 1e-4  # ... of a rank with calls to give (a thief may be waiting)
REPLY_SPIN = 3e-4  # seconds a rank polls without sleeping for the reply to its request
SPIN_BACKOFF = 2e-3  # ... while its back-off is shorter: attempts found work lately
FN_CACHE = 64  # functions pickled by value kept a run, each way (see Stealer._fn_blob)


def _unpack(payload: bytes | memoryview) -> tuple:
    """A pickled tuple of a stealing message."""
    msg = commlib.loads(payload)
    assert isinstance(msg, tuple)
    return msg


def pack(call: tuple, by_name: bool = True) -> bytes:
    """A stolen call (fn, args, kwargs) or its result, pickled: by plain pickle where
    what it holds is found by name on every rank (a few µs), else by cloudpickle, by
    value (a function of the notebook or the script, a lambda: tens of µs on the
    victim's path; a value of a class such a function brought along, which arrives as
    the victim's own class). ``by_name``: try plain pickle first."""
    return pickling.plain_first(call) if by_name else pickling.dumps(call, protocol=5)


HEAD = struct.Struct("<qqd")  # a call's (key, depth, sent) ahead of its pickle
KEY = struct.Struct("<q")  # a result's key ahead of its pickle: named if it cannot be loaded


_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})


def reuse_key(fn: Any) -> tuple | None:
    """A key under which the by-value pickle of ``fn`` (a function of the script) may
    be sent again (a pure decision): the functions of the script it reaches and what
    they read (globals, defaults, closure cells), each a module, a class, a function
    or an immutable value, by identity or by value. None where one is anything else
    (a dict, a list, an array, an object: it may change between two sends, and a
    pickle made now takes its value now), or ``fn`` is not a plain function."""
    parts: list = []
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if type(f) is not types.FunctionType:
            return None
        if id(f) in seen:
            continue
        seen.add(id(f))
        parts.append(id(f))
        g = f.__globals__
        read = [g[n] for n in _global_names(f.__code__) if n in g]
        read += [*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()]
        try:
            read += [c.cell_contents for c in f.__closure__ or ()]
        except ValueError:  # (a cell not filled yet)
            return None
        for v in read:
            part = _reuse_part(v, todo)
            if part is None:
                return None
            parts.append(part)
    return tuple(parts)


def _reuse_part(v: Any, todo: list) -> Any:
    c = v.__class__
    if c in _IMMUTABLE or (c is tuple and all(x.__class__ in _IMMUTABLE for x in v)):
        return (c, v)
    if c is types.FunctionType:
        if getattr(v, "__module__", None) == "__main__":
            todo.append(v)  # (by value too: what it reads counts)
        return id(v)
    if isinstance(v, TaskFunction) or c.__module__.startswith("numba."):  # (wrappers)
        inner = getattr(v, "fn", None) or getattr(v, "py_func", None)
        if getattr(inner, "__module__", None) == "__main__":
            todo.append(inner)
        return id(v)
    if isinstance(v, types.ModuleType | type | types.BuiltinFunctionType):
        return id(v)
    return None


def _global_names(code: types.CodeType) -> list[str]:
    """The names ``code`` and the code nested in it may read as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def tag_base(tag_ub: int) -> int:
    """The lowest of the stealing tags: the top ``NTAGS`` tags, above any planned tag."""
    return tag_ub - NTAGS + 1


def choose_victim(rank: int, size: int, rng: random.Random) -> int:
    """A rank other than ``rank`` (of ``size``), uniformly at random."""
    v = rng.randrange(size - 1)
    return v if v < rank else v + 1


def hungry_at_start(rank: int, has_tasks: list[bool]) -> dict[int, int]:
    """The ranks this one feeds before they ask: those without a static task (idle from
    the start, they take any call: depth -1), other than itself."""
    return {r: -1 for r, busy in enumerate(has_tasks) if not busy and r != rank}


def idle_depth(ready: bool, pool, idle_workers: int, wait_depths: list[int], nworkers: int):
    """Whether a rank is idle, and the depth a stolen call must pass, or None when it
    is not idle. ``ready``: a static task is ready; ``pool``: its spawned calls not
    started (each with a ``depth``); ``idle_workers``: workers with no task;
    ``wait_depths``: the depths of the calls the other workers wait in.

    A worker that waits runs only calls deeper than the one it waits in, so a pool of
    shallower calls leaves it idle: then the rank asks for deeper ones (an idle
    worker runs any: depth -1)."""
    if ready or idle_workers + len(wait_depths) < nworkers:
        return None
    if idle_workers:
        return None if pool else -1
    depth = min(wait_depths)
    if any(item.depth > depth for item in reversed(pool)):
        return None
    return depth


class Backoff:
    """How long an idle rank waits before its next attempt: ``first`` seconds after a
    failed one, doubling up to ``cap``; none after a success, nor once the rank takes
    more than it asked for when it failed (a call less deep: its need has widened)."""

    def __init__(self, first: float = 5e-5, cap: float = 2e-2):
        self.first, self.cap = first, cap
        self.wait = 0.0
        self.next_at = 0.0
        self.depth = -1  # the failed attempt's: it wanted calls deeper than this

    def failed(self, now: float, depth: int = -1) -> None:
        """An attempt for a call deeper than ``depth`` found nothing at ``now``."""
        self.wait = min(self.cap, max(self.first, 2 * self.wait))
        self.next_at = now + self.wait
        self.depth = depth

    def succeeded(self) -> None:
        """An attempt brought work: the next may follow at once."""
        self.wait = 0.0
        self.next_at = 0.0
        self.depth = -1

    def due(self, now: float, depth: int = -1) -> bool:
        """Whether an attempt for a call deeper than ``depth`` may be made at ``now``.
        A rank that failed while its workers waited deep, and now has a worker that
        takes any call, asks at once (else it sat out a whole 20 ms back-off)."""
        return now >= self.next_at or depth < self.depth


class Termination:
    """The two rounds through rank 0 that end a stealing run (see the module
    docstring). Each method returns the messages to send, as (rank, what)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.static_done = False
        self.finished = False  # FINISH seen: ask no more
        self.drained = False  # DRAINED sent (or counted, on rank 0)
        self.closed = False  # CLOSE seen: nothing in flight to this rank
        self._done: set[int] = set()
        self._drained: set[int] = set()

    def on_static_done(self) -> list[tuple[int, bytes]]:
        """This rank's static tasks (and their spawned calls) are done."""
        if self.static_done:
            return []
        self.static_done = True
        return self.on_message(self.rank, DONE)

    def on_drained(self) -> list[tuple[int, bytes]]:
        """Past FINISH, this rank has no request of its own in flight."""
        if not self.finished or self.drained:
            return []
        self.drained = True
        return self.on_message(self.rank, DRAINED)

    def on_message(self, src: int, what: bytes) -> list[tuple[int, bytes]]:
        """``what`` came from ``src`` (this rank's own, when ``src`` is it)."""
        if src != self.rank and what in (DONE, DRAINED) and self.rank != 0:
            raise ValueError(f"rank {self.rank} got {what!r} from {src}: only rank 0 counts")
        if what in (DONE, DRAINED) and self.rank != 0:
            return [(0, what)]
        out: list[tuple[int, bytes]] = []
        if what == DONE:
            self._done.add(src)
            if len(self._done) == self.size:
                out = [(r, FINISH) for r in range(1, self.size)]
                self.finished = True
        elif what == DRAINED:
            self._drained.add(src)
            if len(self._drained) == self.size:
                out = [(r, CLOSE) for r in range(1, self.size)]
                self.closed = True
        elif what == FINISH:
            self.finished = True
        elif what == CLOSE:
            self.closed = True
        return out


class Stealer:
    """Carries out stealing for one rank's run (``ex``: its executor).

    Guarded by the network token: ``outstanding`` (the victim of this rank's request,
    or None), ``sends`` (steal messages in flight), ``stolen`` (key -> the future of
    a call another rank runs), ``term``, ``backoff``. Guarded by the executor's lock:
    ``_key`` (the last key given to a call that leaves), ``outbox`` (messages a worker
    queued: (rank, tag, bytes)), the board's bookkeeping (``laid``: the call in each
    slot, still in the pool, each with its ``slot``; ``laid_depths``: depth -> slot;
    ``laid_keys``). ``stolen`` gains a board's call when
    it is laid there (under the lock): its result may come before its owner sees it
    taken. ``hungry`` loses a rank that took a call from the board (under the lock)."""

    def __init__(self, ex: Any, net: commlib.Network, seed: int = 0):
        self.ex = ex
        self.net = net
        self.base = tag_base(net.tag_ub)  # type: ignore[attr-defined]
        self.rng = random.Random(seed * 7919 + net.rank)
        self.backoff = Backoff()
        self.term = Termination(net.rank, net.size)
        self.outstanding: int | None = None
        self.bells: list = [None] * net.size  # doorbell addresses (see connect)
        self.all_rung = False  # every other rank is rung after each message to it
        self.asking = False  # idle at the last step: it asks for work
        self.hungry: dict[int, int] = {}  # rank -> depth: told "none", to be fed work
        self.local: list[bool] = [True] * net.size  # ranks on this host (one clock)
        self.offered: int | None = None  # a rank that offered work: asked next
        self.asked_at = 0.0
        self.asked_depth = -1  # the depth of the request outstanding (or the last one)
        self._asked = 0.0  # asked_at when the progress thread last slept
        self.sends: list[tuple[Any, bytes]] = []
        self.outbox: list[tuple[int, int, bytes]] = []
        self.stolen: dict[int, Any] = {}
        self._key = 0
        self.board_path = boardlib.name()  # (made when the run starts, if a rank here steals)
        self.board: boardlib.Board | None = None
        self.laid: list[Any] = [None] * boardlib.SLOTS
        self.laid_keys = [0] * boardlib.SLOTS
        self.laid_depths: dict[int, int] = {}
        self.peer_boards: dict[int, boardlib.PeerBoard] = {}
        self._sorted: list[float] = []  # seconds from request to arrival, sorted (median)
        self._blobs: dict[Any, bytes] = {}  # a script's function -> its pickle (_fn_blob)
        self._fns: dict[bytes, Any] = {}  # ... and back, on the thief (_fn_of)
        ex.stats.steal_latency_median_us = 0.0

    def is_mine(self, tag: int) -> bool:
        """Whether a message of ``tag`` is a stealing one."""
        return tag >= self.base

    def connect(self, peers: list[tuple]) -> None:
        """Every rank's (host, board path or None, doorbell address or None, whether it
        has static tasks), in rank order: ranks on this host are rung after each message
        to them (see taskgraph.run.doorbell), and their boards looked on before asking
        them; ranks without tasks are fed from the start."""
        me = self.net.rank
        self.bells = doorbell.addresses(self.ex.wake, self.net.host, [(p[0], p[2]) for p in peers])
        self.bells[me] = None
        self.local = [p[0] == self.net.host for p in peers]
        self.hungry = hungry_at_start(me, [p[3] for p in peers])
        self.all_rung = all(b is not None for r, b in enumerate(self.bells) if r != me)
        self.peer_boards = {
            r: boardlib.PeerBoard(p[1])
            for r, p in enumerate(peers)
            if r != me and self.local[r] and p[1] is not None
        }
        if self.peer_boards and self.board_path is not None:  # (a rank here may take)
            try:
                self.board = boardlib.Board(self.board_path)
            except OSError:  # (no room in /dev/shm: thieves ask instead)
                self.board = None

    def close(self) -> None:
        """The run ended here: its board goes, and the others' are let go."""
        if self.board is not None:
            self.board.close()
        for b in self.peer_boards.values():
            b.close()

    def _send(self, dst: int, kind: int, payload: bytes) -> None:
        """Post one message, and ring its rank's doorbell (token held): never waits."""
        req = self.net.isend(payload, dst, self.base + kind)
        self.sends.append((req, payload))
        bell = self.bells[dst]
        if bell is not None:
            self.net.test_some([req])  # (progress: the message is there when it wakes)
            self.ex.wake.ring(bell)

    def _send_term(self, msgs: list[tuple[int, bytes]]) -> None:
        for dst, what in msgs:
            self._send(dst, TERM, what)

    # -- on the token holder's probe --------------------------------------------------

    def on_message(self, handle, src: int, tag: int, nbytes: int) -> bool:
        """A stealing message was probed: receive and handle it. Token held; True if
        it brought work or a result."""
        buf = bytearray(nbytes)
        self.net.recv_probed(handle, buf).Wait()  # (probed: it is here already)
        kind = tag - self.base
        if kind == REQUEST:
            depth = int(buf)
            payload = self._give(depth)
            if payload:
                self.hungry.pop(src, None)
            else:  # told when there is: it need not ask often meanwhile
                self.hungry[src] = depth
            self._send(src, REPLY, payload)
        elif kind == REPLY:
            self.outstanding = None
            self.ex.trace.looked(time.perf_counter() - self.asked_at)
            if buf:
                self._take(bytes(buf), src, self.asked_at)
                return True
            self.backoff.failed(time.perf_counter(), self.asked_depth)
        elif kind == PUSH:
            self._take(bytes(buf), src, None)
            return True
        elif kind == RESULT:
            self._deliver(bytes(buf), src)
            return True
        elif bytes(buf) == OFFER:
            self.backoff.succeeded()
            self.offered = src
        else:
            self._send_term(self.term.on_message(src, bytes(buf)))
        return False

    def _give(self, depth: int) -> bytes:
        """The oldest stealable spawned call deeper than ``depth`` (the thief's
        workers wait in calls that deep: they run only deeper ones), pickled and taken
        out (b"": none)."""
        ex = self.ex
        with ex.lock:
            item = self._pop_oldest(depth)
            if item is None:
                return b""
            item.state = RUNNING  # (elsewhere)
            self._key += 1  # (under the lock: a worker laying a call on the board takes one)
            key = self._key
        try:
            payload = self._wire(key, item, time.perf_counter())  # (when: a push's latency)
        except Exception:  # noqa: BLE001 - an unpicklable call stays here
            with ex.lock:
                item.pinned = True
                item.state = PENDING
                ex.spool.appendleft(item)
            return b""
        self.stolen[key] = item
        return payload

    def _wire(self, key: int, item: Any, sent: float) -> bytes:
        """The call ``item`` as it leaves this rank (see :meth:`_take`): under ``key``,
        sent at ``sent``, these and its depth in a fixed header (a thief that cannot
        unpickle the call still says which one failed). A function of the script or
        the notebook goes as its cloudpickle, made once a run (see :meth:`_fn_blob`)."""
        head = HEAD.pack(key, item.depth, sent)
        fn = item.fn
        if getattr(fn, "__module__", "__main__") != "__main__":
            return head + pack((fn, item.args, item.kwargs))
        plain_args = plain(item.args, item.kwargs)  # (else by value: see pack)
        return head + pack((self._fn_blob(fn), item.args, item.kwargs), plain_args)

    def _fn_blob(self, fn: Any) -> bytes:
        """``fn`` pickled by value, once a run while what it reads stays the same (see
        :func:`reuse_key`): each cloudpickle of a script's function scans sys.modules
        (380 µs here), which made fib without a cutoff twice as slow on 2 ranks as on
        1 (a call laid on the board at nearly every spawn)."""
        key = reuse_key(fn)
        if key is None:  # (it reads a value that may change: its pickle takes it now)
            return pickling.dumps(fn, protocol=5)
        blob = self._blobs.get(key)
        if blob is None:
            blob = pickling.dumps(fn, protocol=5)
            if len(self._blobs) >= FN_CACHE:  # (a new lambda a call: no reuse, no growth)
                self._blobs.clear()
            self._blobs[key] = blob
        return blob

    def _fn_of(self, blob: bytes) -> Any:
        """The function a victim sent as :meth:`_fn_blob`, unpickled once a run."""
        fn = self._fns.get(blob)
        if fn is None:
            fn = pickle.loads(blob)
            if len(self._fns) >= FN_CACHE:
                self._fns.clear()
            self._fns[blob] = fn
        return fn

    def _pop_oldest(self, depth: int) -> Any:
        """The oldest stealable call in the pool deeper than ``depth``, taken out (None:
        none); the board's only if it is taken back from it. Lock held."""
        spool = self.ex.spool
        for i, cand in enumerate(spool):
            if not cand.pinned and cand.depth > depth:
                del spool[i]
                if cand.slot >= 0 and not self.unpublish(cand):
                    return self._pop_oldest(depth)  # (a thief took it just now)
                return cand
        return None

    # -- this rank's board (lock held) -------------------------------------------------

    def lay(self, item: Any) -> None:
        """Lay ``item`` (in the pool, PENDING) on the board if it holds no call of its
        depth and has a free slot, and it is not the newest call of the pool: the one
        this rank's worker runs next, which a thief would take just before it is wanted
        (taking it cost fib on 2 ranks 4-5 %). Lock held, on a thread where no interrupt
        lands (see :meth:`feed`)."""
        board = self.board
        assert board is not None
        if board.changed():
            self.collect()  # (``item`` may be among the calls taken: RUNNING then)
        if item.state != PENDING or item.slot != -1 or item.pinned:
            return
        if item.depth in self.laid_depths or item is self.ex.spool[-1]:
            return
        try:
            slot = self.laid.index(None)
        except ValueError:
            return
        self._key += 1
        key = self._key
        try:
            payload = self._wire(key, item, 0.0)
        except Exception:  # noqa: BLE001 - an unpicklable call stays here
            item.pinned = True
            return
        self.stolen[key] = item
        if not board.publish(slot, key, item.depth, payload):
            del self.stolen[key]
            item.slot = -2  # (too large: asked for by message)
            return
        item.slot = slot
        self.laid[slot], self.laid_keys[slot] = item, key
        self.laid_depths[item.depth] = slot

    def lay_older(self) -> None:
        """After a spawn, lay the call spawned before the newest (see :meth:`lay`). Lock
        not held, on a thread where no interrupt lands."""
        ex = self.ex
        with ex.lock:
            if len(ex.spool) > 1:
                self.lay(ex.spool[-2])

    def _unlay(self, item: Any) -> int:
        """``item`` is off the board: its slot."""
        slot, item.slot = item.slot, -1
        self.laid[slot] = None
        del self.laid_depths[item.depth]
        return slot

    def _refill(self, depth: int) -> None:
        """Lay the oldest call of ``depth`` left in the pool (its slot was emptied), unless
        a timed attempt runs on this thread (see :meth:`feed`; a later spawn refills)."""
        ctx = getattr(_tls, "ctx", None)
        if ctx is not None and self.ex.watch.timed_on(threading.get_ident(), ctx[1]):
            return
        item = next((c for c in self.ex.spool if c.depth == depth and c.slot == -1), None)
        if item is not None:
            self.lay(item)

    def unpublish(self, item: Any) -> bool:
        """``item``, just taken out of the pool, is on the board: take it back to run
        here (True), or leave it to the thief that took it first (False: RUNNING, its
        result comes by message). Lock held."""
        assert self.board is not None
        slot = self._unlay(item)
        mine = self.board.retract(slot)
        if mine:
            del self.stolen[self.laid_keys[slot]]
        else:
            item.state = RUNNING  # (elsewhere)
        self._refill(item.depth)
        return mine

    def collect(self) -> None:
        """The calls thieves took from the board: out of the pool (RUNNING elsewhere),
        their slots refilled. Lock held."""
        assert self.board is not None
        spool = self.ex.spool
        for slot, thief in self.board.collect():
            self.hungry.pop(thief, None)  # (fed: a hint gone stale)
            item = self.laid[slot]
            if item is None:  # (an unpublish found it taken)
                continue
            self._unlay(item)
            item.state = RUNNING
            try:
                spool.remove(item)
            except ValueError:  # (the run stops: the pool was dropped)
                pass
            self._refill(item.depth)

    def _collect_changed(self) -> None:
        """:meth:`collect`, if a thief took a call since the last. Lock not held."""
        if self.board is not None and self.board.changed():
            with self.ex.lock:
                self.collect()

    # -- a thief's side ----------------------------------------------------------------

    def _claim(self, depth: int, first: int, now: float) -> bool:
        """Take a call deeper than ``depth`` from a board on this host (rank ``first``'s
        before the others'), at ``now``: True if one came. Token held."""
        boards = self.peer_boards
        for r in (first, *boards):
            b = boards.get(r)
            payload = None if b is None else b.claim(depth, self.net.rank)
            if payload is not None:
                self.ex.trace.looked(time.perf_counter() - now)
                self.ex.stats.claims += 1
                self._take(payload, r, now)
                return True
        return False

    def _take(self, payload: bytes, victim: int, asked: float | None) -> None:
        """A stolen call arrived, the answer to a request made at ``asked`` (None: pushed
        to this rank): into this rank's pool, and a waiting worker woken, before its
        bookkeeping (its name, the latency, the trace)."""
        key, depth, sent = HEAD.unpack_from(payload)
        try:
            fn, args, kwargs = _unpack(memoryview(payload)[HEAD.size :])
            if fn.__class__ is bytes:  # (a function of the victim's script: see _wire)
                fn = self._fn_of(fn)
        except Exception as exc:  # noqa: BLE001 - its parent hears why, named
            self._refuse(key, victim, exc)
            return
        args, kwargs = read_only(args, kwargs)  # (copies: as read-only as the originals)
        ex = self.ex
        fut = SpawnFuture(ex, fn, args, kwargs, depth)
        fut.remote = (victim, key)
        with ex.lock:
            ex.spool.append(fut)
            if ex.waiting:
                ex.lock.notify()
            if ex.spawn_waiting:
                ex.spawn_cv.notify_all()
            now = time.perf_counter()
            if asked is not None:
                bisect.insort(self._sorted, now - asked)
                ex.stats.steals += 1
                ex.stats.steal_latency_median_us = 1e6 * self._sorted[len(self._sorted) // 2]
            else:
                ex.stats.pushes += 1
        self.backoff.succeeded()
        pushed = asked is None
        if pushed:  # from when it was sent (one monotonic clock on one host)
            asked = min(sent, now) if self.local[victim] else now
        ex.trace.stole(victim, fut.label(), asked, now, pushed)

    def _refuse(self, key: int, victim: int, exc: Exception) -> None:
        """The call ``key`` came from ``victim`` and cannot be unpickled here: it failed,
        and its rank names it (an empty name: the victim's own). Token held."""
        net = self.net
        error = f"{type(exc).__name__}: {exc} (unpickling the call on rank {net.rank})"
        failure = ("", net.rank, net.size, net.host, error, traceback.format_exc())
        self._send(victim, RESULT, KEY.pack(key) + pack((failure, None)))

    def _deliver(self, payload: bytes, src: int) -> None:
        """The result of a call that rank ``src`` stole came back: a value that cannot
        be loaded here fails the call, named, as one that raised would."""
        (key,) = KEY.unpack_from(payload)
        item = self.stolen.pop(key)
        try:
            failure, value = _unpack(memoryview(payload)[KEY.size :])
        except Exception as exc:  # noqa: BLE001 - its waiter hears why
            net = self.net
            error = (
                f"{type(exc).__name__}: {exc} (unpickling its value, from rank {src}, on "
                f"rank {net.rank})"
            )
            failure = (item.label(), net.rank, net.size, net.host, error, traceback.format_exc())
            value = None
        if failure is not None and not failure[0]:  # (see _refuse)
            failure = (item.label(), *failure[1:])
        if item.slot >= 0:  # (taken from the board, and not collected yet)
            with self.ex.lock:
                self.collect()
        if item.remote is not None:  # stolen here, and on from here: back where it began
            victim, first = item.remote
            self._send(victim, RESULT, KEY.pack(first) + pack((failure, value)))
        self.ex.settle(item, value, None, failure)

    def _offer(self) -> None:
        """Tell each rank told "none" that has a call for it now (token held)."""
        with self.ex.lock:
            fed = [
                r
                for r, depth in self.hungry.items()
                if any(not c.pinned and c.depth > depth for c in self.ex.spool)
            ]
        for r in fed:
            self.hungry.pop(r, None)
            if not self.term.finished:
                self._send(r, TERM, OFFER)

    # -- from a worker ----------------------------------------------------------------

    def wants(self, depth: int) -> bool:
        """Whether a hungry rank takes a call of ``depth`` (a hint, without the token):
        one told "none" takes only calls deeper than it asked for, so a call no deeper
        is no reason to feed (a victim scanned its pool at each of 134 spawns so)."""
        return depth > min(self.hungry.values(), default=NO_DEPTH)  # (one C call: no race)

    def feed(self) -> bool:
        """A call was spawned here while a rank is hungry: push each hungry rank the
        oldest call deeper than it asked for, from this thread, if the network token is
        free (True; else False: the progress thread offers). Lock not held."""
        token = self.ex.transfers.token
        if not token.acquire(blocking=False):
            return False
        try:
            if self.term.finished:  # (no call exists past FINISH: a hint gone stale)
                return True
            self._collect_changed()  # (a rank that took from the board since is fed)
            for r, depth in list(self.hungry.items()):
                payload = self._give(depth)
                if not payload:
                    continue
                self.hungry.pop(r, None)
                self._send(r, PUSH, payload)
        finally:
            token.release()
        return True

    def queue_result(self, item: Any, value: Any, failure: tuple | None) -> None:
        """A stolen call ended here: queue its result for its rank. Lock not held."""
        victim, key = item.remote
        try:
            payload = KEY.pack(key) + pack((failure, value))
        except Exception as exc:  # noqa: BLE001 - the parent hears why
            net = self.net
            error = f"{type(exc).__name__}: its value cannot be pickled: {exc}"
            failure = (item.label(), net.rank, net.size, net.host, error, "")
            payload = KEY.pack(key) + pack((failure, None))
        with self.ex.lock:
            self.outbox.append((victim, RESULT, payload))
        self.ex.wake.set()

    # -- the progress thread ----------------------------------------------------------

    def next_sleep(
        self,
        sleep: float,
        waited: float,
        cap: float,
        giving: bool,
        planned: bool,
        computing: float | None = None,
    ) -> float:
        """The progress thread's next sleep, after ``sleep``, idle for ``waited`` seconds
        (see :func:`~taskgraph.run.comm.next_sleep`, up to ``cap``). While a reply is
        due (to a request of its own, or in the last rounds of termination) it doubles
        afresh from the request up to ``REPLY_SLEEP``: the asker waits for the answer,
        not for its own poll. While this rank has calls to give (``giving``) it is at
        most ``GIVE_SLEEP``: a thief waits for this rank's poll. Where every other
        rank rings this one's doorbell with each message, it doubles up to the longest
        sleep, or to ``cap`` while planned messages are due (``planned``: they do not
        ring); and while every worker computes, with none planned and none of its own
        sends left to test, it sleeps ``computing`` (the watch's pace: a 2-rank UTS
        woke every 20 ms for nothing, 15-19 ms of CPU a rank on its worker's core,
        6-9 ms so). An idle rank wakes for its next attempt when its back-off allows one,
        and does not sleep for ``REPLY_SPIN`` seconds after a request: a reply comes
        that soon mostly, and the wake-up from a sleep costs as long (its core has
        nothing else to do); but not once its back-off has grown past ``SPIN_BACKOFF``
        (its attempts find nothing: 120 attempts a 3 s idle spell on 3 ranks, ~1.3 ms
        of CPU each), and, past the spin, it sleeps until the reply rings; between
        attempts, until the next (it woke ~8 times an attempt, doubling its sleep)."""
        if (
            self.outstanding is not None
            and time.perf_counter() - self.asked_at < REPLY_SPIN
            and self.backoff.wait < SPIN_BACKOFF
        ):
            return 0.0
        if self.asking and self.outstanding is None:  # (an attempt is due at next_at)
            cap = min(cap, max(commlib.FIRST_SLEEP, self.backoff.next_at - time.perf_counter()))
        if self.all_rung:  # every stealing message comes with a ring
            if computing is not None and not planned and not self.sends and not self.asking:
                return computing  # (nothing to poll for: each message wakes it)
            if self.outstanding is not None and not planned:  # (the reply rings)
                return max(cap, commlib.LONG_SLEEP)
            if self.asking and not planned:  # (until the next attempt: an offer rings)
                return max(commlib.FIRST_SLEEP, self.backoff.next_at - time.perf_counter())
            return commlib.next_sleep(sleep, waited if planned else 1.0, cap)
        if self.outstanding is not None or (self.term.finished and not self.term.closed):
            if self._asked != self.asked_at:  # a request went out since the last sleep
                self._asked, sleep = self.asked_at, 0.0
            return commlib.next_sleep(sleep, 0.0, REPLY_SLEEP)
        sleep = commlib.next_sleep(sleep, waited, cap)
        return min(sleep, GIVE_SLEEP) if giving else sleep

    def step(self, depth: int | None, static_done: bool, quiet: bool) -> bool:
        """Post what is queued, test the sends, move termination on, and ask a victim
        for a call deeper than ``depth`` (None: this rank is not idle); ``static_done``:
        this rank's static tasks are done; ``quiet``: they are, and no spawned call is
        in its pool or running here. Token held; True when the run may end here."""
        ex = self.ex
        if self.outbox:
            with ex.lock:
                out, self.outbox = self.outbox, []
            for dst, kind, payload in out:
                self._send(dst, kind, payload)
        if self.sends:
            done = set(self.net.test_some([r for r, _ in self.sends]))
            if done:
                self.sends = [s for i, s in enumerate(self.sends) if i not in done]
        term = self.term
        if static_done and not term.static_done:
            self._send_term(term.on_static_done())
        if term.finished and self.outstanding is None and quiet:
            # (not at FINISH alone: calls that a failed call let go after this rank's
            # DONE still run, here or on a thief, and their results are due)
            self._send_term(term.on_drained())
        self._collect_changed()  # (before offering: a rank that took from the board is fed)
        if self.hungry and ex.spool:  # (a hint, without the lock)
            self._offer()
        now = time.perf_counter()
        self.asking = depth is not None and not term.finished
        due = depth is not None and self.backoff.due(now, depth)
        if self.asking and self.outstanding is None and due:
            assert depth is not None  # (asking)
            victim, self.offered = self.offered, None
            if victim is None:
                victim = choose_victim(self.net.rank, self.net.size, self.rng)
            if self.peer_boards and self._claim(depth, victim, now):
                return False
            self.outstanding = victim
            self.asked_at, self.asked_depth = now, depth
            self._send(self.outstanding, REQUEST, str(depth).encode())
        return term.closed and not self.sends and not self.outbox
