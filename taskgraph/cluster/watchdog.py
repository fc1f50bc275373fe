"""The guard of a notebook's cluster: when the client goes, the cluster goes.

::

    client (notebook kernel)            watchdog (own session)         the cluster
    ────────────────────────            ──────────────────────         ───────────
    EngineCluster._start  ── spawn, stdin pipe ─►  reads lines
                          ── {"marker", "files"} ►  remembers them
    close()               ── "close" ───────────►  exits, touching nothing
    killed (TERM, HUP, KILL): the pipe closes ──►  EOF: stop(marker) ──────► controller,
                                                   mpiexec, engines, nannies, then the
                                                   connection files, MPI's /dev/shm and
                                                   the launcher's topology files

Every process of a cluster carries ``TASKGRAPH_CLUSTER=<marker>`` in its environment
(the launchers pass it), so the watchdog finds them all, even those whose parent died
first. The pipe closes whatever way the client ends, SIGKILL included, so nothing
polls. A segment under ``/dev/shm`` is removed only if one of the cluster's own
processes has it mapped: other users' and other clusters' segments are left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..core.files import held_topology, shm_files
from ..run.board import files_of as board_files

MARK = "TASKGRAPH_CLUSTER"
GRACE = 3.0  # seconds between SIGTERM and SIGKILL


def marked(marker: str) -> list[int]:
    """PIDs of this user's live processes whose environment carries the marker."""
    needle = f"{MARK}={marker}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes() + b"\0":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def remove(paths) -> None:
    """Unlink each path that exists (best effort)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def stop(marker: str, files=(), shm=(), grace: float = GRACE) -> list[int]:
    """End every process carrying ``marker`` (SIGTERM, SIGKILL after ``grace``), then
    remove ``files``, ``shm``, the shared memory those processes had mapped, the
    topology files they held and their boards (taskgraph.run.board).
    The PIDs it found."""
    pids = marked(marker)
    segments = shm_files(pids) | held_topology(pids) | set(shm)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    late = _alive(pids) + [p for p in marked(marker) if p not in pids]
    if late:
        _signal_all(late, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while _alive(late) and time.monotonic() < deadline:
            time.sleep(0.05)
    remove(list(files) + sorted(segments) + board_files(pids))
    return pids


class Guard:
    """The client's end of a watchdog process: :meth:`watch` tells it what to clean,
    :meth:`release` lets it go without cleaning (the cluster was closed)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "taskgraph.cluster.watchdog"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # neither the terminal's SIGINT nor its SIGHUP
            text=True,
        )

    def watch(self, marker: str, files: list[str]) -> None:
        self._send(json.dumps({"marker": marker, "files": files}))

    def release(self) -> None:
        self._send("close")
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass


def main() -> int:
    """Read the client's lines until the pipe closes; clean up unless told "close"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    state: dict = {}
    for line in sys.stdin:
        line = line.strip()
        if line == "close":
            return 0
        if line:
            state = json.loads(line)
    if state.get("marker"):
        stop(state["marker"], state.get("files", ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
