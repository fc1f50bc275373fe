"""A rank's board (taskgraph.run.board): the slot a thief takes, the states a call
goes through, and the file lock that keeps a call from running twice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from taskgraph.core.files import dead_files
from taskgraph.run import board as boardlib
from taskgraph.run.board import EMPTY, PUBLISHED, TAKEN, Board, PeerBoard, choose

pytestmark = pytest.mark.skipif(not os.path.isdir(boardlib.DIR), reason="no /dev/shm here")


def test_a_thief_takes_the_shallowest_published_call_deeper_than_it_needs():
    """slot:   0          1       2          3
    state:  PUBLISHED  TAKEN   PUBLISHED  PUBLISHED
    depth:  5          2       3          1
    need > 2: slot 2 (depth 3), not the taken one, not depth 1."""
    states, depths = [PUBLISHED, TAKEN, PUBLISHED, PUBLISHED], [5, 2, 3, 1]
    assert choose(states, depths, 2) == 2
    assert choose(states, depths, 0) == 3
    assert choose(states, depths, 4) == 0
    assert choose(states, depths, 5) is None
    assert choose([EMPTY, TAKEN], [9, 9], -1) is None


def test_only_the_boards_of_dead_processes_are_swept():
    paths = [
        "/dev/shm/taskgraph-board-11-0-3fa2c9",
        "/dev/shm/taskgraph-board-12-3-0b1d77.new",
        "/dev/shm/taskgraph-board-13-1-9e0f11",
        "/dev/shm/mpich_shm_11",
        "/dev/shm/taskgraph-board-x-1-3fa2c9",
    ]
    assert dead_files(paths, lambda pid: pid == 13) == paths[:2]


@pytest.fixture
def boards():
    own = Board(boardlib.name())
    peer = PeerBoard(own.path)
    yield own, peer
    peer.close()
    own.close()


def test_a_claimed_call_is_gone_for_its_owner_and_a_retracted_one_for_the_thief(boards):
    own, peer = boards
    assert own.publish(0, key=1, depth=3, payload=b"one")
    assert own.publish(1, key=2, depth=1, payload=b"two")
    assert peer.claim(need=2, thief=1) == b"one"  # (depth 1 is too shallow for it)
    assert own.changed()
    assert not own.retract(0)  # the thief has it: the owner must not run it
    assert own.collect() == []  # (the retract emptied its slot already)
    assert not own.changed()
    assert own.retract(1)  # the owner runs this one itself
    assert peer.claim(need=-1, thief=1) is None  # ... so no thief can take it


def test_a_taken_call_is_collected_once_and_its_slot_is_free_again(boards):
    own, peer = boards
    assert own.publish(4, key=7, depth=2, payload=b"x" * 1000)
    assert peer.claim(need=0, thief=2) == b"x" * 1000
    assert own.collect() == [(4, 2)]  # (slot 4, taken by rank 2)
    assert own.collect() == []
    assert own.publish(4, key=8, depth=2, payload=b"again")
    assert peer.claim(need=0, thief=2) == b"again"


def test_a_call_too_large_for_a_slot_is_not_laid(boards):
    own, peer = boards
    assert not own.publish(0, key=1, depth=1, payload=b"x" * (boardlib.PAYLOAD + 1))
    assert peer.claim(need=-1, thief=1) is None


def test_a_board_is_removed_when_its_run_ends():
    own = Board(boardlib.name())
    assert os.path.exists(own.path)
    own.close()
    assert not os.path.exists(own.path)
    assert PeerBoard(own.path).claim(need=-1, thief=1) is None  # (gone: nothing to take)


THIEF = """
import sys
from taskgraph.run.board import PeerBoard
peer, got = PeerBoard(sys.argv[1]), []
while not got or got[-1] != b"stop":
    payload = peer.claim(need=-1, thief=1)
    if payload is not None:
        got.append(payload)
print(" ".join(p.decode() for p in got[1:-1]))  # (the first: the owner's "ready")
"""


@pytest.mark.timeout(60)
def test_a_call_raced_for_by_its_owner_and_a_thief_runs_exactly_once(tmp_path):
    """The owner lays calls and takes each back, at once or after a moment, while a
    thief in another process claims as fast as it can: every call laid is the owner's
    or the thief's, never both, never neither."""
    own = Board(boardlib.name())
    script = tmp_path / "thief.py"
    script.write_text(textwrap.dedent(THIEF))
    proc = subprocess.Popen(
        [sys.executable, str(script), own.path], stdout=subprocess.PIPE, text=True
    )
    try:
        own.publish(0, -2, 1, b"ready")  # (the race starts once the thief takes: a thief
        deadline = time.monotonic() + 30  # slow to start under load took none, once)
        while not own.changed():
            assert time.monotonic() < deadline and proc.poll() is None, "no thief"
            time.sleep(0.001)
        own.collect()
        laid, kept, lost = set(), set(), 0
        stop_at = time.monotonic() + 20
        for key in range(20000):  # (until each side has won races: under load one may
            if len(kept) >= 50 and lost >= 50 or time.monotonic() > stop_at:  # win
                break  # every one of the first thousands, a fresh clone's suite once)
            if own.changed():
                own.collect()
            if not own.publish(0, key, 1, str(key).encode()):
                continue  # (a call taken and not collected yet: its slot is not free)
            laid.add(key)
            if key % 2:  # (the thief has a moment to take it)
                deadline = time.perf_counter() + 0.005
                while not own.changed() and time.perf_counter() < deadline:
                    pass
            if own.retract(0):
                kept.add(key)
            else:
                lost += 1
        while True:
            own.collect()
            if own.publish(0, -1, 1, b"stop"):
                break
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        own.close()
    taken = {int(k) for k in out.split()}
    assert taken and kept  # (both sides won some races)
    assert not kept & taken
    assert kept | taken == laid


def test_a_board_left_by_a_killed_process_is_swept_by_the_next_one(monkeypatch):
    code = (
        "import os\nfrom taskgraph.run import board\n"
        "b = board.Board(board.name())\nprint(b.path, flush=True)\nos._exit(0)\n"
    )
    left = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert os.path.exists(left)  # (it died without removing its board)
    monkeypatch.setattr(boardlib, "_swept", False)
    own = Board(boardlib.name())
    try:
        assert not os.path.exists(left)
    finally:
        own.close()


def _leaf(n: int) -> int:
    return n


class _Net:
    rank, size, host, tag_ub = 0, 2, "here", 1 << 20


class _Ex:
    """What a Stealer uses of its executor, for laying and collecting."""

    def __init__(self):
        import threading
        from collections import deque
        from types import SimpleNamespace

        self.lock = threading.Condition()
        self.spool = deque()
        self.stats = SimpleNamespace(steal_latency_median_us=0.0, claims=0)


def test_a_call_a_thief_took_is_never_laid_again_and_the_newest_never_at_all():
    """Pool (oldest first): a(d1) b(d2) c(d3). b is laid; a thief takes it. Laying b
    again (its owner collects the board on the way) must not put it back: it would
    run twice. c, the newest, is the owner's next call: never laid."""
    from taskgraph.run.dynamic import PENDING, RUNNING, SpawnFuture
    from taskgraph.run.steal import Stealer

    ex = _Ex()
    st = Stealer(ex, _Net())
    st.board = Board(boardlib.name())
    peer = PeerBoard(st.board.path)
    try:
        a, b, c = (SpawnFuture(ex, _leaf, (i,), {}, i) for i in (1, 2, 3))
        ex.spool.extend([a, b, c])
        with ex.lock:
            st.lay(c)
            st.lay(b)
        assert c.slot == -1 and b.slot >= 0
        assert peer.claim(need=1, thief=1) is not None  # b, taken
        with ex.lock:
            st.lay(b)
        assert b.state == RUNNING and b.slot == -1 and list(ex.spool) == [a, c]
        assert peer.claim(need=1, thief=1) is None  # b is not on the board again
        assert a.state == PENDING
    finally:
        peer.close()
        st.board.close()
