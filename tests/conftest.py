"""Fixtures that start real processes, bounded three ways.

Every job started here has (1) pytest-timeout's per-test limit, (2) a timeout on the
job itself, after which its whole process group is killed, and (3) a check, after
the job, that none of its processes is left; leftovers are killed and the test
fails. Ranks dump their stacks (faulthandler) before their own deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from taskgraph.cluster.launch import python_command, run_ranks
from taskgraph.core.files import SHM_DIR, SHM_PATTERNS, TOPOLOGY_PATTERN

HERE = Path(__file__).parent
ROOT = HERE.parent


def mpi_segments() -> set[str]:
    """This user's MPI shared-memory segments in /dev/shm, and MPI launchers' topology
    files in the temporary directory."""
    found = set()
    places = [(SHM_DIR, p) for p in SHM_PATTERNS] + [(tempfile.gettempdir(), TOPOLOGY_PATTERN)]
    for where, pattern in places:
        for path in Path(where).glob(pattern):
            with contextlib.suppress(OSError):
                if path.stat().st_uid == os.getuid():
                    found.add(str(path))
    return found


def unused(paths: set[str]) -> set[str]:
    """Those of ``paths`` that no live process (of those this user may read) maps or
    holds open: a segment that MPI is making is open before it is mapped."""
    left = {os.fsencode(p) for p in paths}
    try:
        procs = [e for e in Path("/proc").iterdir() if e.name.isdigit()] if left else []
    except OSError:  # (no /proc: nothing is known to be unused)
        return set()
    for entry in procs:
        if not left:
            break
        try:
            maps = (entry / "maps").read_bytes()
        except OSError:
            continue
        left = {p for p in left if p not in maps}
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                left.discard(os.fsencode(os.readlink(entry / "fd" / fd)))
    return {os.fsdecode(p) for p in left}


def remove_left_segments(before: set[str]) -> set[str]:
    """Unlink the MPI segments made since ``before`` (:func:`mpi_segments`) that no live
    process maps or holds open: a job's rank killed hard (a crash, SIGKILL, the OOM
    killer) cannot remove its own. The removed ones."""
    left = unused(mpi_segments() - before)
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return left


_shm_removed: list[tuple[str, int]] = []  # (test, MPI segments) that the guard removed


@pytest.fixture(autouse=True)
def _mpi_segments_removed(request):
    """After each test, the MPI segments in /dev/shm it left behind (made meanwhile,
    mapped or held open by no live process) are removed, and counted for the session's
    report: a job that its test killed on purpose, launcher and all, cannot remove its
    own."""
    before = mpi_segments()
    yield
    left = remove_left_segments(before)
    if left:
        _shm_removed.append((request.node.nodeid, len(left)))


def pytest_terminal_summary(terminalreporter):
    for test, job, notes in _slow_jobs:
        terminalreporter.write_line(f"slow job (half its timeout) in {test}: {job}")
        for note in notes:
            terminalreporter.write_line(textwrap.indent(note, "    "))
    if _shm_removed:
        total = sum(n for _, n in _shm_removed)
        terminalreporter.write_line(
            f"MPI segments and topology files left by killed jobs, removed: {total} "
            f"({', '.join(f'{t} ({n})' for t, n in _shm_removed)})"
        )


def _clean_env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_"))
    }
    env.update(PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", **extra)
    return env


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose command line or environment carries ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def job_marker():
    """A fresh value of ``TASKGRAPH_TEST_JOB`` in this process's environment, and so
    in every process started meanwhile; then the old value back, and a check that
    none of those processes is left (for fixtures wider than one test)."""
    value = uuid.uuid4().hex
    old = os.environ.get("TASKGRAPH_TEST_JOB")
    os.environ["TASKGRAPH_TEST_JOB"] = value
    try:
        yield value
    finally:
        if old is None:
            del os.environ["TASKGRAPH_TEST_JOB"]
        else:
            os.environ["TASKGRAPH_TEST_JOB"] = old
    assert_none_left(value)


@contextlib.contextmanager
def engines_marker(module=None):
    """:func:`job_marker` for a test that starts engines itself, with ``module`` (a test
    file, which the engines cannot import) pickled by value meanwhile."""
    import cloudpickle

    if module is not None:
        cloudpickle.register_pickle_by_value(module)
    try:
        with job_marker() as value:
            yield value
    finally:
        if module is not None:
            cloudpickle.unregister_pickle_by_value(module)


def listening(proc) -> set[str]:
    """The TCP addresses a process (psutil.Process) listens on, as "ip:port"."""
    import psutil

    try:
        conns = proc.net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN}


def child_pids() -> set[int]:
    """PIDs of this process's live children and their descendants (zombies aside)."""
    import psutil

    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def assert_no_new_children(before: set[int]) -> None:
    """No child this process started since ``before`` (from :func:`child_pids`) is alive
    5 s on: one that lives for the whole session (multiprocessing's resource tracker,
    started by an earlier test) is not this test's."""
    import psutil

    deadline = time.monotonic() + 5
    while (left := child_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = []
    for pid in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            described.append((pid, psutil.Process(pid).cmdline()))
    assert not described, f"processes left behind: {described}"


HANG_DUMP = 12.0  # seconds before a job's timeout when what its processes do is noted
GDB_BUDGET = 6.0  # seconds of those for native stacks (gdb, where it is installed)
_slow_jobs: list[tuple[str, str, list[str]]] = []  # (test, job, its processes then)


def note_processes(marker: str, notes: list[str], native: bool = True) -> list:
    """Note in ``notes`` each process of the job ``marker`` (command, state, each
    thread's kernel wait channel; with ``native``, its native stacks where gdb is
    installed, the ranks' first: gdb stops each process a moment). Its Python ranks
    (psutil.Process)."""
    import shutil

    import psutil

    gdb = shutil.which("gdb") if native else None
    until = time.monotonic() + GDB_BUDGET
    ranks = []
    procs = []  # (process, its command, whether it is a rank)
    for pid in processes_with(marker):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            cmd = p.cmdline()
            procs.append((p, cmd, bool(cmd) and "python" in os.path.basename(cmd[0])))
    procs.sort(key=lambda pcr: not pcr[2])
    for p, cmd, rank in procs:  # (the ranks first: gdb's time may not cover them all)
        pid = p.pid
        with contextlib.suppress(psutil.Error, OSError):
            waits = []
            for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
                with contextlib.suppress(OSError):
                    waits.append(f"{task.name}:{(task / 'wchan').read_text() or '-'}")
            notes.append(f"{pid} {p.status()} {' '.join(cmd)[:120]} waits {' '.join(waits)}")
            if gdb and time.monotonic() < until:
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    out = subprocess.run(
                        [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                        capture_output=True, text=True, timeout=max(0.5, until - time.monotonic()),
                    ).stdout  # fmt: skip
                    frames = [ln for ln in out.splitlines() if ln.startswith(("#", "Thread "))]
                    notes.append("\n".join(frames))
            if rank:
                ranks.append(p)
    return ranks


def dump_hung(marker: str, hung: list[str]) -> None:
    """A job still running near its timeout: :func:`note_processes` into ``hung``, then
    abort its Python ranks, whose faulthandler (PYTHONFAULTHANDLER, from
    :func:`_clean_env`) prints every thread's Python stack on their stderr (none once
    in MPI_Finalize: faulthandler is off by then). A rare hang in CI is otherwise a bare
    timeout."""
    import psutil

    for p in note_processes(marker, hung):  # (psutil refuses a pid reused meanwhile)
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGABRT)


def note_slow(marker: str, job: str) -> None:
    """A job still running at half its timeout: what its processes wait in, for the
    session's report (a 5 s job was seen once to take 60 s and end well: where such a
    one waits; no gdb, which would stop a job that may only be slow)."""
    notes: list[str] = []
    note_processes(marker, notes, native=False)
    _slow_jobs.append((os.environ.get("PYTEST_CURRENT_TEST", "?"), job, notes))


def assert_none_left(marker: str) -> None:
    deadline = time.monotonic() + 5
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def mpirun():
    """``mpirun(n, argv, timeout=60)``: run ``python argv`` on n ranks, captured."""

    def run(n: int, argv: list[str], timeout: float = 90, env: dict | None = None):
        marker = f"TASKGRAPH_TEST_JOB={uuid.uuid4().hex}"
        key, value = marker.split("=")
        job_env = _clean_env(**{key: value, "SCENARIO_TIMEOUT": str(max(5, timeout - 10))})
        job_env.update(env or {})
        hung: list[str] = []
        job = f"mpiexec -n {n} {' '.join(argv)}"
        timers = [
            threading.Timer(timeout / 2, note_slow, (marker, job)),
            threading.Timer(max(1.0, timeout - HANG_DUMP), dump_hung, (marker, hung)),
        ]
        for timer in timers:
            timer.daemon = True
            timer.start()
        try:
            proc = run_ranks(n, argv, timeout=timeout, capture=True, env=job_env)
        except subprocess.TimeoutExpired:
            assert_none_left(marker)
            pytest.fail(f"{job} ran past {timeout} s: " + "\n".join(hung))
        finally:
            for timer in timers:
                timer.cancel()
                timer.join()  # (one already noting must not signal pids later reused)
        assert_none_left(marker)
        if hung:
            pytest.fail(
                f"{job} hung for {timeout - HANG_DUMP:g} s; its "
                "processes then:\n" + "\n".join(hung) + "\nwhat the ranks printed:\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-8000:]}"
            )
        return proc

    return run


@pytest.fixture
def run_cli():
    """``run_cli(*args, timeout=...)``: the ``taskgraph`` command, bounded and checked."""

    def run(*args: str, timeout: float = 120, env: dict | None = None):
        marker = f"TASKGRAPH_TEST_JOB={uuid.uuid4().hex}"
        key, value = marker.split("=")
        job_env = _clean_env(**{key: value})
        job_env.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskgraph.batch.cli", *args],
            cwd=ROOT,
            env=job_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            assert_none_left(value)
            pytest.fail(f"taskgraph {' '.join(args)} ran past {timeout} s")
        assert_none_left(value)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    return run


__all__ = ["python_command"]
