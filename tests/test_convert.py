"""``taskgraph convert``: notebooks to batch scripts, and ``taskgraph run`` on notebooks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import nbclient
import nbformat
import pytest
from conftest import _clean_env, assert_none_left
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from taskgraph.batch import convert, nbshim
from taskgraph.batch.convert import ConversionError, Converter

CHOLESKY_CELLS = [
    "%load_ext autoreload\nimport numpy as np\nimport taskgraph as tg\n"
    "from taskgraph.linalg import cholesky, cholesky_residual\n"
    "from taskgraph.dsl.tiled import spd_dense",
    "cluster = tg.Cluster(n=2)  # two engines\ncluster",
    "A = tg.TiledMatrix.random_spd(256, tile=64, cluster=cluster)\ng = cholesky(A)",
    "%time run = cluster.run(g); run.wait()",
    "run.show()",
    "L = A.gather()\nres = cholesky_residual(spd_dense(256, 64), L)\n"
    "print(f'residual {res:.1e} small={res < 1e-12}')\n"
    "print(f'sum of L {np.tril(L).sum():.9f}')",
    "cluster.close()",
]


def write_notebook(path, cells, markdown: bool = True):
    cells = [new_code_cell(c) for c in cells]
    if markdown:
        cells.insert(0, new_markdown_cell("# A notebook"))
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


def cell(source: str) -> str:
    """The converted code of one cell of a notebook that imports taskgraph as tg."""
    conv = Converter()
    conv.cell("import taskgraph as tg", "cell 0")
    return conv.cell(textwrap.dedent(source).strip("\n"), "cell 1")


# -- the transformation, cell by cell -------------------------------------------------


def test_cluster_of_engines_becomes_the_jobs_ranks_never_another_number():
    assert cell("cluster = tg.Cluster(n=4)") == "cluster = _tgnb.JobCluster(n=4)\n"
    assert (
        cell("c = tg.Cluster(4, timeout=60, workers=2)") == "c = _tgnb.JobCluster(4, workers=2)\n"
    )
    assert cell("c = tg.Cluster.attach(connection_file='x.json')") == "c = _tgnb.JobCluster()\n"
    assert (
        cell("with tg.Cluster(\n    n=4,\n) as c:\n    pass")
        == "with _tgnb.JobCluster(n=4) as c:\n    pass\n"
    )
    conv = Converter()
    conv.cell("from taskgraph import Cluster as C", "cell 1")
    assert conv.cell("c = C(n=2)", "cell 2") == "c = _tgnb.JobCluster(n=2)\n"
    assert conv.imports_taskgraph


def test_gather_to_the_client_becomes_gather_on_every_rank():
    assert cell("L = A.gather()") == "L = A.gather(root=None)\n"
    assert cell("L = A.gather(root=0)") == "L = A.gather(root=0)\n"


def test_the_last_expression_is_displayed_unless_it_ends_with_a_semicolon():
    assert cell("x = 1\nx + 1") == "x = 1\n_tgnb.display(x + 1)\n"
    assert cell("x = 1\nx + 1;") == "x = 1\nx + 1;\n"
    assert cell("x + 1\ny = 2") == "x + 1\ny = 2\n"  # not the last: nothing shown
    assert cell("print(1)") == "print(1)\n"
    assert cell("run.show()") == "run.show()\n"
    assert cell("display(a, b)\nz = 3") == "_tgnb.display(a, b)\nz = 3\n"


def test_comments_and_layout_are_kept():
    src = "# setup\nx = [1,   2]  # odd spacing\n\n\ndef f(a):\n    return a  # keep\n"
    assert cell(src) == src


def test_time_magics_become_timed_blocks():
    assert cell("%time run = c.run(g); run.wait()") == (
        "with _tgnb.timed('time'):\n    run = c.run(g); _tgnb.display(run.wait())\n"
    )
    assert (
        cell("%%time\na = 1\na") == "with _tgnb.timed('time'):\n    a = 1\n    _tgnb.display(a)\n"
    )
    assert cell("%timeit -n 10 -r 3 f(x)\ny = 1") == (
        "with _tgnb.timed('timeit'):\n    f(x)\ny = 1\n"
    )
    assert cell("for i in range(2):\n    %time f(i)\nz = 0") == (
        "for i in range(2):\n    with _tgnb.timed('time'):\n        f(i)\nz = 0\n"
    )
    assert cell("%time tg.Cluster(n=2).run(g)\nx = 1") == (
        "with _tgnb.timed('time'):\n    _tgnb.JobCluster(n=2).run(g)\nx = 1\n"
    )


def test_shell_env_and_interactive_magics():
    assert cell("!ls -l $d") == "_tgnb.system('ls -l $d')\n"
    assert cell("files = !ls") == "files = _tgnb.getoutput('ls')\n"
    assert cell("%env OMP_NUM_THREADS=2") == "os.environ['OMP_NUM_THREADS'] = '2'\n"
    assert cell("%cd /tmp") == "os.chdir(os.path.expanduser('/tmp'))\n"
    out = cell("%matplotlib inline\n%load_ext autoreload\n%pip install x\nobj?")
    assert out.count("# taskgraph convert: %") == 4 and "get_ipython" not in out
    assert cell("%%writefile -a f.txt\nhello\n") == "_tgnb.writefile('-a f.txt', 'hello\\n')\n"
    assert cell("%%bash\necho hi\n") == "_tgnb.system('echo hi\\n', shell='bash')\n"
    assert cell("%%html\n<b>x</b>").startswith("# taskgraph convert: %%html cell left out")


def test_an_unknown_magic_is_left_out_with_a_note():
    conv = Converter()
    conv.cell("import taskgraph", "cell 1")
    out = conv.cell("%frobnicate now\nx = 1", "nb.ipynb, cell 2")
    assert out == "# taskgraph convert: left out magic %frobnicate now\nx = 1\n"
    assert conv.notes == ["nb.ipynb, cell 2: '%frobnicate now' has no batch equivalent; left out"]


def test_a_magic_used_as_a_value_is_an_error_naming_the_cell():
    with pytest.raises(ConversionError, match=r"cell 1, line 1: the value of a magic"):
        cell("t = %timeit -o f()")


# -- the runtime helpers --------------------------------------------------------------


def test_display_prints_as_ipython_and_skips_none_and_views(capsys):
    class TextView:  # the batch view of a run
        pass

    nbshim.display(None, {"b": 1, "a": [1, 2]}, "s", TextView())
    assert capsys.readouterr().out == "{'b': 1, 'a': [1, 2]}\n's'\n"


def test_timed_prints_times_before_the_value(capsys):
    with nbshim.timed("time"):
        nbshim.display(42)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CPU times: user ") and out[1].startswith("Wall time: ")
    assert out[2] == "42"


def test_system_expands_names_and_getoutput_returns_lines(capfd):
    d = "hello"  # noqa: F841 - expanded from the caller's namespace
    assert nbshim.system("echo $d {1 + 1}") == 0
    assert capfd.readouterr().out == "hello 2\n"
    assert nbshim.getoutput("printf 'a\\nb\\n'") == ["a", "b"]


# -- bad input ------------------------------------------------------------------------


def test_a_missing_notebook_says_so(tmp_path, run_cli):
    with pytest.raises(ConversionError, match="no such notebook; check the path"):
        convert.convert_notebook(tmp_path / "nope.ipynb")
    proc = run_cli("convert", str(tmp_path / "nope.ipynb"), timeout=60)
    assert proc.returncode == 2 and "nope.ipynb: no such notebook" in proc.stderr


@pytest.mark.parametrize(
    "content", ["print('a script')\n", '{"cells": 3}', "", '{"nbformat": 4, "cells": []}']
)
def test_a_file_that_is_not_a_notebook_says_so(tmp_path, content):
    path = tmp_path / "bad.ipynb"
    path.write_text(content)
    with pytest.raises(ConversionError, match="is not a Jupyter notebook .* saved by Jupyter"):
        convert.convert_notebook(path)


def test_a_notebook_without_taskgraph_code_says_so(tmp_path, run_cli):
    path = write_notebook(tmp_path / "plain.ipynb", ["import numpy as np", "np.ones(3).sum()"])
    with pytest.raises(ConversionError, match=r"no taskgraph code .*add `import taskgraph"):
        convert.convert_notebook(path)
    empty = write_notebook(tmp_path / "empty.ipynb", [])
    with pytest.raises(ConversionError, match="no taskgraph code"):
        convert.convert_notebook(empty)
    proc = run_cli("run", "-n", "2", str(path), timeout=60)
    assert proc.returncode == 2 and "plain.ipynb: no taskgraph code" in proc.stderr


def test_a_cell_with_a_syntax_error_is_named(tmp_path):
    path = write_notebook(tmp_path / "nb.ipynb", ["import taskgraph", "x = (1,"])
    with pytest.raises(ConversionError, match=r"nb.ipynb, cell 3, line 1: "):
        convert.convert_notebook(path)


# -- end to end -----------------------------------------------------------------------


def test_convert_writes_a_script_headed_by_its_notebook(tmp_path, run_cli):
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_CELLS)
    out = tmp_path / "chol.py"
    proc = run_cli("convert", str(nb), "-o", str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "converted from the notebook chol.ipynb" in text
    assert "_tgnb.rank0_prints()" in text and "_tgnb.JobCluster(n=2)  # two engines" in text
    compile(text, str(out), "exec")
    to_stdout = run_cli("convert", str(nb), timeout=60)
    assert to_stdout.returncode == 0 and "A.gather(root=None)" in to_stdout.stdout


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_the_script_on_two_ranks_prints_what_the_notebook_prints(tmp_path, run_cli, mpirun):
    nb = write_notebook(tmp_path / "chol.ipynb", CHOLESKY_CELLS)
    script = tmp_path / "chol.py"
    assert convert.convert_to_file(nb, script) == []

    # in one process, without MPI, the notebook's 2 ranks are not there: a clear error
    one = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_clean_env(TASKGRAPH_MPI="0", TASKGRAPH_TRACE_DIR=str(tmp_path / "one")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode != 0
    assert "Cluster(n=2) inside an MPI job of 1 rank(s)" in one.stderr, one.stderr

    # the notebook itself, in a kernel, on 2 real engines, prints the same numbers
    executed = nbformat.read(str(nb), as_version=4)
    marker = uuid.uuid4().hex
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TASKGRAPH_TEST_JOB", marker)  # inherited by the kernel and its engines
        mp.setenv("JUPYTER_PLATFORM_DIRS", "1")
        try:
            nbclient.NotebookClient(
                executed,
                timeout=120,
                kernel_name="python3",
                resources={"metadata": {"path": str(tmp_path)}},
            ).execute()
        finally:
            assert_none_left(marker)
    printed = [
        line
        for c in executed.cells
        if c.cell_type == "code"
        for out in c.outputs
        if out.get("name") == "stdout"
        for line in out["text"].splitlines()
    ]
    expected = [line for line in printed if line.startswith(("residual", "sum"))]
    assert len(expected) == 2 and expected[0].endswith("small=True"), printed

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    via_cli = run_cli(
        "run",
        "-n",
        "2",
        str(nb),
        timeout=150,
        env={"TASKGRAPH_TRACE_DIR": str(tmp_path / "cli"), "TMPDIR": str(tmp)},
    )
    via_mpiexec = mpirun(2, [str(script)], env={"TASKGRAPH_TRACE_DIR": str(tmp_path / "mpi")})
    for proc, traces in ((via_cli, "cli"), (via_mpiexec, "mpi")):
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        got = [line for line in lines if line.startswith(("residual", "sum"))]
        assert got == expected, proc.stdout  # once (rank 0 only), and the same numbers
        assert "<Cluster rank 0 of 2" in proc.stdout and "Wall time: " in proc.stdout
        assert "<Run 'cholesky' on 2 ranks: done>" in proc.stdout
        assert (tmp_path / traces / "cholesky.trace.json").exists()
        assert "Cluster(n=2) inside an MPI job" not in proc.stderr
    assert os.listdir(tmp) == []  # the temporary script is gone
