"""A rank's board: its stealable spawned calls, laid out in shared memory, where a rank
on the same host takes one without asking (one-sided stealing).

Asked for work, a victim answers when its progress thread gets the CPU back from the
worker that computes on its core: 75-170 µs on a 2-core VM, most of a steal's time
(docs/performance.md). A call on the board needs no answer. Its owner pickles it into
a slot when it spawns it, and a thief on the host takes it in tens of µs, whatever the
owner is doing::

    owner (victim)                    a slot of the board        thief (same host)
    ──────────────                    ───────────────────        ─────────────────
    spawn: a call, pickled ─────────► EMPTY -> PUBLISHED ◄────── claim, the shallowest
    to run it itself: retract ──────► PUBLISHED -> EMPTY         deep enough: its bytes,
      (False: TAKEN, the thief has it)                           PUBLISHED -> TAKEN,
    sees ``taken`` move: collect ───► TAKEN -> EMPTY             ``taken`` += 1

A thief whose workers wait in calls of depth d runs only calls deeper than d (see
taskgraph.run.dynamic), so the owner keeps one call per depth on its board, the oldest
it knows of at that depth, up to ``SLOTS`` depths; never its newest call, which its own
worker runs next (taskgraph.run.steal). A thief takes the shallowest (:func:`choose`).
Every change of state is made under ``flock`` on the file: each process opens it once, so the lock
excludes the other process (the owner's threads exclude each other under the
executor's lock), and the kernel lets it go if its holder dies. A thief that finds
nothing deep enough asks by message (taskgraph.run.steal), as a thief on another host
always does.

A board's file is named by its process (``taskgraph-board-<pid>-<n>-<random>``), made when its
run starts, and removed when the run ends; a process that died without removing its
own is swept by the next one that makes a board (:func:`sweep`).
"""

from __future__ import annotations

import glob
import itertools
import mmap
import os
import uuid

try:
    import fcntl
except ImportError:  # (not on Windows: no boards there, thieves ask)
    fcntl = None  # type: ignore[assignment]

from ..core.files import BOARD_PREFIX, SHM_DIR, remove_dead_boards

EMPTY, PUBLISHED, TAKEN = 0, 1, 2  # a slot's states
STATE, KEY, DEPTH, NBYTES, THIEF = range(5)  # a slot's header fields (int64 each)
SLOTS = 16  # depths a board holds a call of
ROW = 8  # int64 fields of a slot's header (64 bytes)
PAYLOAD = 1 << 14  # bytes of a slot's pickled call: a larger call is asked for by message
HEAD = 64 * (SLOTS + 1)  # the board's header (``taken``), then the slots' headers
SIZE = HEAD + SLOTS * PAYLOAD
DIR = SHM_DIR
PREFIX = BOARD_PREFIX
_count = itertools.count()
_swept = False


def name() -> str | None:
    """The path of a new board of this process, or None where the host has no
    shared-memory directory (or no ``flock``)."""
    if fcntl is None or not os.path.isdir(DIR):
        return None
    # (a random part too: two hosts that give the same name must not meet in one file)
    return os.path.join(DIR, f"{PREFIX}{os.getpid()}-{next(_count)}-{uuid.uuid4().hex[:12]}")


def choose(states: list[int], depths: list[int], need: int) -> int | None:
    """The slot a thief takes (a pure choice): of the PUBLISHED slots deeper than
    ``need``, the shallowest (nearest the root: the most work); None if none."""
    best = None
    for i, s in enumerate(states):
        if s == PUBLISHED and depths[i] > need and (best is None or depths[i] < depths[best]):
            best = i
    return best


def at(slot: int, field: int) -> int:
    """The index of ``field`` of ``slot`` in a board's header."""
    return ROW * (slot + 1) + field


def _unlink(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def sweep() -> None:
    """Remove the boards that processes of this host left when they died (once per
    process)."""
    global _swept
    if not _swept:
        _swept = True
        remove_dead_boards()


def files_of(pids: list[int]) -> list[str]:
    """The boards of these processes."""
    return [f for pid in pids for f in glob.glob(os.path.join(DIR, f"{PREFIX}{pid}-*"))]


def unlink_own() -> None:
    """Remove this process's boards (an abort skips the runs' own cleanup)."""
    _unlink(glob.glob(os.path.join(DIR, f"{PREFIX}{os.getpid()}-*")))


class _Mapped:
    """A board's file, opened and mapped: ``head`` (its header as int64: ``taken`` at
    0, then slot s's field f at :func:`at`) and ``mem``. Plain indexing of a memoryview,
    not numpy: a steal runs cold, where each numpy call cost 5-10 µs."""

    def __init__(self, fd: int):
        self.fd = fd
        self.mem = mmap.mmap(fd, SIZE)
        self.head = memoryview(self.mem)[:HEAD].cast("q")

    def states(self) -> list[int]:
        return self.head[ROW + STATE :: ROW].tolist()

    def __enter__(self) -> _Mapped:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def payload(self, slot: int) -> memoryview:
        start = HEAD + slot * PAYLOAD
        return memoryview(self.mem)[start : start + PAYLOAD]

    def close(self) -> None:
        self.head.release()
        try:
            self.mem.close()
        except BufferError:  # (a view still held: the mapping goes with the process)
            pass
        os.close(self.fd)


class Board:
    """This rank's board (the owner's side), at ``path``. Callers hold the executor's
    lock; ``seen`` is the ``taken`` count at the last :meth:`collect`."""

    def __init__(self, path: str):
        sweep()
        tmp = path + ".new"  # (no thief maps a file before it has its size)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            _unlink([tmp])
            raise
        self.path = path
        self.m = _Mapped(fd)
        self.seen = 0

    def changed(self) -> bool:
        """Whether a thief took a call since the last :meth:`collect` (no lock: a hint)."""
        return self.m.head[0] != self.seen

    def publish(self, slot: int, key: int, depth: int, payload: bytes) -> bool:
        """Lay the call ``key`` (of spawn depth ``depth``) in ``slot``; False if it does
        not fit, or the slot is not EMPTY (a taken call not collected yet)."""
        if len(payload) > PAYLOAD:
            return False
        m = self.m
        head, i = m.head, at(slot, 0)
        with m:
            if head[i + STATE] != EMPTY:
                return False
            m.payload(slot)[: len(payload)] = payload
            head[i + KEY], head[i + DEPTH], head[i + NBYTES] = key, depth, len(payload)
            head[i + THIEF] = -1
            head[i + STATE] = PUBLISHED
        return True

    def retract(self, slot: int) -> bool:
        """Take the call in ``slot`` back to run it here: True; False if a thief took it
        first. The slot is EMPTY after either."""
        m = self.m
        i = at(slot, STATE)
        with m:
            mine = m.head[i] == PUBLISHED
            m.head[i] = EMPTY
        return mine

    def collect(self) -> list[tuple[int, int]]:
        """(slot, thief) of each call thieves took since the last call; those slots are
        EMPTY again."""
        m = self.m
        head = m.head
        with m:
            self.seen = head[0]
            out = [(s, head[at(s, THIEF)]) for s, st in enumerate(m.states()) if st == TAKEN]
            for s, _ in out:
                head[at(s, STATE)] = EMPTY
        return out

    def close(self) -> None:
        """Remove the board (the run ended here)."""
        _unlink([self.path])
        self.m.close()


class PeerBoard:
    """Another rank's board on this host (the thief's side), mapped at the first
    :meth:`claim`. Callers hold the network token."""

    def __init__(self, path: str):
        self.path = path
        self._m: _Mapped | None = None

    def claim(self, need: int, thief: int) -> bytes | None:
        """The shallowest call on the board deeper than ``need``, taken (its owner
        learns it from the board); None if there is none."""
        m = self._m
        if m is None:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except OSError:  # (gone with its run)
                return None
            m = self._m = _Mapped(fd)
        if PUBLISHED not in m.states():  # (a hint, without the lock)
            return None
        head = m.head
        with m:
            slot = choose(m.states(), head[ROW + DEPTH :: ROW].tolist(), need)
            if slot is None:
                return None
            i = at(slot, 0)
            payload = bytes(m.payload(slot)[: head[i + NBYTES]])
            head[i + THIEF] = thief
            head[i + STATE] = TAKEN
            head[0] += 1
        return payload

    def close(self) -> None:
        if self._m is not None:
            self._m.close()
            self._m = None
