"""Executable tasks: command lines and programs as tasks of a graph.

:func:`shell` runs a command line with ``/bin/sh -c``; :func:`exe` runs a program
from its argument list, without a shell. Both are ``@tg.task`` functions: inside
``with tg.Graph():`` a call records a task, and other tasks' values (paths, numbers,
strings, :class:`ExeResult` s) given as fields or arguments are its inputs::

    with tg.Graph() as g:
        made = tg.shell("simulate --seed {seed}", seed=3, stdout=tmp / "out 3.txt")
        lines = tg.shell("wc -l < {f}", f=made)  # made's value stands for its stdout file

A call returns an :class:`ExeResult` (the return code, stdout and stderr or the files
they went to, the time taken, and the stamps launched -> started -> ended); a
non-zero exit, a timeout or a program that cannot start raises
:class:`~taskgraph.core.errors.ExecutableError` naming the command, the code and the
tail of stderr (unless ``check=False``).

The life of one call::

    launched ── Popen (vfork; new session) ──► started ── wait in short steps ──► ended
                                                   │ timeout, or the thread interrupted
                                                   ▼
                                 SIGTERM the process group, SIGKILL after a grace

Each command runs in a process group (a session) of its own, so a timeout, a
cancelled run (the executor raises an exception in the worker thread: the wait
polls, so it lands within a step) or the command's end takes everything it started
with it: nothing it left in the background outlives the call.

``ranks=k`` runs the command as an MPI program on k ranks: ``srun -n k`` inside a
SLURM allocation, else ``mpiexec -n k`` (``TASKGRAPH_MPIEXEC``, else the one beside
this Python, else the first on ``PATH``). Started from inside an MPI rank (a batch
job's rank, an ipyparallel engine), a child must not see its parent's process-manager
variables: under MPICH a child's ``MPI_Init`` then fails (``PMI_Init returned -1``),
and Open MPI's ``mpiexec`` refuses to start ("does not support recursive calls").
They are dropped from every child's environment (:func:`child_env`).
:func:`resources_of_call` tells the scheduler the cores such a call needs.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import shlex
import shutil
import signal
import string
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import config
from ..core.errors import ExecutableError
from .graph import TaskFunction

__all__ = ["ExeResult", "child_env", "exe", "launcher", "resources_of_call", "shell"]

STEP = 0.05  # seconds between looks at the clock and for an interrupt while waiting
GRACE = 1.0  # seconds a process group has between SIGTERM and SIGKILL
LINGER = 1.0  # seconds what a finished command left running may hold its output pipes
TAIL_LINES = 20  # lines of stderr an error shows
# variables that MPI process managers (MPICH's hydra, Open MPI, PMIx) put in a rank
_MANAGER_PREFIXES = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "OMPI_", "OPAL_", "PRTE_", "MPI_LOCAL")
_IN_RANK = ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "HYDI_CONTROL_FD")

Output = str | os.PathLike | None


@dataclass(frozen=True, repr=False)
class ExeResult:
    """What an executable task did.

    ``cmd``: the command line as run (a program's arguments joined, quoted);
    ``returncode``: its exit code (negative: the signal that ended it); ``stdout``,
    ``stderr``: its output as text, or None where it went to a file, ``stdout_path``,
    ``stderr_path``; ``seconds``: from launch to end; ``launched`` (just before the
    process was created), ``started`` (once it was), ``ended``: stamps on
    :func:`time.perf_counter`'s clock.

    ``str(result)`` is its stdout without the surrounding white space (or the path
    of its stdout file), so that a result given to another command as a field or an
    argument is what it printed: ``tg.shell("ls {d}", d=tg.shell("mktemp -d"))``.
    """

    cmd: str
    returncode: int
    stdout: str | None
    stderr: str | None
    stdout_path: Path | None
    stderr_path: Path | None
    seconds: float
    launched: float
    started: float
    ended: float

    @property
    def ok(self) -> bool:
        """Whether the command exited with code 0."""
        return self.returncode == 0

    def __str__(self) -> str:
        if self.stdout is not None:
            return self.stdout.strip()
        return str(self.stdout_path) if self.stdout_path is not None else ""

    def __repr__(self) -> str:
        out = self.stdout if self.stdout is not None else self.stdout_path
        return (
            f"ExeResult(cmd={_short(self.cmd, 60)!r}, returncode={self.returncode}, "
            f"seconds={self.seconds:.3g}, stdout={_short(str(out), 60)!r})"
        )


def _shell(
    cmd: str,
    /,
    *,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    stdout: Output = None,
    stderr: Output = None,
    check: bool = True,
    ranks: int | None = None,
    quote: bool = True,
    **fields: Any,
) -> ExeResult:
    """Run the command line ``cmd`` with ``/bin/sh -c``; its :class:`ExeResult`.

    A ``@tg.task``: in a graph, a call records a task whose inputs are the futures
    among its fields.

    Parameters
    ----------
    cmd:
        The command line, with ``{name}`` fields filled from ``fields`` as
        :meth:`str.format` does (``{r.stdout}``, ``{x:.3f}`` work; a literal brace is
        ``{{`` or ``}}``).
    fields:
        The fields' values: strings, numbers, paths, other tasks' values. Each is
        shell-quoted (:func:`shlex.quote`) once formatted, so a path with spaces is
        one word: do not put quotes around a field yourself. An :class:`ExeResult`
        stands for its stdout, stripped (or its stdout file's path). A field the
        command does not use is still an input: ``after=other`` orders the call.
    cwd:
        The directory to run in (None: this process's).
    env:
        Variables to set, over this process's environment (None as a value removes
        one). MPI process-manager variables are never passed on (see the module).
    timeout:
        Seconds the command may run; past them its whole process group is killed and
        ExecutableError says it timed out.
    stdout, stderr:
        None: captured as text in the result; a path (relative to ``cwd``): written
        to that file, whose path the result holds.
    check:
        Raise ExecutableError when the command exits non-zero (False: return the
        result, with its ``returncode``).
    ranks:
        Run the command on this many MPI ranks: ``srun -n k`` or ``mpiexec -n k`` is
        put in front of the command line (see :func:`launcher`), so its first word is
        the program the ranks run and a redirection applies to the launcher's output.
    quote:
        False: fields go in as they are, unquoted (options, globs, pipes).
    """
    line = _format(cmd, fields, quote)
    if ranks is not None:
        line = f"{shlex.join(launcher(ranks))} {line}"
    return run_command(["/bin/sh", "-c", line], line, cwd, env, timeout, stdout, stderr, check)


def _exe(
    argv: Sequence[Any] | str | os.PathLike,
    /,
    *,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    stdout: Output = None,
    stderr: Output = None,
    check: bool = True,
    ranks: int | None = None,
) -> ExeResult:
    """Run the program ``argv[0]`` with the arguments ``argv[1:]``, without a shell;
    its :class:`ExeResult`.

    A ``@tg.task``: in a graph, a call records a task whose inputs are the futures in
    ``argv``.

    Parameters
    ----------
    argv:
        The program and its arguments: strings, numbers, paths, other tasks' values
        (an :class:`ExeResult` stands for its stdout, stripped). A single string or
        path is a program without arguments (a command line is :func:`shell`'s).
    cwd, env, timeout, stdout, stderr, check:
        As for :func:`shell`.
    ranks:
        Run the program on this many MPI ranks (``srun -n k`` or ``mpiexec -n k``,
        see :func:`launcher`).
    """
    if isinstance(argv, str | os.PathLike):
        argv = [argv]
    words = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv]
    if not words:
        raise ValueError("exe: argv is empty: give at least the program")
    if ranks is not None:
        words = launcher(ranks) + words
    return run_command(words, shlex.join(words), cwd, env, timeout, stdout, stderr, check)


# Named apart from the public names so that pickle finds the function itself (the
# module's ``shell`` is the task), and shown as "shell"/"exe" in labels and traces.
_shell.__name__ = "shell"
_exe.__name__ = "exe"
# task options a call may give with its arguments (timeout and ranks are the command's own)
CALL_OPTIONS = ("retries", "on_failure", "cores", "memory", "gpus", "process")


class ExeTask(TaskFunction):
    """A ``@tg.task`` that runs a program: a call may also give the task options of
    :func:`taskgraph.task` (``retries=``, ``on_failure=``, ``cores=``, ``memory=``,
    ``gpus=``, ``process=``) with its arguments: ``tg.shell(cmd, retries=2, x=1)``."""

    def __call__(self, *args, **kwargs):
        options = {k: kwargs.pop(k) for k in CALL_OPTIONS if k in kwargs}
        target = self.with_options(**options) if options else self
        return TaskFunction.__call__(target, *args, **kwargs)


shell = ExeTask(_shell)
exe = ExeTask(_exe)


def resources_of_call(kwargs: Mapping[str, Any]) -> dict[str, int]:
    """The resources a call of :func:`shell` or :func:`exe` with ``kwargs`` asks
    for beyond a task's default: ``{"cores": k}`` for ``ranks=k`` (its k MPI ranks
    each take a core), else nothing."""
    ranks = kwargs.get("ranks")
    if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1:
        return {"cores": ranks}
    return {}


def launcher(ranks: int) -> list[str]:
    """The command that starts a program on ``ranks`` MPI ranks: ``srun -n k`` inside
    a SLURM allocation (``SLURM_JOB_ID`` set, ``srun`` on ``PATH``), else
    ``mpiexec -n k`` (``TASKGRAPH_MPIEXEC``, else the one beside this Python, else
    the first on ``PATH``)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, not {ranks!r}")
    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        return ["srun", "-n", str(ranks)]
    return [config.mpiexec(), "-n", str(ranks)]


def child_env(env: Mapping[str, Any] | None = None) -> dict[str, str] | None:
    """The environment of a command: this process's, less the MPI process manager's
    variables when this process is an MPI rank, with ``env`` set over it (a None
    value removes a variable). None (inherit as is) when there is nothing to change."""
    base = os.environ
    in_rank = any(k in base for k in _IN_RANK)
    if not in_rank and not env:
        return None
    out = {k: v for k, v in base.items() if not (in_rank and k.startswith(_MANAGER_PREFIXES))}
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = os.fspath(v) if isinstance(v, os.PathLike) else str(v)
    return out


class _Quoting(string.Formatter):
    """str.format that shell-quotes every field it fills in."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return shlex.quote(super().format_field(value, format_spec))


_QUOTING = _Quoting()


def _format(cmd: str, fields: Mapping[str, Any], quote: bool) -> str:
    """``cmd`` with its fields filled (quoted unless ``quote`` is False); ValueError
    naming the field for one not given."""
    try:
        return _QUOTING.vformat(cmd, (), fields) if quote else cmd.format_map(fields)
    except (KeyError, IndexError) as exc:
        given = ", ".join(sorted(fields)) or "none"
        raise ValueError(
            f"shell command {_short(cmd)!r}: no value for field {exc.args[0]!r} "
            f"(fields given: {given}; a literal brace is written {{{{ or }}}})"
        ) from None


def run_command(
    argv: list[str],
    cmd: str,
    cwd: str | os.PathLike | None,
    env: Mapping[str, Any] | None,
    timeout: float | None,
    stdout: Output,
    stderr: Output,
    check: bool,
) -> ExeResult:
    """Run ``argv`` (shown as ``cmd``) in a session of its own and wait for it; see
    :func:`shell` for the parameters."""
    out_path, err_path = _path(stdout, cwd), _path(stderr, cwd)
    with contextlib.ExitStack() as files:
        out_file = files.enter_context(open(out_path, "wb")) if out_path else subprocess.PIPE
        err_file = files.enter_context(open(err_path, "wb")) if err_path else subprocess.PIPE
        launched = time.perf_counter()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=child_env(env),
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=err_file,
                start_new_session=True,  # its own process group: killed as one
            )
        except OSError as exc:
            raise ExecutableError(f"command {_short(cmd)} could not start: {exc}") from exc
    started = time.perf_counter()
    out, err, timed_out = _wait(proc, timeout)
    ended = time.perf_counter()
    seconds = ended - launched
    rc = proc.returncode
    result = ExeResult(cmd, rc, out, err, out_path, err_path, seconds, launched, started, ended)
    if timed_out:
        raise ExecutableError(_failure(result, timeout), result)
    if check and result.returncode != 0:
        raise ExecutableError(_failure(result), result)
    return result


def _path(target: Output, cwd: str | os.PathLike | None) -> Path | None:
    if target is None:
        return None
    path = Path(target)
    return path if cwd is None or path.is_absolute() else Path(cwd) / path


def _wait(proc: subprocess.Popen, timeout: float | None) -> tuple[str | None, str | None, bool]:
    """(stdout, stderr, timed out) of ``proc`` once it has ended, its process group
    killed on a timeout or on any exception raised in this thread meanwhile. Its exit
    is seen on a pidfd, so a short command costs no sleep; where there is no pidfd
    (not Linux), :meth:`~subprocess.Popen.communicate` waits in short steps."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return _wait_portable(proc, deadline)
    watch = _Watch(proc, pidfd)
    try:
        timed_out = watch.until_done(deadline)
        if timed_out:
            watch.stop()
        else:
            _signal_group(proc, signal.SIGKILL)  # what it left running in the background
            watch.pump(GRACE)  # and the output that held back
    except BaseException:  # interrupted (a cancelled run), Ctrl-C: take it all down
        watch.stop()
        raise
    finally:
        watch.close()
    out_fd, err_fd = watch.fds
    return watch.text(out_fd), watch.text(err_fd), timed_out


class _Watch:
    """A started command's output pipes and its exit (a pidfd), watched by one poll."""

    def __init__(self, proc: subprocess.Popen, pidfd: int):
        self.proc = proc
        self.pidfd = pidfd
        self.poller = select.poll()
        self.chunks: dict[int, list[bytes]] = {}
        self.fds = [None if p is None else p.fileno() for p in (proc.stdout, proc.stderr)]
        for fd in self.fds:
            if fd is not None:
                self.chunks[fd] = []
                self.poller.register(fd, select.POLLIN)
        self.poller.register(pidfd, select.POLLIN)
        self.open = set(self.chunks)  # pipes not at their end yet
        self.exited = False

    def step(self, seconds: float) -> None:
        """Read what arrives within ``seconds``, and see whether the command ended."""
        for fd, _ in self.poller.poll(math.ceil(max(0.0, seconds) * 1000)):
            if fd == self.pidfd:
                self.exited = True
                self.poller.unregister(fd)
                continue
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if data:
                self.chunks[fd].append(data)
            else:
                self.poller.unregister(fd)
                self.open.discard(fd)

    def until_done(self, deadline: float | None) -> bool:
        """Watch until the command has ended and its output is read (True: it ran
        past ``deadline`` first). Output pipes still held :data:`LINGER` seconds after
        it ended (by what it left in the background) are left unread."""
        exited_at = None
        while self.open or not self.exited:
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return True
            if self.exited:
                exited_at = exited_at or now
                if now - exited_at >= LINGER:
                    return False
            self.step(STEP if deadline is None else min(STEP, deadline - now))
        return False

    def stop(self) -> None:
        """SIGTERM the command's process group, SIGKILL it after :data:`GRACE` (or once
        the command has ended), and read what output came meanwhile."""
        _signal_group(self.proc, signal.SIGTERM)
        self.pump(GRACE)
        _signal_group(self.proc, signal.SIGKILL)
        self.pump(GRACE)

    def pump(self, seconds: float) -> None:
        """Watch for at most ``seconds`` until the command has ended and its output is read."""
        end = time.perf_counter() + seconds
        while (self.open or not self.exited) and (left := end - time.perf_counter()) > 0:
            self.step(min(STEP, left))

    def close(self) -> None:
        """Reap the command and close its pipes and the pidfd."""
        os.close(self.pidfd)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.proc.wait()

    def text(self, fd: int | None) -> str | None:
        """What came on the pipe ``fd`` (None: none was read)."""
        if fd is None:
            return None
        return b"".join(self.chunks[fd]).decode("utf-8", "replace")


def _wait_portable(
    proc: subprocess.Popen, deadline: float | None
) -> tuple[str | None, str | None, bool]:
    """:func:`_wait` without a pidfd."""
    exited: float | None = None
    try:
        while True:
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return (*_kill_group(proc), True)
            step = STEP if deadline is None else min(STEP, deadline - now)
            try:
                out, err = proc.communicate(timeout=step)
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:  # ended; its background holds the output
                    exited = exited or now
                    if now - exited >= LINGER:
                        return (*_kill_group(proc), False)
    except BaseException:
        _kill_group(proc)
        raise
    _signal_group(proc, signal.SIGKILL)
    return _text(out), _text(err), False


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_group(proc: subprocess.Popen) -> tuple[str | None, str | None]:
    """SIGTERM ``proc``'s process group, SIGKILL it after :data:`GRACE`; the output
    read until then."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(GRACE)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)
    try:
        out, err = proc.communicate(timeout=GRACE)
    except subprocess.TimeoutExpired as exc:  # a pipe held outside the group
        out, err = exc.output, exc.stderr
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
    return _text(out), _text(err)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


def _short(text: str, limit: int = 200) -> str:
    """``text``, cut in the middle to at most about ``limit`` characters."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]} ... {text[head + 5 - limit :]}"


def _failure(result: ExeResult, timeout: float | None = None) -> str:
    """The message of a failed command: what happened and the tail of its stderr."""
    what = f"command {_short(result.cmd)}"
    if timeout is not None:
        head = f"{what} timed out after {timeout:g} s (its process group was killed)"
    elif result.returncode < 0:
        head = f"{what} was killed by {_signal_name(-result.returncode)}"
    else:
        head = f"{what} exited with code {result.returncode}"
    tail = _tail(result)
    return f"{head}; the end of its stderr:\n{tail}" if tail else f"{head}; its stderr is empty"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(result: ExeResult) -> str:
    """The last :data:`TAIL_LINES` lines of the result's stderr (its file's, if it went
    to one)."""
    text = result.stderr
    if text is None and result.stderr_path is not None:
        text = _file_end(result.stderr_path)
    lines = (text or "").rstrip().splitlines()
    return "\n".join(lines[-TAIL_LINES:])


def _file_end(path: Path, size: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
