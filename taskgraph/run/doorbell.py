"""A doorbell: a thread sleeps until it is rung, by a thread of its own process or by
another rank on the same host.

A rank that asks another for work (taskgraph.run.steal) sends the MPI message, then
rings the other's doorbell: its progress thread, asleep in :meth:`Doorbell.wait`, wakes
at once and probes. Neither side polls in short sleeps for a reply that may be long in
coming (on a VM a timed sleep costs tens of µs of CPU each time), and neither spins.

A doorbell is a non-blocking datagram socket in Linux's abstract namespace (no file,
gone with its process); elsewhere :func:`make` gives a plain ``threading.Event`` and
ranks poll as before. It has the ``set``/``wait``/``clear`` of an Event, so the
executor's ``wake`` is one or the other. A ring that finds the socket's queue full or
its owner gone is dropped: a rung bell stays rung until cleared, and a gone owner
needs no waking.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import uuid


class Doorbell:
    """A bell to wait on (``wait``), rung from this process (``set``) or by another
    process on this host (:func:`ring` to :attr:`address`)."""

    def __init__(self):
        self.address = f"\0taskgraph-bell-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        self._sock.setblocking(False)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._fd = self._sock.fileno()

    def set(self) -> None:
        """Ring this bell (from any thread of this process)."""
        self.ring(self.address)

    def ring(self, address: str) -> None:
        """Ring the bell at ``address`` (this host's); never blocks, never raises."""
        try:
            self._out.sendto(b"\1", address)
        except OSError:  # full (rung already), or its owner is gone
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the bell is rung or ``timeout`` seconds pass (None: no limit);
        whether it was rung. It stays rung until :meth:`clear`."""
        try:
            ready, _, _ = select.select([self._fd], [], [], timeout)
        except (OSError, ValueError):  # closed under the waiter
            return True
        return bool(ready)

    def is_set(self) -> bool:
        """Whether the bell has been rung since the last :meth:`clear`."""
        return self.wait(0)

    def clear(self) -> None:
        """Forget the rings so far."""
        try:
            while True:
                self._sock.recv(64)
        except OSError:  # nothing left (or closed)
            pass

    def close(self) -> None:
        """Close the sockets: rings to this bell are dropped from now on."""
        self._sock.close()
        self._out.close()


def make() -> Doorbell | threading.Event:
    """A doorbell where the platform has abstract sockets (Linux), else an Event."""
    if sys.platform.startswith("linux"):
        try:
            return Doorbell()
        except OSError:  # (a sandbox without AF_UNIX)
            pass
    return threading.Event()


def addresses(bell: Doorbell | threading.Event, host: str, peers: list[tuple]) -> list:
    """Each rank's bell address where it shares ``host`` and has a bell, else None;
    ``peers``: every rank's (host, address or None), in rank order."""
    if not isinstance(bell, Doorbell):
        return [None] * len(peers)
    return [addr if h == host and addr else None for h, addr in peers]
