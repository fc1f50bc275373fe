"""Starting ranks: build the ``mpiexec`` command line and run it with a hard bound.

The command is a pure function of the launcher and the rank count, so it is tested
without starting anything. :func:`run_ranks` starts the job in a process group of
its own and, on a timeout or an interrupt, kills the whole group: no rank outlives
the call. Once ``mpiexec`` itself has exited, whatever it started gets a few seconds
to let go of the job's output, then the group is killed: a straggler that holds a
pipe must not hang the caller. A rank killed hard (a crash, SIGKILL, the OOM killer)
cannot remove MPI's shared-memory segment in ``/dev/shm`` (nor its proxy the launcher's
topology file): each rank notes its own in a file the launcher names
(``TASKGRAPH_SEGMENTS``), and after a job that failed the launcher removes those left,
and the boards of dead ranks. A launcher killed outright cannot: its guard, a small
process that sees the launcher's pipe close, does it once the job has ended (and the
next launcher sweeps the lists of dead launchers, should the guard be killed too).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from ..core import config, files
from ..core.files import (
    SEGMENT_LISTS,
    SEGMENTS_VAR,
    list_launcher,
    pid_alive,
    remove_dead_boards,
    remove_segments,
)


@functools.lru_cache(maxsize=8)
def launcher_flavour(mpiexec: str) -> str:
    """``"openmpi"``, ``"mpich"`` or ``"other"``, from ``mpiexec --version``."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    text = out.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "other"


def mpiexec_command(
    mpiexec: str, flavour: str, n: int, argv: Sequence[str], as_root: bool = False
) -> list[str]:
    """The command that starts ``argv`` on ``n`` local ranks."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    cmd = [mpiexec, "-n", str(n)]
    if flavour == "openmpi":
        cmd.append("--oversubscribe")  # tests may start more ranks than cores
        if as_root:
            cmd.append("--allow-run-as-root")
    return cmd + list(argv)


def local_env(flavour: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Settings that keep a one-node MPICH job's ranks off the network: UCX (the
    ``mpich`` wheel's netmod) on shared memory only, so no rank listens on a TCP port
    (by default each listens on the machine's address, unauthenticated). Left alone
    where the user set UCX's transports or devices, and for other MPIs. (Hydra's own
    control port still listens on every interface: it binds no other way.)"""
    if flavour != "mpich" or "UCX_TLS" in environ or "UCX_NET_DEVICES" in environ:
        return {}
    return {"UCX_TLS": "self,sm"}


def python_command(n: int, argv: Sequence[str]) -> list[str]:
    """``mpiexec -n N <this python> argv...`` for the configured launcher."""
    exe = config.mpiexec()
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    return mpiexec_command(exe, launcher_flavour(exe), n, [sys.executable, *argv], as_root)


def job_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with :func:`local_env`'s settings added."""
    base = dict(os.environ if env is None else env)
    return {**base, **local_env(launcher_flavour(config.mpiexec()), base)}


def script_argv(script: str, args: Sequence[str] = ()) -> list[str]:
    """Python's arguments that run ``script args`` on a rank under mpi4py's runner:
    a rank whose script ends with ``sys.exit(n)``, n non-zero, or a Ctrl-C, ends the
    whole job (``MPI_Abort(n)``). A plain ``python script.py`` goes into MPI_Finalize
    instead, and the job hangs while the other ranks wait for that one in their next
    collective. (Uncaught exceptions end the job either way: see
    :func:`taskgraph.run.comm.install_abort_hook`.)"""
    return ["-m", "mpi4py", script, *args]


def run_ranks(
    n: int,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    capture: bool = False,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python argv`` on n ranks; kill every process of the job on timeout."""
    cmd = python_command(n, argv)
    sweep_segment_lists()
    fd, segments = tempfile.mkstemp(prefix=f"{SEGMENT_LISTS}{os.getpid()}-")
    os.close(fd)
    guard = _start_guard(segments)
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL if capture else None,  # (nothing to forward to rank 0)
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=True,
            start_new_session=True,
            env=job_environment(env) | {SEGMENTS_VAR: segments},
            preexec_fn=_die_with_parent,  # (this process killed: the launcher ends its job)
        )
        _tell(guard, f"pid {proc.pid}")
        try:
            with _terminated_as_interrupt():
                out, err = collect(proc, timeout)
        except BaseException:  # a timeout, Ctrl-C, SIGTERM: take the whole job down
            kill_group(proc)
            raise
    finally:
        remove_segments(segments)  # (of a job that ended well: none left)
        remove_dead_boards()  # (a rank killed hard leaves its boards)
        _release(guard)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# the guard: stdlib only, with core/files.py loaded by path (not the package: ~0.1 s)
GUARD = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_taskgraph_files', sys.argv[1])\n"
    "files = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(files)\n"
    "files.guard_job(sys.argv[2])\n"
)


def _start_guard(listed: str) -> subprocess.Popen | None:
    """A process that outlives this launcher if it is killed (SIGKILL included): then,
    once the job has ended, it removes what the ranks listed and their boards
    (:func:`taskgraph.core.files.guard_job`). None if it cannot start."""
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-c", GUARD, files.__file__, listed],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # (the terminal's Ctrl-C is the launcher's to handle)
            text=True,
        )
    except OSError:
        return None


def _tell(guard: subprocess.Popen | None, line: str) -> None:
    if guard is None:
        return
    try:
        guard.stdin.write(line + "\n")  # type: ignore[union-attr]
        guard.stdin.flush()  # type: ignore[union-attr]
    except (OSError, ValueError):
        pass


def _release(guard: subprocess.Popen | None) -> None:
    """The launcher cleaned up: its guard ends, touching nothing."""
    if guard is None:
        return
    _tell(guard, "close")
    try:
        guard.stdin.close()  # type: ignore[union-attr]
        guard.wait(5)
    except (OSError, subprocess.TimeoutExpired):
        guard.kill()


def sweep_segment_lists() -> None:
    """The lists of MPI segments that launchers killed before they could act on them
    left in the temporary directory (their pid is gone): their segments left in
    /dev/shm removed, then the lists."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{SEGMENT_LISTS}*-*")):
        pid = list_launcher(path)
        if pid is not None and not pid_alive(pid):
            remove_segments(path)


def _die_with_parent() -> None:
    """In the launcher's child, before exec: SIGTERM it when this process dies, even
    by SIGKILL (Linux's PR_SET_PDEATHSIG; elsewhere nothing). The job runs in a session
    of its own, so no signal sent to this process would reach it otherwise."""
    if sys.platform.startswith("linux"):
        import ctypes  # (only here, in the child)

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the launcher (``timeout``, a batch system, a closed
    terminal): its job goes down with it."""


@contextlib.contextmanager
def _terminated_as_interrupt():
    """Within: SIGTERM and SIGHUP raise :class:`Terminated` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


LINGER = 5.0  # seconds a job's leftovers may hold its output after its launcher exits


def collect(proc: subprocess.Popen, timeout: float | None, linger: float = LINGER):
    """``proc.communicate()`` within ``timeout`` (TimeoutExpired past it), except that
    once ``proc`` has exited, what it started gets ``linger`` seconds to close the
    output pipes; then its process group is killed and the output read so far is
    returned. (Seen: mpiexec exiting after a rank died while a proxy of its held the
    pipe, and a caller waiting for end-of-file until its own timeout.)"""
    start = time.monotonic()
    exited: float | None = None
    while True:
        step = 0.25 if timeout is None else max(0.01, min(0.25, start + timeout - time.monotonic()))
        try:
            return proc.communicate(timeout=step)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                raise
            if proc.poll() is None:
                continue
            exited = exited or now
            if now - exited >= linger:
                break
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return proc.communicate(timeout=linger)
    except subprocess.TimeoutExpired as last:  # held by something outside the group
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return _text(last.output), _text(last.stderr)


def _text(data) -> str | None:
    if data is None or isinstance(data, str):
        return data
    return data.decode(errors="replace")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL whatever is left of it."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=grace)
        except (subprocess.TimeoutExpired, ValueError):
            pass
