"""Files written whole or not at all."""

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
