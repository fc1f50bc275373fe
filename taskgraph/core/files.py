"""Files written whole or not at all, and MPICH's shared-memory files of processes."""

from __future__ import annotations

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


def unlink_own_shm() -> None:
    """Remove the names of the MPICH shared-memory files this process maps. A job that
    ends without ``MPI_Finalize`` (an abort) leaves them in ``/dev/shm`` otherwise; the
    ranks still running keep their mappings, only the name goes."""
    for path in shm_files([os.getpid()]):
        try:
            os.unlink(path)
        except OSError:
            pass
