"""Files written whole or not at all, and what MPI leaves when killed: the shared-memory
segments of its ranks, the topology files of its launcher."""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import re
import tempfile
import uuid
from pathlib import Path


def write_atomic(path, text: str) -> str:
    """Write ``text`` to ``path`` whole or not at all: to a temporary name in the same
    directory, then renamed over ``path`` (``os.replace``), so that a reader, or
    another process writing the same path, never sees half a file. On failure (a
    read-only or full directory) the old file is left as it was, the temporary one
    removed, and an OSError raised that names ``path``. Returns ``path`` as a string."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        # (os.open with 0o666, not mkstemp's 0o600: the file gets the umask's mode)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
    return str(path)


SHM_DIR = "/dev/shm"
# MPI's shared-memory segments there: MPICH's, and Open MPI 4's and 5's
SHM_PATTERNS = ("mpich_shm_*", "vader_segment.*", "sm_segment.*")


def is_segment(path: str) -> bool:
    """Whether ``path`` names an MPI shared-memory segment."""
    where, name = os.path.split(path)
    return where == SHM_DIR and any(fnmatch.fnmatchcase(name, p) for p in SHM_PATTERNS)


def shm_files(pids: list[int]) -> set[str]:
    """The MPI shared-memory files that these processes have mapped."""
    files: set[str] = set()
    for pid in pids:
        try:  # (bytes: a mapped file's name need not be UTF-8)
            lines = Path(f"/proc/{pid}/maps").read_bytes().decode(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(SHM_DIR):
                path = parts[5].removesuffix(" (deleted)")
                if is_segment(path):
                    files.add(path)
    return files


# MPICH's mpiexec (hydra) proxies write the machine's topology here for their ranks and
# remove it as they exit: a proxy killed (a job's cleanup, a stopped cluster) cannot
TOPOLOGY_PATTERN = "hydra_hwloc_xmlfile_*"


def is_topology(path: str) -> bool:
    """Whether ``path`` names an MPI launcher's topology file (temporary directory)."""
    where, name = os.path.split(path)
    return where == tempfile.gettempdir() and fnmatch.fnmatchcase(name, TOPOLOGY_PATTERN)


def held_topology(pids: list[int]) -> set[str]:
    """The MPI launchers' topology files that these processes hold open."""
    files: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                path = os.readlink(f"/proc/{pid}/fd/{fd}")
                if is_topology(path):
                    files.add(path)
    return files


def remove_segments(listed: str) -> None:
    """Unlink the MPI segments and launcher topology files named in the file ``listed``
    (one a line, as the ranks of a job wrote them, see :func:`note_segments`) that
    still exist, and the file."""
    try:
        names = Path(listed).read_text(errors="replace").split()
    except OSError:
        return
    for path in {p for p in names if is_segment(p) or is_topology(p)}:  # (ranks share some)
        with contextlib.suppress(OSError):  # (gone: the job ended well)
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.unlink(listed)


BOARD_PREFIX = "taskgraph-board-"  # + pid-n-random: a rank's board (taskgraph.run.board)


def dead_files(paths: list[str], alive) -> list[str]:
    """Of the board files ``paths``, those whose process is gone (``alive(pid)``
    False): a pure choice."""
    out = []
    for path in paths:
        name = os.path.basename(path)
        m = re.fullmatch(re.escape(BOARD_PREFIX) + r"(\d+)-\d+-[0-9a-f]+(\.new)?", name)
        if m and not alive(int(m.group(1))):
            out.append(path)
    return out


def remove_dead_boards() -> None:
    """Remove every board whose process has died (a rank killed hard cannot)."""
    for path in dead_files(glob.glob(os.path.join(SHM_DIR, BOARD_PREFIX + "*")), pid_alive):
        with contextlib.suppress(OSError):
            os.unlink(path)


SEGMENTS_VAR = "TASKGRAPH_SEGMENTS"  # a file where a job's ranks note their segments
SEGMENT_LISTS = "taskgraph-segments-"  # + the launcher's pid: such a file's name


def list_launcher(path: str) -> int | None:
    """The pid of the launcher whose segment list ``path`` is (None: not one)."""
    name = os.path.basename(path)
    pid = name[len(SEGMENT_LISTS) :].split("-")[0]
    return int(pid) if name.startswith(SEGMENT_LISTS) and pid.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` lives (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def note_segments() -> None:
    """Append the MPI segments this process maps, and the topology file its launcher's
    proxy (its parent) holds, to the file its launcher named in ``TASKGRAPH_SEGMENTS``
    (nothing without it): the launcher removes those a job that failed left behind
    (see taskgraph.cluster.launch)."""
    listed = os.environ.get(SEGMENTS_VAR)
    if not listed:
        return
    mine = shm_files([os.getpid()]) | held_topology([os.getppid()])
    if not mine:
        return
    with contextlib.suppress(OSError):  # (no O_CREAT: on another host it is not there)
        fd = os.open(listed, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, "".join(f"{p}\n" for p in sorted(mine)).encode())
        finally:
            os.close(fd)


def unlink_own_shm() -> None:
    """Remove the names of the MPICH shared-memory files this process maps. A job that
    ends without ``MPI_Finalize`` (an abort) leaves them in ``/dev/shm`` otherwise; the
    ranks still running keep their mappings, only the name goes."""
    for path in shm_files([os.getpid()]):
        try:
            os.unlink(path)
        except OSError:
            pass


GUARD_STEP = 0.05  # seconds between looks at the job's mpiexec, once its launcher died
GUARD_WAIT = 10.0  # seconds the guard waits for it to end before it removes anyway


def guard_job(listed: str, lines=None) -> bool:
    """A launcher's guard (a process of its own, see taskgraph.cluster.launch): read the
    launcher's lines (``pid N``: its job's mpiexec; ``close``: it cleaned up itself)
    until the pipe closes. If it closed without ``close`` (the launcher was killed),
    wait for the job's mpiexec to end, then remove what the job's ranks listed in
    ``listed`` (and it) and the boards of dead processes. True if it removed."""
    import sys
    import time

    job = None
    for line in lines if lines is not None else sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "close":
            return False
        if word == "pid" and arg.isdigit():
            job = int(arg)
    deadline = time.monotonic() + GUARD_WAIT
    while job is not None and pid_alive(job) and time.monotonic() < deadline:
        time.sleep(GUARD_STEP)
    for _ in range(2):  # (again a moment later: a rank that outlived its mpiexec)
        remove_segments(listed)
        remove_dead_boards()
        time.sleep(0.2)
    return True
