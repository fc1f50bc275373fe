"""Communication: the only module that imports mpi4py.

:class:`World` is the set of ranks this process belongs to: ``COMM_WORLD`` under an
MPI launcher, or a single rank with no MPI at all (mpi4py is then never imported). Its
communicator is taskgraph's own duplicate of ``COMM_WORLD``: a script's own collectives
on ``COMM_WORLD``, beside a run thread's ``Idup``, hung Open MPI 4.1 (3 ranks, 2 jobs of
3), as collectives of two threads on one communicator may.
Each run gets a :class:`Network` of its own, on a duplicated communicator, so that a
failed or cancelled run can never leave a message that a later run matches, and runs
in flight at once never see each other's messages. Its communicators
(:class:`RunComms`) are queued in the thread that makes the run, where every rank makes
runs in the same order, and duplicated (``Idup``) from that queue one at a time, in its
order: two run threads that duplicated concurrently would pair up their ranks'
duplicates in different orders (MPI matches collectives on one communicator by the
order they are started), and Open MPI 4.1 hung with several ``Idup`` of one
communicator outstanding (two runs in flight on 3 ranks: 3 of 3 jobs within 6 pairs).

Transfers are non-blocking and buffer-based::

    tile   Isend(array) ------------------------> Irecv(array)   posted ahead, exact size
    value  Isend(pickled bytes) ----------------> Improbe + Imrecv(bytearray of its size)
    signal Isend(0 bytes) ----------------------> Improbe + Imrecv
    abort  Isend(pickled error, CONTROL_TAG) ---> Improbe, on every rank

Large messages between ranks on one node move in one copy where the node allows it
(:mod:`taskgraph.run.singlecopy`): with MPICH's default shared-memory cells, a rank busy
in Python between two tests stalls the transfer.

One thread at a time calls into a Network (the executor's network token: its
progress thread, or an idle worker polling), so MPI must provide at least
``MPI_THREAD_SERIALIZED``; mpi4py asks for ``MPI_THREAD_MULTIPLE`` by default, and
:class:`World` checks what the library granted.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core import affinity, config, pickling
from ..core.errors import RunError
from ..core.files import note_segments, unlink_own_shm
from . import board
from .singlecopy import CMA_VARS, enable_single_copy

CONTROL_TAG = 0

FIRST_SLEEP = 2e-5  # the first sleep of a poller that found nothing
IDLE_FRACTION = 0.05  # past its cap, a poller sleeps up to this share of its wait so far
LONG_SLEEP = 5e-3  # ... and never longer than this


def next_sleep(sleep: float, waited: float, cap: float) -> float:
    """The next sleep of a poller that found nothing, after sleeping ``sleep`` and
    waiting ``waited`` seconds in all: doubling from 20 µs up to ``cap``, then up to
    5 % of the wait so far (at most 5 ms).

    A short wait is answered within ``cap``; a long one wakes a few hundred times a
    second at most (a waiting rank uses almost no CPU), and its last sleep adds at
    most 5 % to its length.
    """
    cap = max(cap, min(LONG_SLEEP, waited * IDLE_FRACTION))
    return min(cap, max(FIRST_SLEEP, sleep * 2))


class Network:
    """One run's point-to-point layer. This base class is the single rank: no peers."""

    rank = 0
    size = 1
    cores = 1  # this rank's cores, shared with no other rank of the node
    # every peer on this node, with large messages moved in one copy (see singlecopy)
    single_copy_node = False

    def __init__(self):
        self.host = socket.gethostname()

    # sends and receives return opaque handles, tested with test_some
    def isend(self, buf, dst: int, tag: int):
        raise RuntimeError("a single rank has no peers to send to")

    def irecv(self, buf, src: int, tag: int):
        raise RuntimeError("a single rank has no peers to receive from")

    def probe(self):
        """An unexpected message: (handle, source, tag, nbytes), or None."""
        return None

    def recv_probed(self, handle, buf):
        raise RuntimeError("nothing to receive")

    def test_some(self, handles: list, full: bool = True) -> list[int]:
        """Indices of the completed handles (``full`` False: the first one only)."""
        return []

    def cancel(self, handles: list) -> None:
        pass

    def abandon(self, handles: list) -> None:
        pass

    def barrier_start(self) -> None:
        pass

    def barrier_done(self) -> bool:
        return True

    def barrier(self) -> None:
        """Wait for every rank, sleeping meanwhile."""
        self.barrier_start()
        sleep, t0 = 0.0, time.perf_counter()
        while not self.barrier_done():
            sleep = next_sleep(sleep, time.perf_counter() - t0, 1e-3)
            time.sleep(sleep)

    def allgather(self, obj) -> list:
        return [obj]

    def gather(self, obj, root: int = 0) -> list | None:
        return [obj]

    def close(self, retire: bool = False) -> None:
        pass


# communicators of failed runs, never freed: an abort or a send abandoned on the way
# may still arrive there, and a freed communicator's context id is reused by a later
# run's Dup, whose receives and probes would then match it
_RETIRED: list = []


class MPINetwork(Network):
    """A run's network over a duplicate of the world communicator (``dup``), or over
    ``comm`` itself, a communicator made for this run alone (:class:`RunComms`)."""

    def __init__(self, comm, dup: bool = True):
        super().__init__()
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm.Dup() if dup else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        self._status = MPI.Status()
        self._barrier = None
        # mpi4py's own methods, without a Python call around them (on every message)
        self.isend = self.comm.Isend  # type: ignore[method-assign]
        self.irecv = self.comm.Irecv  # type: ignore[method-assign]

    def probe(self):
        MPI = self.MPI
        msg = self.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status)
        if msg is None:
            return None
        st = self._status
        return msg, st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)

    def recv_probed(self, handle, buf):
        return handle.Irecv(buf)

    def test_some(self, handles, full=True):
        if not handles:
            return []
        # the oldest first, alone: messages mostly complete in the order they were
        # posted, and one Test costs a fraction of a Testsome over a list
        if handles[0].Test():
            return [0]
        if len(handles) == 1 or not full:
            return []
        done = self.MPI.Request.Testsome(handles)
        return list(done) if done else []

    def cancel(self, handles):
        """Cancel pending receives and wait for them to finish (cancelled or not)."""
        for h in handles:
            h.Cancel()
        if handles:
            self.MPI.Request.Waitall(handles)

    def abandon(self, handles):
        """Forget sends that may never be matched (their peer stopped)."""
        for h in handles:
            try:
                h.Free()
            except self.MPI.Exception:
                pass

    def barrier_start(self):
        self._barrier = self.comm.Ibarrier()

    def barrier_done(self):
        return self._barrier is None or bool(self._barrier.Test())

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def gather(self, obj, root: int = 0):
        return self.comm.gather(obj, root)

    def close(self, retire: bool = False):
        """Free the run's communicator; ``retire``: keep it for good instead (a failed
        run: see ``_RETIRED``)."""
        if retire:
            _RETIRED.append(self.comm)
            return
        try:
            self.comm.Free()
        except self.MPI.Exception:
            pass


dumps = pickling.plain_first  # a value for another rank; :func:`loads` reads either kind


def loads(buf) -> object:
    return pickle.loads(buf)


ABORT_GRACE = 0.5  # seconds between a rank's last words and MPI_Abort


def abort_hook(previous, abort, rank: int, size: int):
    """An uncaught-exception hook for one rank of a job: ``previous`` prints the
    traceback, then a line says which rank ended the job, then ``abort()``.

    Without it a rank that raises outside a run (a bad argument, a typo after the
    first ``tg.Cluster()``) goes into MPI_Finalize while the others wait for it in
    their next collective: the job hangs until its time limit. MPI_Abort ends every
    rank at once, as ``python -m mpi4py`` does."""

    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
            print(
                f"taskgraph: rank {rank}/{size} raised {kind.__name__}: ending the whole "
                "job (MPI_Abort) so that the other ranks do not wait for it",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
        finally:
            abort()

    return hook


def install_abort_hook(comm, rank: int, size: int) -> None:
    """Make an uncaught exception in this rank's main thread end the job (once)."""
    if getattr(sys.excepthook, "taskgraph_abort", False):
        return

    def abort() -> None:
        # the launcher forwards a rank's output from a pipe and stops once it is told
        # of the abort: without a moment's grace the traceback came out cut short
        time.sleep(ABORT_GRACE)
        unlink_own_shm()  # an abort skips MPI_Finalize, which would remove them
        board.unlink_own()  # ... and the runs' own cleanup
        comm.Abort(1)

    hook = abort_hook(sys.excepthook, abort, rank, size)
    hook.taskgraph_abort = True
    sys.excepthook = hook


class World:
    """The ranks of this job: a duplicate of COMM_WORLD under MPI (``comm``: the user's
    own COMM_WORLD stays theirs), or one rank without MPI.

    ``values`` is a duplicate of ``comm`` kept for sharing single values after a run
    (:func:`share_value`), apart from the runs' own communicators and the user's.
    """

    def __init__(self, use_mpi: bool | None = None):
        use_mpi = config.use_mpi() if use_mpi is None else use_mpi
        self.host = socket.gethostname()
        self.comm: Any = None
        self.values: Any = None
        self.rank, self.size, self.local_size = 0, 1, 1
        self.single_copy = False
        self.bound_cpus: list[int] | None = None  # this rank's share, if it bound itself
        self.cores = len(affinity.current())  # this rank's, shared with no other rank here
        self.parent_size = 1  # ranks of the job this world is part of
        self.runs = 0  # runs made on this world so far: the same count on every rank
        self.dup_queue: deque[RunComms] = deque()  # runs whose communicators are not made
        self.dup_lock = threading.Lock()  # held while the queue's head is duplicated
        if use_mpi:
            if "mpi4py.MPI" not in sys.modules:  # (MPI reads its settings when it starts)
                enable_single_copy()
            from mpi4py import MPI

            if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
                raise RuntimeError(
                    "taskgraph calls MPI from more than one thread (one at a time) and "
                    "needs MPI_THREAD_SERIALIZED or more; this MPI library granted "
                    f"level {MPI.Query_thread()}: do not lower mpi4py.rc.thread_level"
                )
            self.comm = MPI.COMM_WORLD.Dup()  # (taskgraph's own: see the module's doc)
            # mpi4py's first object reduction on a communicator duplicates it, blocking
            # every rank; a script's first comm.allreduce, beside a run thread's Idup,
            # hung both MPIs (2 and 3 ranks, 10 of 10): done here, where all ranks are
            MPI.COMM_WORLD.allreduce(0)
            # large messages between ranks on one node in one copy (an MPICH setting;
            # Open MPI's shared-memory transport does that by itself where it can)
            self.single_copy = "MPICH" in MPI.Get_library_version() and any(
                os.environ.get(v, "").strip() == "1" for v in CMA_VARS
            )
            self.rank = self.comm.Get_rank()
            self.size = self.parent_size = self.comm.Get_size()
            if self.size > 1:
                install_abort_hook(self.comm, self.rank, self.size)
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            self.local_size = node.Get_size()
            self.bound_cpus, self.cores = self._bind(node)
            node.Free()
            self.values = self.comm.Dup()
            note_segments()  # (for the launcher, should this rank be killed hard)

    def split(self, n: int) -> World | None:
        """The first ``n`` ranks of this world, as a world of their own; None on the
        other ranks. Collective: every rank of this world calls it, in the same order."""
        if not 1 <= n <= self.size:
            raise ValueError(f"a world of {self.size} ranks has no part of {n} ranks")
        if n == self.size:
            return self
        if self.comm is None:  # (n < size = 1 cannot happen)
            return self
        from mpi4py import MPI

        sub = self.comm.Split(0 if self.rank < n else MPI.UNDEFINED, self.rank)
        if sub == MPI.COMM_NULL:
            return None
        part = World.__new__(World)
        part.host, part.comm, part.values = self.host, sub, sub.Dup()
        part.rank, part.size = sub.Get_rank(), sub.Get_size()
        part.single_copy, part.bound_cpus = self.single_copy, self.bound_cpus
        part.cores = self.cores
        part.parent_size, part.runs = self.parent_size, 0
        part.dup_queue, part.dup_lock = deque(), threading.Lock()
        node = sub.Split_type(MPI.COMM_TYPE_SHARED)
        part.local_size = node.Get_size()
        node.Free()
        return part

    @staticmethod
    def _bind(node) -> tuple[list[int] | None, int]:
        """This rank onto its share of the node's CPUs, if the launcher left every
        rank on all of them (:mod:`taskgraph.core.affinity`): the CPUs (None if it did
        not bind), and this rank's cores (its share, bound or not)."""
        # every rank takes part in the allgather, whatever its own settings say: a
        # rank that skipped it would leave the others waiting
        everyone = node.allgather(affinity.current())
        cores = affinity.rank_cores(node.Get_rank(), everyone)
        if not config.bind():
            return None, cores
        key = affinity.topology_key()
        cpus = affinity.share(node.Get_rank(), everyone, affinity.cpu_quota(), key)
        if cpus is None or not affinity.bind(cpus):  # (not here, or not allowed: unbound)
            return None, cores
        return cpus, len(cpus)

    def network(self) -> Network:
        return MPINetwork(self.comm) if self.comm is not None else Network()

    def run_comms(self) -> RunComms:
        """Queue a new run's communicators (see :class:`RunComms`). Every rank calls it
        once per run, in the order the runs are made."""
        return RunComms(self)

    def make_queued(self, until: RunComms | None = None) -> None:
        """Duplicate the communicators of the runs queued (:class:`RunComms`), in order,
        up to ``until`` (all: None). Lock ``dup_lock`` held; collective."""
        queue = self.dup_queue
        while queue and (until is None or until._pending):
            head = queue[0]
            head.net = dup_sleeping(self.comm)
            head.values = dup_sleeping(self.comm)
            head._pending = False
            queue.popleft()

    @contextlib.contextmanager
    def settled(self) -> Iterator[None]:
        """No duplication of this world's communicator under way meanwhile (those
        queued are made first, in order): a collective on it beside an ``Idup`` hung
        Open MPI 4.1 (see :class:`RunComms`)."""
        with self.dup_lock:
            self.make_queued()
            yield

    def barrier(self, poll_max: float = 1e-3) -> None:
        """A barrier that sleeps while it waits (MPI_Barrier would spin on a core)."""
        if self.comm is not None:
            with self.settled():
                wait_sleeping(self.comm.Ibarrier(), poll_max)

    def bcast(self, obj, root: int = 0):
        if self.comm is None:
            return obj
        with self.settled():
            return self.comm.bcast(obj, root)

    def allgather(self, obj) -> list:
        if self.comm is None:
            return [obj]
        with self.settled():
            return self.comm.allgather(obj)

    def gather_tiles(self, matrix, out: np.ndarray | None, root: int | None) -> None:
        """Copy every tile of ``matrix`` into ``out`` on root (every rank if None)."""
        for (i, j), arr in matrix.tiles.items():
            if out is not None:
                matrix.block(out, i, j)[...] = arr
        if self.comm is None:
            return
        targets = range(self.size) if root is None else [root]
        for dst in targets:
            self._send_tiles_to(matrix, out, dst)

    def _send_tiles_to(self, matrix, out, dst: int) -> None:
        """Every owner sends dst the tiles it lacks, one at a time, in index order."""
        comm = self.comm
        assert comm is not None
        scratch: dict[tuple, np.ndarray] = {}
        for tag, (i, j) in enumerate(matrix.indices()):
            owner = matrix.owner(i, j)
            if owner == dst:
                continue
            if self.rank == owner:
                comm.Send(wire(matrix.tiles[i, j]), dst, tag)
            elif self.rank == dst:
                shape = matrix.tile_shape(i, j)
                buf = scratch.get(shape)
                if buf is None:
                    buf = scratch[shape] = np.empty(shape, matrix.dtype, order="F")
                comm.Recv(wire(buf), owner, tag)
                matrix.block(out, i, j)[...] = buf


class RunComms:
    """One run's own communicators, duplicated from ``world.comm`` in the order runs are
    made (the same on every rank): queued when the run is made, then made by the first
    run thread that needs its own (:meth:`ready`): it makes those queued before them
    first, each ``Idup`` waited for, sleeping, before the next is posted.

    ``net``: the run's messages (:meth:`network`); ``values``: what the ranks share when
    it ends (:func:`taskgraph.cluster.jobrun.share_data`), apart from any other run's
    collectives. Both None without MPI.
    """

    def __init__(self, world: World):
        self.size, self.rank = world.size, world.rank
        self.world = world
        self.net: Any = None
        self.values: Any = None
        self._pending = world.comm is not None
        if self._pending:
            world.dup_queue.append(self)

    def ready(self) -> None:
        """Make this run's communicators, and those of the runs queued before it, if not
        made yet (collective: every rank makes them in the queue's order)."""
        if not self._pending:
            return
        with self.world.dup_lock:
            self.world.make_queued(until=self)

    def network(self) -> Network:
        """The run's network, on ``net``, which it then closes (call :meth:`ready` first)."""
        comm, self.net = self.net, None
        if comm is None:
            return Network()
        net = MPINetwork(comm, dup=False)
        world = self.world
        net.cores = world.cores
        net.single_copy_node = world.single_copy and world.local_size == world.size
        return net

    def close(self, retire: bool = False) -> None:
        """Free ``values``, and ``net`` if no network took it (``retire``: keep them for
        good instead: a failed run, see ``_RETIRED``)."""
        self.ready()  # (a communicator is freed only once it exists)
        for comm in (self.values, self.net):
            if comm is None:
                continue
            if retire:
                _RETIRED.append(comm)
            else:
                comm.Free()
        self.values = self.net = None


def wire(arr: np.ndarray) -> np.ndarray:
    """``arr`` as MPI can move it: itself, or a view of its bytes where MPI has no type
    for its dtype (datetime64, timedelta64, strings, void and structured). ``arr`` must
    be contiguous (tiles, pooled buffers and marked arrays are)."""
    if arr.dtype.kind in "MmSUV":
        return arr.ravel(order="K").view(np.uint8)
    return arr


VALUE_TAG = 1  # on World.values: one value, shared by the rank that holds it


def share_value(world: World, holder: int, key: tuple, value, timeout: float, what: str):
    """``value`` (meaningful on rank ``holder`` only) on every rank of ``world``.

    Every rank calls it with the same ``holder`` and ``key``: the holder sends the
    pickled value to each other rank, the others receive it. Nobody waits past
    ``timeout`` seconds: a rank that never calls (the script is not the same on every
    rank) makes the others raise a RunError naming ``what`` and the ranks, instead of
    hanging. A value that cannot be pickled fails on every rank at once. ``key``
    travels with the value, so that ranks asking for different values in the same
    call are told so.
    """
    comm = world.values
    if comm is None or world.size == 1:
        return value
    deadline = time.monotonic() + timeout
    if world.rank == holder:
        return _send_value(world, key, value, deadline, timeout, what)
    return _recv_value(world, holder, key, deadline, timeout, what)


def _send_value(world: World, key: tuple, value, deadline: float, timeout: float, what: str):
    comm = world.values
    assert comm is not None
    failure = None
    try:
        payload = dumps((key, True, value))
    except Exception as exc:  # noqa: BLE001 - told to every rank, then raised here
        failure = exc
        payload = dumps((key, False, f"{type(exc).__name__}: {exc}"))
    others = [r for r in range(world.size) if r != world.rank]
    reqs = [comm.Isend(payload, r, VALUE_TAG) for r in others]
    pending = _wait_until(reqs, deadline)
    if pending:
        ranks = ", ".join(str(others[i]) for i in pending)
        for i in pending:
            try:
                reqs[i].Free()
            except Exception:  # noqa: BLE001 - already complete or freed
                pass
        raise RunError(
            f"the value of {what} lives on rank {world.rank}: rank(s) {ranks} did not take "
            f"it within {timeout:g} s. In a batch job every rank must call .result() on "
            "the same futures, in the same order"
        )
    if failure is not None:
        raise RunError(
            f"the value of {what} on rank {world.rank} cannot be sent to the other ranks "
            f"({type(failure).__name__}: {failure})"
        ) from failure
    return value


def _recv_value(world: World, holder: int, key: tuple, deadline: float, timeout: float, what):
    comm = world.values
    assert comm is not None
    from mpi4py import MPI

    status = MPI.Status()
    sleep, t0 = 0.0, time.perf_counter()
    while (msg := comm.improbe(holder, VALUE_TAG, status)) is None:
        if time.monotonic() > deadline:
            raise RunError(
                f"the value of {what} lives on rank {holder}, which did not send it to rank "
                f"{world.rank} within {timeout:g} s. In a batch job every rank must call "
                ".result() on the same futures, in the same order"
            )
        sleep = next_sleep(sleep, time.perf_counter() - t0, 1e-3)
        time.sleep(sleep)
    buf = bytearray(status.Get_count(MPI.BYTE))
    msg.Recv(buf)
    parts: Any = loads(buf)
    got, ok, value = parts
    if got != key:
        other = f"{got[-1]}" if got[1:] != key[1:] else "the same task in another run"
        raise RunError(
            f"rank {world.rank} asked rank {holder} for the value of {what}, and got the "
            f"value of {other} instead: call .result() on the same futures, in the same "
            "order, on every rank"
        )
    if not ok:
        raise RunError(
            f"the value of {what} on rank {holder} cannot be sent to the other ranks ({value})"
        )
    return value


FILE_TAG = 2  # on World.values: rank 0 wrote a file the other ranks may read


def tell_written(world: World, path: str) -> None:
    """Rank 0 wrote ``path``: tell every other rank (small sends, not waited for)."""
    comm = world.values
    if comm is None or world.size == 1:
        return
    data = dumps(path)
    for r in range(1, world.size):
        comm.Isend(data, r, FILE_TAG).Free()


def wait_written(world: World, path: str, timeout: float) -> bool:
    """Wait until rank 0 says it wrote ``path`` (:func:`tell_written`); False if it
    has not within ``timeout`` s. Notices of other files (that this rank never waited
    for) are dropped on the way."""
    comm = world.values
    if comm is None or world.size == 1:
        return True
    from mpi4py import MPI

    status, deadline = MPI.Status(), time.monotonic() + timeout
    sleep, t0 = 0.0, time.perf_counter()
    while time.monotonic() < deadline:
        msg = comm.improbe(0, FILE_TAG, status)
        if msg is None:
            sleep = next_sleep(sleep, time.perf_counter() - t0, 1e-3)
            time.sleep(sleep)
            continue
        buf = bytearray(status.Get_count(MPI.BYTE))
        msg.Recv(buf)
        if loads(buf) == path:
            return True
    return False


def _wait_until(reqs: list, deadline: float) -> list[int]:
    """Wait for MPI requests, sleeping, until ``deadline``; the indices still pending."""
    pending = list(range(len(reqs)))
    sleep, t0 = 0.0, time.perf_counter()
    while pending:
        pending = [i for i in pending if not reqs[i].Test()]
        if not pending or time.monotonic() > deadline:
            break
        sleep = next_sleep(sleep, time.perf_counter() - t0, 1e-3)
        time.sleep(sleep)
    return pending


def dup_sleeping(comm) -> Any:
    """A duplicate of ``comm`` (collective), waited for sleeping, not spinning a core."""
    new, request = comm.Idup()
    wait_sleeping(request)
    return new


def wait_sleeping(request, poll_max: float = 1e-3) -> None:
    """Wait for an MPI request, sleeping between tests (see :func:`next_sleep`)."""
    sleep, t0 = 0.0, time.perf_counter()
    while not request.Test():
        sleep = next_sleep(sleep, time.perf_counter() - t0, poll_max)
        time.sleep(sleep)


@functools.lru_cache(maxsize=1)
def world() -> World:
    """The world of this process, made once."""
    return World()
