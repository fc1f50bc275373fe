"""Batch use: the same script on every rank, the ``taskgraph`` command, a dying rank."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

EXAMPLE = str(ROOT / "examples" / "cholesky.py")


def test_same_factor_at_1_2_3_4_ranks(mpirun, tmp_path):
    factors = {}
    for ranks in (1, 2, 3, 4):
        out = tmp_path / f"L{ranks}.npy"
        proc = mpirun(ranks, [EXAMPLE, "--n", "700", "--tile", "128", "--save", str(out)])
        assert proc.returncode == 0, proc.stderr
        assert f"{ranks} ranks" in proc.stdout
        factors[ranks] = np.load(out)
    ref = factors[1]
    assert np.abs(ref).max() > 1  # a real factor, not zeros
    for ranks, L in factors.items():
        err = np.abs(L - ref).max() / np.abs(ref).max()
        assert err < 1e-14, f"{ranks} ranks differ from 1 rank by {err}"


def test_taskgraph_run_and_mpiexec_run_the_same_script(run_cli, mpirun):
    via_cli = run_cli("run", "-n", "4", EXAMPLE, "--n", "512", "--tile", "128")
    assert via_cli.returncode == 0, via_cli.stderr
    assert "4 ranks" in via_cli.stdout and "residual" in via_cli.stdout
    via_mpiexec = mpirun(4, [EXAMPLE, "--n", "512", "--tile", "128"])
    assert via_mpiexec.returncode == 0 and "4 ranks" in via_mpiexec.stdout


def test_demo_prints_figures_and_json(run_cli):
    proc = run_cli("demo", "--ranks", "2", "--n", "768", "--tile", "128", "--json")
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "n",
        "tile",
        "ranks",
        "workers_per_rank",
        "seconds",
        "gflops",
        "gemm_peak_gflops",
        "fraction_of_peak",
        "residual",
        "compile_seconds",
    ):
        assert key in last, key
    assert last["ranks"] == 2 and last["n"] == 768 and last["tile"] == 128
    assert last["residual"] < 1e-12 and last["gflops"] > 0 and last["gemm_peak_gflops"] > 0
    assert "GFLOP/s" in proc.stdout and "DGEMM peak" in proc.stdout


def test_demo_picks_its_tile_by_measurement_and_says_why(run_cli, tmp_path):
    env = {"TASKGRAPH_CACHE": str(tmp_path)}
    proc = run_cli("demo", "--ranks", "2", "--n", "1024", "--json", timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["tile"] in (128, 192, 256, 384, 512, 768, 1024)
    assert last["tile_why"].startswith(f"tile {last['tile']} for n=1024 on 2 cores")
    assert "chosen by calibration: tile" in proc.stdout and "(--tile to override)" in proc.stdout
    assert len(list(tmp_path.glob("tiles-*.json"))) == 1  # (kept for the next run)
    assert last["peak_measurements"] == 2 and last["machine"]["blas"]


def test_demo_float32_on_one_rank(run_cli):
    proc = run_cli(
        "demo",
        "--ranks",
        "1",
        "--workers",
        "2",
        "--n",
        "512",
        "--tile",
        "128",
        "--dtype",
        "float32",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["dtype"] == "float32" and last["workers_per_rank"] == 2
    assert last["residual"] < 1e-4 and "SGEMM peak" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "-n", "0", "x.py"), "at least 1"),
        (("run", "--timeout", "0", "x.py"), "--timeout: must be a number of seconds above 0"),
        (("run", "--timeout", "-5", "x.py"), "above 0 (got -5)"),
        (("demo", "--ranks", "0"), "at least 1"),
        (("frobnicate",), "taskgraph demo"),
    ],
)
def test_cli_rejects_bad_input(run_cli, args, message):
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stdout + proc.stderr


def test_missing_script_fails_clearly(run_cli):
    proc = run_cli("run", "-n", "2", "no/such/script.py", timeout=60)
    assert proc.returncode != 0
    assert "no such script: no/such/script.py" in proc.stderr


def test_a_rank_that_dies_ends_the_job(mpirun, tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        textwrap.dedent("""
        import os, time
        import taskgraph as tg

        @tg.kernel(modes="rw", dims="mn")
        def die_on_last_rank(t):
            if tg.current_cluster().rank == tg.current_cluster().size - 1:
                os._exit(3)
            time.sleep(0.2)

        size = tg.current_cluster().size
        B = tg.TiledMatrix.zeros((2 * size, 2), 2, grid=(size, 1))
        with tg.Graph("dies") as g:
            for i in range(size):
                die_on_last_rank(B[i, 0].rw)
        tg.current_cluster().run(g).wait()  # the others wait for the dead rank at the end
        print("UNREACHABLE")
    """)
    )
    from conftest import mpi_segments

    before = mpi_segments()
    proc = mpirun(3, [str(script)], timeout=60)
    assert proc.returncode != 0
    assert "UNREACHABLE" not in proc.stdout
    # the dead rank could not remove MPI's segment in /dev/shm: the launcher did
    assert not mpi_segments() - before, mpi_segments() - before


RAISES_ON_RANK_0 = """
import taskgraph as tg

cluster = tg.Cluster()
if cluster.rank == 0:
    raise ValueError("a typo on rank 0")
cluster.barrier()  # the other ranks wait here for rank 0, which never comes
print("UNREACHABLE")
"""


def test_an_exception_outside_a_run_ends_the_job_instead_of_hanging(mpirun, tmp_path):
    # without the abort hook rank 0 went into MPI_Finalize and rank 1 waited in the
    # barrier until the test's timeout
    script = tmp_path / "raises.py"
    script.write_text(RAISES_ON_RANK_0)
    proc = mpirun(2, [str(script)], timeout=45)
    assert proc.returncode != 0
    assert "ValueError: a typo on rank 0" in proc.stderr
    assert "rank 0/2 raised ValueError" in proc.stderr
    assert "UNREACHABLE" not in proc.stdout


SHM_OF_RANK = """
import os, sys
from pathlib import Path
import taskgraph as tg
from taskgraph.core.files import shm_files

cluster = tg.Cluster()
Path(sys.argv[1], f"shm.{cluster.rank}").write_text("\\n".join(shm_files([os.getpid()])))
cluster.barrier()
if cluster.rank == 0:
    raise ValueError("a bug on rank 0")
cluster.barrier()
"""


def test_a_job_ended_by_an_exception_leaves_no_shared_memory(mpirun, tmp_path):
    """MPI_Abort skips MPI_Finalize, which removes MPICH's /dev/shm file: the abort
    hook removes it instead (2 MiB a job, piling up on a shared login node)."""
    script = tmp_path / "shm.py"
    script.write_text(SHM_OF_RANK)
    proc = mpirun(2, [str(script), str(tmp_path)], timeout=45)
    assert proc.returncode != 0 and "a bug on rank 0" in proc.stderr
    segments = {s for r in (0, 1) for s in (tmp_path / f"shm.{r}").read_text().split()}
    assert segments, "MPICH maps a shared-memory file in each rank"
    assert not [s for s in segments if os.path.exists(s)], segments


EXITS_ON_RANK_0 = """
import sys
from pathlib import Path
import taskgraph as tg

cluster = tg.Cluster()
Path(sys.argv[1], f"started.{cluster.rank}").write_text("yes")  # a file: output can be lost
cluster.barrier()  # rank 0 exits only once rank 1 has started
if cluster.rank == 0:
    sys.exit(3)  # SystemExit passes by sys.excepthook: the abort hook never sees it
cluster.barrier()  # rank 1 waits here for rank 0, which never comes
print("UNREACHABLE")
"""


def test_taskgraph_run_ends_the_job_when_a_rank_calls_sys_exit(run_cli, tmp_path):
    # under a plain `python script.py` rank 0 went into MPI_Finalize with code 3 and
    # rank 1 waited in the barrier until the timeout; mpi4py's runner aborts the job.
    # Rank 0 used to exit as soon as it printed: under load the abort killed rank 1
    # before its own line came out (so each rank leaves a file, and they meet first),
    # and a slow start could reach the job's 40 s limit
    from conftest import mpi_segments

    script = tmp_path / "exits.py"
    script.write_text(EXITS_ON_RANK_0)
    before = mpi_segments()
    proc = run_cli("run", "-n", "2", "--timeout", "120", str(script), str(tmp_path), timeout=150)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert (tmp_path / "started.0").exists() and (tmp_path / "started.1").exists()
    assert "UNREACHABLE" not in proc.stdout
    assert not mpi_segments() - before  # (rank 1, killed, left one: `taskgraph run` removed it)


NOTES_SEGMENTS = """
import os
import taskgraph as tg
from taskgraph.core.files import SEGMENTS_VAR, held_topology, shm_files

cluster = tg.Cluster()
from mpi4py import MPI

mine = shm_files([os.getpid()]) | held_topology([os.getppid()])
listed = open(os.environ[SEGMENTS_VAR]).read().split()
mpich = "MPICH" in MPI.Get_library_version()
line = f"RANK {cluster.rank} {len(mine) if mpich else 2} {mine <= set(listed)}\\n"
os.write(1, line.encode())  # (one write: print's pieces of two ranks can interleave)
"""


def test_each_rank_notes_its_mpi_segments_for_the_launcher(mpirun, tmp_path):
    script = tmp_path / "notes.py"
    script.write_text(NOTES_SEGMENTS)
    proc = mpirun(2, [str(script)], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = sorted(line.split() for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert [rank for _, rank, _, _ in lines] == ["0", "1"], proc.stdout
    # every segment it maps is listed (MPICH makes one for 2 ranks on a host), and the
    # topology file its proxy holds (hydra writes one)
    assert all(ok == "True" and int(n) >= 2 for _, _, n, ok in lines), proc.stdout


def test_the_launcher_removes_the_listed_segments_that_are_left(tmp_path):
    from taskgraph.core import files

    made = [Path(files.SHM_DIR, f"mpich_shm_taskgraphtest{os.getpid()}_{i}") for i in range(2)]
    for path in made:
        path.write_bytes(b"x")
    topology = Path(tempfile.gettempdir(), f"hydra_hwloc_xmlfile_tgtest{os.getpid()}")
    topology.write_text("<topology/>")
    other = tmp_path / "hydra_hwloc_xmlfile_elsewhere"  # (only in the temporary directory)
    other.write_text("<topology/>")
    listed = tmp_path / "listed"
    # (only MPI segments and launcher topology files are removed)
    listed.write_text(f"{made[0]}\n/etc/passwd\n{topology}\n{other}\n")
    try:
        files.remove_segments(str(listed))
        assert not made[0].exists() and made[1].exists() and not listed.exists()
        assert Path("/etc/passwd").exists() and not topology.exists() and other.exists()
    finally:
        for path in [*made, topology]:
            path.unlink(missing_ok=True)


def test_a_launchers_guard_cleans_up_only_when_the_launcher_did_not(tmp_path):
    """A launcher killed outright (SIGKILL) cannot remove what its job's ranks listed,
    nor their boards: its guard does, once the job's mpiexec has ended; told "close",
    it touches nothing."""
    from taskgraph.core import files

    dead = subprocess.Popen(["true"])
    dead.wait()  # (a pid that has ended: the job's mpiexec, gone)
    segment = Path(files.SHM_DIR, f"mpich_shm_taskgraphtest{os.getpid()}_g")
    board = Path(files.SHM_DIR, f"{files.BOARD_PREFIX}{dead.pid}-0-abc123")
    listed = tmp_path / f"{files.SEGMENT_LISTS}{dead.pid}-x"
    try:
        for path in (segment, board):
            path.write_bytes(b"x")
        listed.write_text(f"{segment}\n")
        assert not files.guard_job(str(listed), [f"pid {dead.pid}\n", "close\n"])
        assert segment.exists() and board.exists() and listed.exists()
        assert files.guard_job(str(listed), [f"pid {dead.pid}\n"])  # (the pipe closed)
        assert not segment.exists() and not board.exists() and not listed.exists()
    finally:
        for path in (segment, board):
            path.unlink(missing_ok=True)


def test_the_abort_hook_prints_then_aborts_even_if_printing_fails():
    from taskgraph.run.comm import abort_hook

    calls = []

    def printing(kind, value, tb):
        calls.append(("print", kind))

    hook = abort_hook(printing, lambda: calls.append(("abort", None)), 1, 3)
    hook(KeyError, KeyError("k"), None)
    assert calls == [("print", KeyError), ("abort", None)]

    def broken(kind, value, tb):
        raise OSError("stderr closed")

    calls.clear()
    hook = abort_hook(broken, lambda: calls.append(("abort", None)), 1, 3)
    with pytest.raises(OSError):
        hook(KeyError, KeyError("k"), None)
    assert calls == [("abort", None)]
