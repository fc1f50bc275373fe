"""Durable values of finished calls, so that a run made again skips what is done.

``cluster.run(g, checkpoint="dir")``: each managed call (see
:mod:`taskgraph.run.attempts`) that ends well has its value written to ``dir`` as it
completes: pickled (protocol 5; cloudpickle where plain pickle cannot), to a
temporary file that is fsync'ed, renamed into place and its directory fsync'ed, so a
killed job leaves whole files or none. A later run with the same directory loads
the value of a call whose key is there instead of running it::

    dir/ab/ab12...ef.pkl      key = sha256(function, arguments, input values)

The key is the function's module and qualified name (and, for a call with futures in
containers, the containers' shape), then every argument in a canonical form: numbers,
strings, bytes and None by type and repr; lists, tuples, dicts (keys sorted), sets
(items sorted) item by item; NumPy arrays by dtype, shape and a hash of their bytes;
anything else by its pickle bytes (stable for most values; a value whose pickle
differs from process to process only misses the checkpoint). A call with an argument
that cannot be pickled, or a value that cannot be, is not checkpointed (it runs each
time); the first such value is said once on stderr.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import RunError

_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None)})


class Unkeyable(Exception):
    """An argument without a stable form (it cannot be pickled)."""


def _canon(x: Any, h: Any) -> None:
    """Feed the canonical form of ``x`` to the hash ``h``."""
    c = x.__class__
    if c in _SCALARS:
        h.update(f"{c.__name__}:{x!r};".encode())
    elif c is list or c is tuple:
        h.update(f"{c.__name__}{len(x)}[".encode())
        for item in x:
            _canon(item, h)
        h.update(b"]")
    elif c is dict:
        items = sorted((_digest(k), v) for k, v in x.items())
        h.update(f"dict{len(items)}{{".encode())
        for k, v in items:
            h.update(k.encode())
            _canon(v, h)
        h.update(b"}")
    elif c is set or c is frozenset:
        h.update(f"{c.__name__}{{{','.join(sorted(_digest(i) for i in x))}}}".encode())
    elif isinstance(x, np.ndarray):
        h.update(f"ndarray{x.dtype.str}{x.shape}:".encode())
        h.update(hashlib.sha256(np.ascontiguousarray(x).tobytes()).digest())
    else:
        try:
            data = pickle.dumps(x, protocol=5)
        except Exception as exc:  # (not keyed: the call runs every time)
            raise Unkeyable(f"{type(x).__name__}: {exc}") from exc
        h.update(f"pickle:{c.__module__}.{c.__qualname__}:".encode())
        h.update(hashlib.sha256(data).digest())


def _digest(x: Any) -> str:
    h = hashlib.sha256()
    _canon(x, h)
    return h.hexdigest()


def function_name(fn: Any) -> str:
    """The stable name of a call's function: ``module:qualname`` of the plain function
    (through a ``@tg.task`` function, or a packed call of one, and its shape)."""
    shape = ""
    if hasattr(fn, "task_fn"):  # (a call with futures in containers: nested.PackedCall)
        shape = "|" + fn.shape()
        fn = fn.task_fn
    inner = getattr(fn, "fn", fn)
    module = getattr(inner, "__module__", "") or ""
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", repr(inner))
    return f"{module}:{name}{shape}"


def call_key(fn: Any, args: tuple | list, kwargs: dict) -> str | None:
    """The key of the call ``fn(*args, **kwargs)``; None if an argument has no stable
    form."""
    h = hashlib.sha256(function_name(fn).encode() + b"\0")
    try:
        _canon(list(args), h)
        _canon(dict(kwargs), h)
    except Unkeyable:
        return None
    except RecursionError:
        return None
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """``data`` to ``path`` whole or not at all, and on disk when this returns."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def outputs_exist(value: Any) -> bool:
    """Whether the output files a stored value names are still there: an executable's
    result (``stdout_path``, ``stderr_path``), alone or in a list, tuple or dict value.
    A value whose files are gone is no checkpoint: its call runs again."""
    items = list(value.values()) if isinstance(value, dict) else [value]
    if isinstance(value, list | tuple):
        items = list(value)
    for v in items:
        for name in ("stdout_path", "stderr_path"):
            path = getattr(v, name, None)
            if isinstance(path, str | os.PathLike) and not os.path.exists(path):
                return False
    return True


class Checkpoint:
    """A run's checkpoint directory (made if missing). ``key``, ``load`` and ``store``
    may be called from any thread."""

    def __init__(self, directory: str | os.PathLike):
        self.root = Path(directory)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # (a bare FileNotFoundError named no option)
            raise RunError(
                f"cluster.run(checkpoint={str(directory)!r}): the directory cannot be made "
                f"({exc.strerror or exc})"
            ) from None
        self._warned = False

    def key(self, fn: Any, args: tuple | list, kwargs: dict) -> str | None:
        """The key of a call (see :func:`call_key`)."""
        return call_key(fn, args, kwargs)

    def path(self, key: str) -> Path:
        """Where the value of ``key`` is kept."""
        return self.root / key[:2] / f"{key}.pkl"

    def load(self, key: str) -> tuple[bool, Any]:
        """(True, value) if ``key`` was stored, else (False, None); a file that cannot
        be read back counts as absent (the call runs again and rewrites it)."""
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return False, None
        try:
            value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - a value that no longer loads: run it again
            return False, None
        return (True, value) if outputs_exist(value) else (False, None)

    def store(self, key: str, value: Any, label: str = "") -> bool:
        """Write ``value`` under ``key`` durably; False (said once) if it cannot be
        pickled."""
        try:
            data = pickle.dumps(value, protocol=5)
        except Exception:  # noqa: BLE001 - cloudpickle for functions and lambdas
            try:
                import cloudpickle

                data = cloudpickle.dumps(value, protocol=5)
            except Exception as exc:  # noqa: BLE001 - not checkpointed, said once
                self._warn(f"the value of {label} cannot be pickled ({exc}): not checkpointed")
                return False
        path = self.path(key)
        path.parent.mkdir(exist_ok=True)
        write_durable(path, data)
        return True

    def _warn(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"taskgraph: checkpoint {self.root}: {text}", file=sys.stderr, flush=True)
