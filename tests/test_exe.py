"""Executable tasks (taskgraph.dsl.exe): results, fields and quoting, output files,
errors that name the command, timeouts and interrupts that take the whole process
group down, the environment of a child of an MPI rank, and executable tasks in real
graph runs: in this process, and in 2-rank batch jobs that also launch a 2-rank MPI
program from a task (under MPICH, and Open MPI where it is installed)."""

from __future__ import annotations

import os
import pickle
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import assert_no_new_children, child_pids
from test_system_mpi import LIBS, needs_openmpi

import taskgraph as tg
from taskgraph.core import config
from taskgraph.core.errors import ExecutableError
from taskgraph.dsl.exe import ExeResult, child_env, exe, launcher, resources_of_call, shell
from taskgraph.run.executor import TaskAbandoned, interrupt_thread

MPI_SIZE = "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"


def gone(pids: list[int], within: float = 5.0) -> bool:
    """Whether every process in ``pids`` has ended (zombies count as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(30)
def test_shell_and_exe_return_results_with_stamps():
    r = shell("echo out; echo err >&2")
    assert isinstance(r, ExeResult) and r.ok and r.returncode == 0
    assert (r.stdout, r.stderr, str(r)) == ("out\n", "err\n", "out")
    assert r.stdout_path is None and r.stderr_path is None
    assert r.launched <= r.started <= r.ended and r.seconds == pytest.approx(r.ended - r.launched)
    assert r.cmd == "echo out; echo err >&2"
    # no shell: every word arrives as it is
    r = exe(["printf", "%s|", "a b", "$HOME", 3, Path("p q")])
    assert r.stdout == "a b|$HOME|3|p q|"
    assert r.cmd == "printf '%s|' 'a b' '$HOME' 3 'p q'"
    assert exe("/bin/true").ok
    assert not shell("exit 4", check=False).ok


@pytest.mark.timeout(30)
def test_fields_are_shell_quoted_and_results_stand_for_their_output(tmp_path):
    spaced = tmp_path / "a dir" / "my file.txt"
    spaced.parent.mkdir()
    spaced.write_text("one\ntwo\n")
    assert shell("wc -l < {f}", f=spaced).stdout.strip() == "2"
    assert shell("echo {x}", x="$HOME; rm -rf x").stdout == "$HOME; rm -rf x\n"
    assert shell("echo {v:.2f} {{braces}}", v=1 / 3).stdout == "0.33 {braces}\n"
    # another command's result: its stdout, stripped, or an attribute of it
    listed = shell("echo {d}", d=spaced.parent)
    assert shell("ls {d}", d=listed).stdout == "my file.txt\n"
    assert shell("echo {r.returncode}", r=listed).stdout == "0\n"
    assert shell("echo {opts}", opts="-n x", quote=False).stdout == "x"
    with pytest.raises(ValueError, match=r"no value for field 'y' \(fields given: x;"):
        shell("echo {x} {y}", x=1)


@pytest.mark.timeout(30)
def test_stdout_and_stderr_go_to_files_relative_to_cwd(tmp_path):
    r = shell("pwd; echo bad >&2", cwd=tmp_path, stdout="out.txt", stderr=tmp_path / "err.txt")
    assert r.stdout is None and r.stderr is None
    assert r.stdout_path == tmp_path / "out.txt" and r.stderr_path == tmp_path / "err.txt"
    assert (tmp_path / "out.txt").read_text() == f"{tmp_path}\n"
    assert (tmp_path / "err.txt").read_text() == "bad\n"
    assert str(r) == str(tmp_path / "out.txt")  # a result in a file stands for its path
    assert shell("cat {f}", f=r).stdout == f"{tmp_path}\n"


@pytest.mark.timeout(30)
def test_a_nonzero_exit_names_the_command_the_code_and_the_stderr_tail(tmp_path):
    cmd = "for i in $(seq 30); do echo line$i >&2; done; exit 3"
    with pytest.raises(ExecutableError) as caught:
        shell(cmd)
    text = str(caught.value)
    assert text.startswith(f"command {cmd} exited with code 3; the end of its stderr:\n")
    assert text.endswith("\n".join(f"line{i}" for i in range(11, 31)))
    assert "line10\n" not in text
    result = caught.value.result
    assert result.returncode == 3 and result.stderr.count("\n") == 30
    # stderr in a file: its tail is read back; the error pickles with its result
    with pytest.raises(ExecutableError, match=r"code 5; the end of its stderr:\nboom$") as caught:
        exe(["sh", "-c", "echo boom >&2; exit 5"], stderr=tmp_path / "e.txt")
    again = pickle.loads(pickle.dumps(caught.value))
    assert str(again) == str(caught.value) and again.result == caught.value.result
    with pytest.raises(ExecutableError, match="was killed by SIGKILL; its stderr is empty"):
        shell("kill -9 $$")
    with pytest.raises(ExecutableError, match="command /no/such/program could not start"):
        exe(["/no/such/program"])
    long = "true " + "x" * 500 + "; exit 1"
    with pytest.raises(ExecutableError) as caught:
        shell(long)
    assert " ... " in str(caught.value) and len(str(caught.value).splitlines()[0]) < 260


@pytest.mark.timeout(30)
def test_a_timeout_kills_the_whole_process_group():
    before = child_pids()
    start = time.monotonic()
    with pytest.raises(ExecutableError) as caught:
        shell("sleep 30 & echo $!; sleep 30 & echo $!; wait", timeout=0.5)
    assert time.monotonic() - start < 5
    assert "timed out after 0.5 s (its process group was killed)" in str(caught.value)
    pids = [int(p) for p in caught.value.result.stdout.split()]
    assert len(pids) == 2 and gone(pids), pids
    assert_no_new_children(before)


@pytest.mark.timeout(30)
def test_what_a_command_leaves_in_the_background_ends_with_it(tmp_path):
    r = shell("sleep 30 & echo $!", stdout=tmp_path / "pid")  # no pipe holds it
    assert gone([int((tmp_path / "pid").read_text())])
    start = time.monotonic()
    r = shell("sleep 30 & echo $!")  # it holds the output pipe: let go after a linger
    assert time.monotonic() - start < 5 and gone([int(r.stdout)])


@pytest.mark.timeout(30)
def test_an_interrupted_thread_kills_the_process_group():
    """A cancelled run raises TaskAbandoned in the worker thread (interrupt_thread)."""
    before = child_pids()
    outcome: list = []

    def work():
        try:
            shell("sleep 30 & sleep 30; wait")
            outcome.append("returned")
        except TaskAbandoned as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 10
    while len(child_pids() - before) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = child_pids() - before
    assert len(started) == 3  # sh and its two sleeps
    assert interrupt_thread(worker)
    worker.join(10)
    assert not worker.is_alive() and outcome and isinstance(outcome[0], TaskAbandoned), outcome
    assert gone(list(started))
    assert_no_new_children(before)


@pytest.mark.timeout(30)
def test_a_child_of_an_mpi_rank_sees_no_process_manager_variables(monkeypatch):
    ours = {"PMI_RANK": "0", "PMI_FD": "7", "HYDI_CONTROL_FD": "9", "MPI_LOCALRANKID": "0"}
    ours |= {"OMPI_COMM_WORLD_SIZE": "2", "PMIX_RANK": "0", "TASKGRAPH_KEEP": "yes"}
    for k, v in ours.items():
        monkeypatch.setenv(k, v)
    seen = dict(line.split("=", 1) for line in shell("env").stdout.splitlines() if "=" in line)
    assert seen["TASKGRAPH_KEEP"] == "yes"
    assert not {k for k in ours if k != "TASKGRAPH_KEEP"} & set(seen)
    env = child_env({"EXTRA": Path("/x"), "TASKGRAPH_KEEP": None})
    assert env is not None and env["EXTRA"] == "/x" and "TASKGRAPH_KEEP" not in env
    # outside a rank, nothing is dropped, and the environment is inherited as it is
    for k in ours:
        monkeypatch.delenv(k)
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")
    assert child_env() is None
    assert child_env({"A": 1})["OMPI_MCA_rmaps_base_oversubscribe"] == "1"


@pytest.mark.timeout(30)
def test_the_mpi_launcher_and_the_cores_a_call_asks_for(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("TASKGRAPH_MPIEXEC", raising=False)
    assert launcher(3) == [config.mpiexec(), "-n", "3"]
    monkeypatch.setenv("TASKGRAPH_MPIEXEC", "/opt/mpi/bin/mpirun")
    assert launcher(2) == ["/opt/mpi/bin/mpirun", "-n", "2"]
    srun = tmp_path / "srun"  # a SLURM allocation: SLURM_JOB_ID set and srun on PATH
    srun.write_text('#!/bin/sh\necho srun "$@"\n')
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert launcher(4) == ["srun", "-n", "4"]
    assert shell("prog {x} > {o}", x="a b", o=tmp_path / "o", ranks=4).ok
    assert (tmp_path / "o").read_text() == "srun -n 4 prog a b\n"
    assert exe(["prog", 1], ranks=2).stdout == "srun -n 2 prog 1\n"
    with pytest.raises(ValueError, match="ranks must be an int >= 1, not 0"):
        exe(["prog"], ranks=0)
    assert resources_of_call({"ranks": 4, "cwd": "x"}) == {"cores": 4}
    assert resources_of_call({"cwd": "x"}) == {} == resources_of_call({"ranks": None})


@pytest.mark.timeout(60)
def test_executable_tasks_in_a_graph_take_other_tasks_values(tmp_path):
    assert pickle.loads(pickle.dumps(shell)).fn is shell.fn  # (they travel by reference)
    with tg.Graph("exe") as g:
        made = shell("seq {n}", n=4, stdout=tmp_path / "seq out.txt")
        counted = shell("wc -l < {f}", f=made)
        exe(["echo", counted, "lines"])
        shell("echo nope >&2; exit 2")
    successors = g.successors()
    assert 1 in successors[0] and 2 in successors[1] and not successors[3]
    assert g.label(0).startswith("shell#0(") and g.label(2).startswith("exe#2(")
    with pytest.raises(tg.TaskError) as caught:
        tg.Cluster().run(g).wait(30)
    text = str(caught.value)
    assert "shell#3" in text and "exit 2 exited with code 2" in text and "nope" in text
    with tg.Graph("exe ok") as g:
        made = shell("seq {n}", n=4, stdout=tmp_path / "seq out.txt")
        words = exe(["echo", shell("wc -l < {f}", f=made), "lines"])
    tg.Cluster().run(g).wait(30)
    assert words.result().stdout == "4 lines\n"


JOB = """
import sys
from pathlib import Path
import taskgraph as tg
from taskgraph.dsl.exe import exe, shell

tmp = Path(sys.argv[1])
c = tg.Cluster()
with tg.Graph("exe") as g:
    made = shell("seq {{n}}; echo rank $PMI_RANK$OMPI_COMM_WORLD_RANK", n=3,
                 stdout=tmp / "seq out.txt")
    counted = shell("wc -l < {{f}}", f=made)
    mpi = exe([sys.executable, "-c", {mpi_size!r}], ranks=2, env={env!r})
c.run(g, workers=2).wait(60)
# (two ranks' lines, and the MPI program's, may interleave: one write each, in order)
sys.stdout.write(f"rank {{c.rank}}: counted {{counted.result()}}\\n")
sys.stdout.write(f"rank {{c.rank}}: mpi {{sorted(mpi.result().stdout)}}\\n")
sys.stdout.flush()
"""


def run_exe_job(mpirun, tmp_path, env: dict, job_env: dict | None = None) -> str:
    script = tmp_path / "exe_job.py"
    script.write_text(textwrap.dedent(JOB.format(mpi_size=MPI_SIZE, env=env)))
    before = child_pids()
    proc = mpirun(2, [str(script), str(tmp_path)], timeout=90, env=job_env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert_no_new_children(before)
    out = proc.stdout
    for rank in range(2):
        assert f"rank {rank}: counted 4" in out, out
        assert f"rank {rank}: mpi ['\\n', '\\n', '2', '2']" in out, out + proc.stderr[-3000:]
    return out


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_executable_tasks_and_a_2_rank_mpi_program_in_a_2_rank_batch_job(mpirun, tmp_path):
    run_exe_job(mpirun, tmp_path, env={})
    # the command ran on one rank of the job, where the job's variables stayed out
    assert (tmp_path / "seq out.txt").read_text() == "1\n2\n3\nrank\n"


@needs_openmpi
@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_2_rank_mpi_program_from_a_task_under_open_mpi(mpirun, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKGRAPH_MPIEXEC", "/usr/bin/mpiexec.openmpi")
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    outer = {"MPI4PY_LIBMPI": LIBS[0], "OMPI_MCA_rmaps_base_oversubscribe": "1", **root}
    # the job's own Open MPI settings are dropped from the task's child: the task sets its own
    inner = {"OMPI_MCA_rmaps_base_oversubscribe": "1", **root}
    run_exe_job(mpirun, tmp_path, env=inner, job_env=outer)
