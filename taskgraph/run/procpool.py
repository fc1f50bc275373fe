"""A rank's process pool, for ``@tg.task(process=True)`` calls: functions that hold
the GIL run in processes of their own, so all of a rank's cores compute.

One pool per process (a rank), started on the first process call, sized to the
rank's cores, and kept for the session (starting interpreters is slow): it ends at
exit, when the cluster closes (:func:`shutdown`), or when a call running in it is
abandoned (its process cannot be stopped alone: the pool is killed and made again on
the next call)::

    worker thread ── cloudpickle (fn, args, kwargs) ──► pool process: run it, timed
                  ◄── cloudpickle (value | exception + traceback text, started, ended)

- Processes are started with "spawn" (an MPI rank with threads must never fork), and
  without the parent's ``__main__``: multiprocessing would run a batch script's
  top level again in each child (its ``tg.Cluster()``, its graph). Functions defined
  in ``__main__`` or a notebook travel by value (cloudpickle) instead.
- A child exits when its parent dies (a thread waits on the parent's pidfd), so no
  process outlives a killed rank.
- A child holds BLAS to the call's ``cores`` threads (1 unless asked), so a pool of
  N processes never runs N x cores BLAS threads.
- ``started``/``ended`` are read in the child from ``time.perf_counter`` (system-wide
  CLOCK_MONOTONIC on Linux: the parent's trace clock).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import multiprocessing.context
import multiprocessing.spawn
import os
import threading
import time
import traceback
from typing import Any

import cloudpickle

from ..core import pickling
from ..core.errors import RemoteTraceback
from . import context

NAME = "taskgraph-proc"  # the pool's processes' names (and their main is left alone)
_counter = itertools.count(1)
_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_size = 0


# -- the parent side --------------------------------------------------------------------


class ProcessCallError(RuntimeError):
    """A process call could not be made or its value could not come back (it does not
    pickle, or the pool's process died)."""


class _PoolProcess(multiprocessing.context.SpawnProcess):
    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["name"] = f"{NAME}-{next(_counter)}"
        super().__init__(*args, **kwargs)


class _Context(multiprocessing.context.SpawnContext):
    Process = _PoolProcess


_real_preparation = multiprocessing.spawn.get_preparation_data


def _preparation(name: str) -> dict:
    """multiprocessing's preparation data, less ``__main__`` for the pool's processes
    (the rest of the program's processes are left as they were)."""
    data = _real_preparation(name)
    if name.startswith(NAME):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def _install() -> None:
    if multiprocessing.spawn.get_preparation_data is not _preparation:
        multiprocessing.spawn.get_preparation_data = _preparation


def pool(size: int) -> concurrent.futures.ProcessPoolExecutor:
    """This process's pool of ``size`` processes (started lazily: processes start as
    calls come); one of another size is shut down and made again."""
    global _pool, _size
    with _lock:
        if _pool is not None and (_size != size or _broken(_pool)):
            _kill(_pool)
            _pool = None
        if _pool is None:
            _install()
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=size,
                mp_context=_Context(),
                initializer=_child_start,
                initargs=(os.getpid(),),
            )
            _size = size
        return _pool


def _broken(p: concurrent.futures.ProcessPoolExecutor) -> bool:
    return bool(getattr(p, "_broken", False))


def processes() -> list[int]:
    """The pids of the pool's processes now (none before the first call)."""
    p = _pool
    if p is None:
        return []
    return [pid for pid, proc in dict(getattr(p, "_processes", None) or {}).items()
            if proc.is_alive()]  # fmt: skip


def _kill(p: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop ``p`` now: its processes killed, its pending calls cancelled."""
    procs = list(dict(getattr(p, "_processes", None) or {}).values())
    p.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(5)


def shutdown() -> None:
    """End the pool (at exit, or when the cluster closes); a later call starts a new
    one. Its processes are killed: a call still running in one is lost."""
    global _pool
    with _lock:
        p, _pool = _pool, None
    if p is not None:
        _kill(p)


def abandon() -> None:
    """A call running in the pool was abandoned: kill the pool (its process cannot be
    stopped alone); the next call starts a new one."""
    shutdown()


def submit(
    fn: Any, args: tuple, kwargs: dict, label: str, cores: int, size: int
) -> concurrent.futures.Future:
    """Start ``fn(*args, **kwargs)`` in the pool of ``size``; its future, whose result
    is (value, started, ended) (see :func:`result`). ProcessCallError naming task
    ``label`` if the call does not pickle."""
    try:
        payload = pickling.dumps((fn, args, kwargs), protocol=5)
    except Exception as exc:  # (anything pickling raises)
        raise ProcessCallError(
            f"task {label} (process=True): its function and arguments must pickle to "
            f"run in a process: {type(exc).__name__}: {exc}"
        ) from exc
    return pool(size).submit(_child_call, payload, cores)


def result(fut: concurrent.futures.Future, label: str) -> tuple[Any, float, float]:
    """(value, started, ended) of a process call: raises what the function raised,
    with the child's traceback as its cause."""
    try:
        out = fut.result()
    except concurrent.futures.process.BrokenProcessPool as exc:
        raise ProcessCallError(
            f"task {label} (process=True): the pool's process died ({exc}); killed, out of "
            "memory, or it crashed: its stderr says why (a pool's process is not an MPI "
            "rank: a call there cannot use mpi4py)"
        ) from None
    ok, body, started, ended = cloudpickle.loads(out)
    if ok:
        return body, started, ended
    error, text = body
    raise error from RemoteTraceback(text)


def _exit_hook() -> None:
    shutdown()


# before concurrent.futures' own exit hook, which would wait for running calls
threading._register_atexit(_exit_hook)  # type: ignore[attr-defined]


# -- the child side ---------------------------------------------------------------------

_blas = 1  # BLAS threads the child holds now
_controller: Any = None


def _child_start(parent: int) -> None:
    """In each pool process: BLAS to one thread (before numpy loads), and exit when
    ``parent`` does."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    context.in_pool_process = True  # (tg.spawn here says why it cannot)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    if os.getppid() != parent:
        os._exit(1)  # (it died before the watch began)
    if fd is not None:
        import select

        select.select([fd], [], [])
        os._exit(1)
    while os.getppid() == parent:  # (no pidfd: not Linux)
        time.sleep(0.5)
    os._exit(1)


def _set_blas(cores: int) -> None:
    global _blas, _controller
    if cores == _blas:
        return
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    _controller.limit(limits=cores, user_api="blas")
    _blas = cores


def _child_call(payload: bytes, cores: int) -> bytes:
    """Run one call in a pool process; its outcome, pickled here so that a value or
    exception that does not pickle is reported as such."""
    fn, args, kwargs = cloudpickle.loads(payload)
    _set_blas(cores)
    started = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        ended = time.perf_counter()
        text = "".join(traceback.format_exception(exc))
        try:
            return cloudpickle.dumps((False, (exc, text), started, ended))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            plain = RuntimeError(f"{type(exc).__name__}: {exc}")
            return cloudpickle.dumps((False, (plain, text), started, ended))
    ended = time.perf_counter()
    try:
        return cloudpickle.dumps((True, value, started, ended))
    except Exception as exc:  # noqa: BLE001 - a value that does not pickle
        bad = ProcessCallError(
            f"its value ({type(value).__name__}) does not pickle, so it cannot leave "
            f"the process: {type(exc).__name__}: {exc}"
        )
        return cloudpickle.dumps((False, (bad, ""), started, ended))
