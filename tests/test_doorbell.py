"""The doorbell that wakes a sleeping progress thread (taskgraph.run.doorbell), and the
pure decision of when a rank is idle enough to steal (taskgraph.run.steal.idle_depth)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from taskgraph.run import doorbell
from taskgraph.run.steal import idle_depth

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets"),
]


def test_a_bell_rung_from_another_thread_wakes_its_waiter_and_stays_rung_until_cleared():
    bell = doorbell.Doorbell()
    try:
        assert not bell.wait(0.01)
        threading.Timer(0.05, bell.set).start()
        t0 = time.perf_counter()
        assert bell.wait(5.0)
        assert time.perf_counter() - t0 < 2.0
        assert bell.is_set() and bell.wait(0)  # rung until cleared
        bell.clear()
        assert not bell.is_set()
    finally:
        bell.close()


def test_another_process_rings_a_bell_by_its_address():
    bell = doorbell.Doorbell()
    code = (
        "import sys\nfrom taskgraph.run.doorbell import Doorbell\n"
        "b = Doorbell()\nb.ring(chr(0) + sys.argv[1])\nb.close()\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code, bell.address[1:]], timeout=30)
        assert proc.returncode == 0
        assert bell.wait(5.0)
    finally:
        bell.close()


def test_ringing_a_closed_bell_or_a_full_one_never_raises():
    gone = doorbell.Doorbell()
    gone.close()
    bell = doorbell.Doorbell()
    try:
        bell.ring(gone.address)
        for _ in range(10000):  # far past the socket's queue
            bell.set()
        assert bell.is_set()
        bell.clear()
        assert not bell.is_set()
    finally:
        bell.close()
    assert bell.wait(0.01)  # closed under a waiter: it returns, never sleeps on


def test_only_ranks_on_this_host_with_a_bell_are_rung():
    bell = doorbell.Doorbell()
    try:
        peers = [("a", "\0x"), ("b", "\0y"), ("a", None), ("a", "\0z")]
        assert doorbell.addresses(bell, "a", peers) == ["\0x", None, None, "\0z"]
        assert doorbell.addresses(threading.Event(), "a", peers) == [None] * 4
    finally:
        bell.close()


def calls(*depths: int) -> list:
    return [SimpleNamespace(depth=d) for d in depths]


def test_a_rank_is_idle_only_when_no_worker_can_run_anything_here():
    # a static task is ready, or a worker is busy: not idle
    assert idle_depth(True, [], 1, [], 1) is None
    assert idle_depth(False, [], 0, [], 1) is None
    assert idle_depth(False, [], 1, [0], 3) is None
    # an idle worker runs any call: idle only with none here, and it takes any depth
    assert idle_depth(False, [], 1, [], 1) == -1
    assert idle_depth(False, calls(1), 1, [2], 2) is None
    assert idle_depth(False, [], 1, [2], 2) == -1


def test_a_worker_waiting_above_only_shallower_calls_steals_deeper_ones():
    # the waiting worker runs only deeper calls: shallower ones leave it idle
    assert idle_depth(False, calls(1, 2), 0, [2], 1) == 2
    assert idle_depth(False, calls(1, 3), 0, [2], 1) is None
    # with several waiting, the shallowest wait decides
    assert idle_depth(False, calls(2), 0, [3, 1], 2) is None
    assert idle_depth(False, calls(1), 0, [3, 1], 2) == 1
