"""``taskgraph sbatch``: job scripts from ``slurm/`` templates, checked and run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, _clean_env, assert_none_left
from nbformat.v4 import new_code_cell, new_notebook

from taskgraph.batch.sbatch import (
    JobOptions,
    fill,
    load_template,
    parse_time,
    render_engines,
    render_job,
    template_dir,
    validate,
)
from taskgraph.cluster.launch import launcher_flavour, mpiexec_command
from taskgraph.core import config

SLURM = ROOT / "slurm"


def options(**kw) -> JobOptions:
    base = dict(
        script="/work/run me.py",
        nodes=2,
        ntasks_per_node=4,
        cpus_per_task=8,
        time="1:30:00",
        python="/opt/py/bin/python",
    )
    base.update(kw)
    return JobOptions(**base)


def bash_n(text: str, tmp_path: Path) -> None:
    path = tmp_path / f"check-{uuid.uuid4().hex}.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# -- --time ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),
        ("30:15", 1815),
        ("1:30:00", 5400),
        ("100:00:00", 360000),
        ("2-00", 172800),
        ("1-12", 129600),
        ("1-02:30", 95400),
        ("0-00:00:30", 30),
    ],
)
def test_slurm_time_formats(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "is not a SLURM time limit"),
        ("1h", "is not a SLURM time limit"),
        ("1:2:3:4", "is not a SLURM time limit"),
        ("-5", "is not a SLURM time limit"),
        ("1-", "is not a SLURM time limit"),
        ("10:75", "seconds must be below 60"),
        ("1:60:00", "minutes and seconds must be below 60"),
        ("1-24", "hours < 24"),
        ("0", "is zero"),
        ("0:00:00", "is zero"),
    ],
)
def test_malformed_time_says_which_formats_work(text, why):
    with pytest.raises(ValueError, match=re.escape(why)) as info:
        parse_time(text)
    if why != "is zero":
        assert "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS" in str(info.value)


# -- contradictory options ------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(ntasks_per_node=0), "--ntasks-per-node must be at least 1 (got 0)"),
        (dict(nodes=0), "--nodes must be at least 1 (got 0)"),
        (dict(cpus_per_task=-2), "--cpus-per-task must be at least 1 (got -2)"),
        (dict(time="soon"), "--time 'soon' is not a SLURM time limit"),
        (dict(partition="a b"), "--partition 'a b': use the name SLURM knows"),
        (dict(modules=["gcc openmpi"]), "one module name per --module"),
        (dict(mpi="pmix; rm -rf"), "--mpi"),
        (dict(script=""), "no script to run"),
    ],
)
def test_bad_options_say_what_to_fix(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate(options(**change))
    with pytest.raises(ValueError, match=re.escape(message)):
        render_job(options(**change))


# -- rendering: a pure function -------------------------------------------------------


def test_fill_replaces_every_placeholder_and_refuses_missing_ones():
    assert fill("a={{a}} ${B} {{b}}\n", {"a": "1", "b": "2"}) == "a=1 ${B} 2\n"
    with pytest.raises(KeyError, match="without a value: b"):
        fill("{{a}} {{b}}", {"a": "1"})


def test_job_script_has_sbatch_lines_modules_threads_trace_and_srun():
    text = render_job(
        options(partition="compute", account="proj42", modules=["gcc/12", "openmpi/4.1"])
    )
    assert text == render_job(
        options(partition="compute", account="proj42", modules=["gcc/12", "openmpi/4.1"])
    )
    assert text.startswith("#!/bin/bash\n")
    for line in (
        "#SBATCH --job-name=run_me",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=1:30:00",
        "#SBATCH --partition=compute",
        "#SBATCH --account=proj42",
        "#SBATCH --output=run_me-%j.out",
        "module load gcc/12",
        "module load openmpi/4.1",
        'cpus="${SLURM_CPUS_PER_TASK:-8}"',
        'export TASKGRAPH_WORKERS="$cpus"',
        'export OMP_NUM_THREADS="$cpus"',
        'export OPENBLAS_NUM_THREADS="$cpus"',
        'export MKL_NUM_THREADS="$cpus"',
        'export NUMBA_NUM_THREADS="$cpus"',
        'export TASKGRAPH_TRACE_DIR="${SLURM_SUBMIT_DIR:-$PWD}/run_me-${SLURM_JOB_ID:-local}'
        '.trace"',
        "srun --cpus-per-task=\"$cpus\" /opt/py/bin/python -m mpi4py '/work/run me.py'",
    ):
        assert line in text.splitlines(), line
    # every #SBATCH line comes before the first command
    lines = text.splitlines()
    first_command = next(i for i, x in enumerate(lines) if x and not x.startswith("#"))
    assert max(i for i, x in enumerate(lines) if x.startswith("#SBATCH")) < first_command
    assert "{{" not in text and "}}" not in text


def test_job_script_options_args_venv_mpi_and_source():
    text = render_job(
        options(
            args=["--n", "4096", "it's"],
            venv="/home/me/venv",
            mpi="pmix",
            source="/home/me/chol.ipynb",
            job_name="chol run",
        )
    )
    assert "srun --mpi=pmix --cpus-per-task=" in text
    assert text.rstrip().endswith("'/work/run me.py' --n 4096 'it'\"'\"'s'")
    assert "source /home/me/venv/bin/activate" in text
    assert "#SBATCH --job-name=chol_run" in text
    assert "# A taskgraph batch job: /home/me/chol.ipynb (converted to /work/run me.py)" in text
    assert "module load" not in text.replace("--module NAME adds `module load NAME`", "")


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(partition="debug", account="a1", modules=["x/1"], args=["a b"], mpi="pmi2"),
        dict(venv="/v v", time="2-00", nodes=1, ntasks_per_node=1, cpus_per_task=1),
    ],
)
def test_every_script_produced_passes_bash_n(kw, tmp_path):
    bash_n(render_job(options(**kw)), tmp_path)
    engines = render_engines(options(**kw))
    bash_n(engines, tmp_path)
    assert "{{" not in engines and "-m ipyparallel.engine --mpi" in engines
    assert "tg.Cluster.attach(connection_file=" in engines
    assert "#SBATCH --job-name=taskgraph-engines" in engines


def test_templates_are_found_in_the_package(tmp_path):
    assert template_dir().resolve() == SLURM.resolve()
    for name in ("job.sh.tmpl", "engines.sh.tmpl"):
        assert load_template(name) == (SLURM / name).read_text()
    for name in ("README.md", "jupyterhub_config.py"):
        assert (SLURM / name).exists()
    compile((SLURM / "jupyterhub_config.py").read_text(), "jupyterhub_config.py", "exec")


# -- the command ----------------------------------------------------------------------

CHOLESKY_NOTEBOOK = [
    "import numpy as np\nimport taskgraph as tg\n"
    "from taskgraph.linalg import cholesky, cholesky_residual\n"
    "from taskgraph.dsl.tiled import spd_dense",
    "cluster = tg.Cluster(n=2)\n"
    "A = tg.TiledMatrix.random_spd(256, tile=64, cluster=cluster)\n"
    "run = cluster.run(cholesky(A))",
    "run.show()",
    "run.wait()\nL = A.gather()\nprint(f'residual {cholesky_residual(spd_dense(256, 64), L):.1e}')",
]


def write_notebook(path: Path, cells: list[str]) -> Path:
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), str(path))
    return path


def test_sbatch_command_converts_the_notebook_beside_the_job(tmp_path, run_cli):
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_NOTEBOOK)
    job = tmp_path / "out" / "job.sh"
    job.parent.mkdir()
    proc = run_cli(
        "sbatch", str(nb), "--nodes", "1", "--ntasks-per-node", "2", "--time", "5",
        "-o", str(job), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "out" / "chol_batch.py"
    assert script.exists() and "_tgnb.JobCluster(n=2)" in script.read_text()
    text = job.read_text()
    assert str(script) in text and "#SBATCH --time=5" in text and "sbatch" in proc.stderr
    to_stdout = run_cli("sbatch", str(script), "--ntasks-per-node", "2", timeout=60)
    assert to_stdout.returncode == 0 and to_stdout.stdout.startswith("#!/bin/bash")


def test_sbatch_refuses_at_once_a_cluster_larger_than_the_job(tmp_path, run_cli):
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_NOTEBOOK)  # tg.Cluster(n=2)
    one = run_cli("sbatch", str(nb), "--ntasks-per-node", "1", timeout=60)
    assert one.returncode == 2 and one.stdout == ""
    assert "chol.ipynb, line " in one.stderr
    assert "Cluster(n=2) needs 2 ranks and the job has 1" in one.stderr
    four = run_cli("sbatch", str(nb), "--ntasks-per-node", "4", "-o", str(tmp_path / "j.sh"))
    assert four.returncode == 0 and "runs on 2 of the job's 4 ranks" in four.stderr
    script = tmp_path / "broken.py"
    script.write_text("import taskgraph as tg\nc = tg.Cluster(\n")
    broken = run_cli("sbatch", str(script), timeout=60)
    assert broken.returncode == 2 and "broken.py, line " in broken.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["{nb}", "--ntasks-per-node", "0"], "--ntasks-per-node must be at least 1 (got 0)"),
        (["{nb}", "--time", "1:2:3:4"], "--time '1:2:3:4' is not a SLURM time limit: use MM"),
        (["{dir}/missing.ipynb"], "missing.ipynb: no such file; check the path"),
        (["{dir}/notes.txt"], "give a notebook (.ipynb) or a Python script (.py)"),
        (["{dir}/broken.ipynb"], "broken.ipynb is not a Jupyter notebook"),
        (["{dir}/plain.ipynb"], "plain.ipynb: no taskgraph code"),
        ([], "give a notebook (.ipynb) or a Python script to run"),
    ],
)
def test_sbatch_command_rejects_bad_input_clearly(args, message, tmp_path, run_cli):
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_NOTEBOOK)
    write_notebook(tmp_path / "plain.ipynb", ["x = 1"])
    (tmp_path / "broken.ipynb").write_text("{not json")
    (tmp_path / "notes.txt").write_text("hello")
    argv = [a.format(nb=nb, dir=tmp_path) for a in args]
    proc = run_cli("sbatch", *argv, "-o", str(tmp_path / "job.sh"), timeout=60)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr
    assert not (tmp_path / "job.sh").exists()


# -- end to end: the job script under a stub srun -------------------------------------


def slurm_env(tmp_path: Path, marker: str, **extra) -> dict:
    """SLURM's variables for a 2-rank job, and an ``srun`` on PATH that drops its own
    options and runs the rest under mpiexec (it notes its arguments in srun.args)."""
    exe = config.mpiexec()
    launch = " ".join(mpiexec_command(exe, launcher_flavour(exe), 2, [], os.geteuid() == 0))
    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir()
    stub.write_text(
        "#!/bin/bash\n# srun for tests: drop srun's options, run the rest under mpiexec\n"
        'echo "srun $*" > "$(dirname "$0")/srun.args"\n'
        'while [[ "${1:-}" == -* ]]; do shift; done\n'
        f'exec {launch.replace(" -n 2", " -n $SLURM_NTASKS")} "$@"\n'
    )
    stub.chmod(0o755)
    return _clean_env(
        TASKGRAPH_TEST_JOB=marker,
        PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURM_CPUS_PER_TASK="1",
        SLURM_NTASKS="2",
        **extra,
    )


def start_job(job: Path, env: dict) -> subprocess.Popen:
    """``bash job`` in its folder, in a process group of its own (killed whole)."""
    return subprocess.Popen(
        ["bash", str(job)],
        cwd=job.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_job_runs_under_a_stub_srun_and_leaves_its_trace(tmp_path, run_cli):
    """``bash job.sh`` with SLURM's variables and an ``srun`` that hands over to mpiexec."""
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_NOTEBOOK)
    job = tmp_path / "job.sh"
    proc = run_cli(
        "sbatch", str(nb), "--ntasks-per-node", "2", "--cpus-per-task", "1", "--time", "5:00",
        "-o", str(job), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    marker = uuid.uuid4().hex
    env = slurm_env(tmp_path, marker)
    bash = start_job(job, env)
    try:
        out, err = bash.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(bash.pid, signal.SIGKILL)
        bash.communicate()
        assert_none_left(marker)
        pytest.fail("bash job.sh ran past 180 s")
    assert_none_left(marker)
    assert bash.returncode == 0, err
    assert "taskgraph: job 4242: 2 ranks x 1 threads" in out
    residuals = [line for line in out.splitlines() if line.startswith("residual")]
    assert len(residuals) == 1, out  # printed by rank 0 only
    assert re.fullmatch(r"residual \d\.\de-1[4-9]", residuals[0]), out
    assert (tmp_path / "bin" / "srun.args").read_text().startswith("srun --cpus-per-task=1 ")
    trace_dir = tmp_path / "chol-4242.trace"
    assert (trace_dir / "cholesky.trace.json").exists(), err
    assert (trace_dir / "cholesky.html").exists()
    assert f"trace written to {trace_dir}" in err


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_notebook_attaches_to_the_engines_job(tmp_path, run_cli):
    """``bash engines.sh`` (stub srun, as SLURM would run it) starts a controller and 2
    engines; the notebook side attaches with the connection file the job prints, runs a
    Cholesky on them, and ``scancel`` (SIGTERM to the job) stops every process."""
    import queue
    import threading
    import time

    import taskgraph as tg
    from taskgraph.dsl.tiled import spd_dense
    from taskgraph.linalg import cholesky, cholesky_residual
    from taskgraph.run.singlecopy import can_read_memory, yama_scope

    job = tmp_path / "engines.sh"
    proc = run_cli(
        "sbatch", "--engines", "--ntasks-per-node", "2", "--cpus-per-task", "1",
        "--time", "5:00", "-o", str(job), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    marker = uuid.uuid4().hex
    env = slurm_env(tmp_path, marker, HOME=str(tmp_path), TASKGRAPH_CONTROLLER_IP="127.0.0.1")
    bash = start_job(job, env)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in bash.stdout], daemon=True)
    reader.start()
    cluster = None
    try:
        connection, deadline = None, time.monotonic() + 90
        while connection is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert bash.poll() is None, f"the job ended: {bash.stderr.read()}"
                continue
            found = re.search(r'connection_file="([^"]+)", n=2\)', line)
            connection = found.group(1) if found else None
        assert connection, "the job printed no connection file within 90 s"
        assert connection.startswith(str(tmp_path / ".ipython" / "profile_taskgraph"))
        cluster = tg.Cluster.attach(connection_file=connection, n=2, timeout=60)
        assert cluster.size == 2
        allowed = yama_scope() in (None, "0") and can_read_memory()
        assert [info["single_copy"] for info in cluster.infos] == [allowed, allowed]
        A = tg.TiledMatrix.random_spd(256, 64, cluster=cluster)
        cluster.run(cholesky(A)).wait(timeout=120)
        assert cholesky_residual(spd_dense(256, 64), A.gather()) < 1e-14
    finally:
        if cluster is not None:
            cluster.close()
        os.killpg(bash.pid, signal.SIGTERM)  # what scancel does
        try:
            bash.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(bash.pid, signal.SIGKILL)
            bash.wait()
        reader.join(10)
        bash.stdout.close()
        bash.stderr.close()
        assert_none_left(marker)
