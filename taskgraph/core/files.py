"""Files written whole or not at all, and MPI's shared-memory files of processes."""

from __future__ import annotations

import contextlib
import os
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


SHM_PREFIX = "/dev/shm/mpich_shm_"


def shm_files(pids: list[int]) -> set[str]:
    """The MPICH shared-memory files that these processes have mapped."""
    files: set[str] = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(SHM_PREFIX):
                files.add(parts[5].removesuffix(" (deleted)"))
    return files


SHM_DIR = "/dev/shm"
# MPI's shared-memory segments there: MPICH's, and Open MPI 4's and 5's
SHM_PATTERNS = ("mpich_shm_*", "vader_segment.*", "sm_segment.*")


def mpi_segments() -> set[str]:
    """This user's MPI shared-memory segments in /dev/shm."""
    found = set()
    for pattern in SHM_PATTERNS:
        for path in Path(SHM_DIR).glob(pattern):
            with contextlib.suppress(OSError):
                if path.stat().st_uid == os.getuid():
                    found.add(str(path))
    return found


def unmapped(paths: set[str]) -> set[str]:
    """Those of ``paths`` that no live process (of those this user may read) maps."""
    left = set(paths)
    for entry in Path("/proc").iterdir():
        if not left:
            break
        if entry.name.isdigit():
            try:
                maps = (entry / "maps").read_text()
            except OSError:
                continue
            left = {p for p in left if p not in maps}
    return left


def remove_left_segments(before: set[str]) -> set[str]:
    """Unlink the MPI segments made since ``before`` (:func:`mpi_segments`) that no live
    process maps: a job's rank killed hard (a crash, SIGKILL, the OOM killer) cannot
    remove its own. The removed ones."""
    left = unmapped(mpi_segments() - before)
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return left


def unlink_own_shm() -> None:
    """Remove the names of the MPICH shared-memory files this process maps. A job that
    ends without ``MPI_Finalize`` (an abort) leaves them in ``/dev/shm`` otherwise; the
    ranks still running keep their mappings, only the name goes."""
    for path in shm_files([os.getpid()]):
        try:
            os.unlink(path)
        except OSError:
            pass
