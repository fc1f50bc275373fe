"""Teaching exercises: the kernels, the checkers' findings and hints, the notebook.

* the kernels of :mod:`taskgraph.kernels.teaching` against NumPy (both dtypes, and the
  ``py_func`` of the loop kernels);
* the solutions pass both checkers in this process (one rank), and deliberately wrong
  answers (a missing task, a wrong mark, a needless dependency, a cycle, calls in the
  wrong order, wrong halo tiles) each get the right finding with a hint;
* notebooks/05-exercises.ipynb runs headless on a 2-engine cluster with
  ``TASKGRAPH_QUICK=1`` in its stub state, then with the solutions, which pass there.
"""

from __future__ import annotations

import runpy
import shutil
import time
import uuid

import numpy as np
import pytest
from conftest import ROOT, assert_none_left
from taskgraph.kernels import teaching as T

import taskgraph as tg
from taskgraph.teach import ExerciseError, Feedback, jacobi_numpy, lu_nopiv_numpy

pytestmark = pytest.mark.timeout(120)

NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions" / "05-exercises-solutions.py"
DTYPES = ["float64", "float32"]
RTOL = {"float64": 1e-12, "float32": 5e-5}


@pytest.fixture(scope="module")
def sol() -> dict:
    return runpy.run_path(str(SOLUTIONS))


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setenv("TASKGRAPH_QUICK", "1")


def fortran(rng, shape, dtype) -> np.ndarray:
    return np.asfortranarray(rng.random(shape)).astype(dtype, order="F")


def close(a, b, dtype) -> bool:
    return np.linalg.norm(a - b) <= RTOL[dtype] * max(1.0, np.linalg.norm(b))


# -- kernels --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_kernels_against_numpy(dtype):
    rng = np.random.default_rng(1)
    n = 9
    a = fortran(rng, (n, n), dtype) + n * np.eye(n, dtype=dtype)
    f = a.copy(order="F")
    T.getrf_nopiv(f)
    L, U = np.tril(f, -1) + np.eye(n), np.triu(f)
    assert close(L @ U, a, dtype)
    assert close(f, lu_nopiv_numpy(a), dtype)

    b = fortran(rng, (n, 4), dtype)
    x = b.copy(order="F")
    T.trsm_lower_unit(f, x)
    assert close(L @ x, b, dtype)

    b = fortran(rng, (5, n), dtype)
    x = b.copy(order="F")
    T.trsm_upper_right(f, x)
    assert close(x @ U, b, dtype)

    p, q, c = fortran(rng, (3, n), dtype), fortran(rng, (n, 6), dtype), fortran(rng, (3, 6), dtype)
    expected = c - p @ q
    T.gemm_nn(p, q, c)
    assert close(c, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_jacobi_step_against_numpy(dtype):
    """A 3 x 3 grid of tiles on a torus, each tile swept with its four neighbours."""
    rng = np.random.default_rng(2)
    u = rng.random((12, 15)).astype(dtype)
    expected = jacobi_numpy(u, 1)
    out = np.zeros_like(u)
    tiles = [[np.asfortranarray(u[4 * i : 4 * i + 4, 5 * j : 5 * j + 5]) for j in range(3)]
             for i in range(3)]  # fmt: skip
    for i in range(3):
        for j in range(3):
            t = np.zeros((4, 5), dtype, order="F")
            T.jacobi_step(
                tiles[i][j],
                tiles[(i - 1) % 3][j],
                tiles[(i + 1) % 3][j],
                tiles[i][(j - 1) % 3],
                tiles[i][(j + 1) % 3],
                t,
            )
            out[4 * i : 4 * i + 4, 5 * j : 5 * j + 5] = t
    assert close(out, expected, dtype)


def test_py_funcs_match_the_compiled_kernels():
    rng = np.random.default_rng(3)
    a = fortran(rng, (6, 6), "float64") + 6 * np.eye(6)
    jit, py = a.copy(order="F"), a.copy(order="F")
    assert T.compile_op("getrf_nopiv")(jit) == 0
    assert T.JITTED["getrf_nopiv", "float64"].py_func(py) == 0
    assert np.allclose(jit, py)
    c = fortran(rng, (4, 4), "float64")
    o1, o2 = np.zeros_like(c), np.zeros_like(c)
    T.compile_op("jacobi_step")(c, c, c, c, c, o1)
    T.JITTED["jacobi_step", "float64"].py_func(c, c, c, c, c, o2)
    assert np.allclose(o1, o2) and np.allclose(o1, jacobi_numpy(c, 1))


def test_kernels_say_what_is_wrong():
    with pytest.raises(ValueError, match="zero pivot"):
        T.getrf_nopiv(np.zeros((3, 3), order="F"))
    with pytest.raises(ValueError, match="dims kk,kn"):
        T.trsm_lower_unit(np.eye(3, order="F"), np.zeros((4, 2), order="F"))
    with pytest.raises(ValueError, match="one dtype"):
        T.gemm_nn(
            np.eye(2, dtype=np.float32, order="F"), np.eye(2, order="F"), np.eye(2, order="F")
        )
    assert [k.name for k in T.LU_KERNELS] == [
        "getrf_nopiv",
        "trsm_lower_unit",
        "trsm_upper_right",
        "gemm_nn",
    ]
    assert repr(T.jacobi_step) == "<kernel jacobi_step(r,r,r,r,r,w)>"


# -- the solutions pass -------------------------------------------------------------------


def test_solutions_pass_in_process(sol):
    fb = tg.teach.check_lu(sol["lu"])
    assert fb.ok, str(fb)
    assert fb.findings == [] and fb.error is not None and fb.error < fb.tolerance
    assert "passed" in str(fb) and "passed" in fb._repr_html_()
    assert fb.raise_for_errors() is fb
    fb = tg.teach.check_jacobi(sol["jacobi"])
    assert fb.ok, str(fb)
    fb = tg.teach.check_lu(sol["lu"], n=50, tile=16, dtype=np.float32)  # ragged edge tiles
    assert fb.ok, str(fb)


# -- wrong answers: findings with hints ---------------------------------------------------


def lu_with(A, *, skip=None, order="right", getrf=None):
    """The LU loops, with a task left out, or the update before the panels."""
    getrf = getrf or T.getrf_nopiv
    with tg.Graph("lu") as g:
        for k in range(A.nt):
            getrf(A[k, k].rw if getrf is T.getrf_nopiv else A[k, k].r)

            def panels(k=k):
                for j in range(k + 1, A.nt):
                    T.trsm_lower_unit(A[k, k].r, A[k, j].rw)
                for i in range(k + 1, A.mt):
                    T.trsm_upper_right(A[k, k].r, A[i, k].rw)

            if order == "right":
                panels()
            for i in range(k + 1, A.mt):
                for j in range(k + 1, A.nt):
                    if (k, i, j) != skip:
                        T.gemm_nn(A[i, k].r, A[k, j].r, A[i, j].rw)
            if order != "right":
                panels()
    return g


def only(fb: Feedback, kind: str):
    found = [f for f in fb.findings if f.kind == kind]
    assert found, f"no {kind} finding in:\n{fb}"
    assert all(f.hint for f in found if not f.message.startswith("...")), str(fb)
    return found


def test_a_missing_task_is_named_with_the_call_to_add():
    fb = tg.teach.check_lu(lambda A: lu_with(A, skip=(0, 3, 3)))
    assert not fb.ok
    (f,) = only(fb, "missing-task")
    assert "gemm_nn(A[3,0].r, A[0,3].r, A[3,3].rw)" in f.message + f.hint
    (num,) = only(fb, "numeric")
    assert fb.worst_tile == "A[3,3]" and "A[3,3]" in num.message


def test_a_wrong_mark_at_the_call_is_an_access_finding():
    def lu(A):
        with tg.Graph() as g:
            T.getrf_nopiv(A[0, 0].r)
        return g

    fb = tg.teach.check_lu(lu)
    (f,) = only(fb, "access")
    assert "getrf_nopiv" in f.message and ".rw" in f.hint
    assert fb.error is None, "a graph that cannot be built is not run"


def test_a_kernel_declared_with_a_wrong_mode_misses_dependencies():
    bad = tg.kernel(T.getrf_nopiv.fn, modes="r", dims="nn", name="getrf_nopiv")
    fb = tg.teach.check_lu(lambda A: lu_with(A, getrf=bad))
    access = only(fb, "access")
    assert "marks A[0,0] (argument 1) as .r" in access[0].message
    assert "mark it .rw" in access[0].hint
    missing = only(fb, "missing-dependency")
    assert "reads A[0,0] before getrf_nopiv(A[0,0]) wrote it" in missing[0].message
    assert "must mark A[0,0] as .rw" in missing[0].hint


def test_a_needless_dependency_names_the_add_dependency_to_remove(sol):
    def lu(A):
        g = sol["lu"](A)
        g.add_dependency(1, 4)  # two panel solves of step 0: independent
        return g

    fb = tg.teach.check_lu(lu)
    (f,) = only(fb, "needless-dependency")
    assert f"remove g.add_dependency({fb.graph.label(1)}, {fb.graph.label(4)})" in f.hint
    assert fb.error is not None and fb.error < fb.tolerance, "the numbers are still right"
    assert not fb.ok


def test_a_cycle_is_named_and_not_run(sol):
    def lu(A):
        g = sol["lu"](A)
        g.add_dependency(g.ntasks - 1, 0)
        return g

    fb = tg.teach.check_lu(lu)
    (f,) = only(fb, "cycle")
    assert "getrf_nopiv(A[0,0])" in f.message and "getrf_nopiv(A[3,3])" in f.message
    assert "remove g.add_dependency(getrf_nopiv(A[3,3]), getrf_nopiv(A[0,0]))" in f.hint
    assert fb.error is None and fb.run is None


def test_calls_in_the_wrong_order_are_order_findings_and_wrong_numbers():
    fb = tg.teach.check_lu(lambda A: lu_with(A, order="update-first"))
    order = only(fb, "order")
    assert "reads A[0,1] before trsm_lower_unit(A[0,0], A[0,1]) wrote it" in order[0].message
    assert order[0].hint.startswith("call trsm_lower_unit(A[0,0], A[0,1]) before")
    only(fb, "numeric")
    assert sum(f.count for f in fb.errors()) > len(fb.errors()), "the rest are summarised"


def test_update_order_within_a_tile_is_free():
    """Left-looking, with each tile's updates in reverse: the gemm_nn updates commute."""

    def lu(A):
        def update(i, j):
            for kk in reversed(range(min(i, j))):
                T.gemm_nn(A[i, kk].r, A[kk, j].r, A[i, j].rw)

        with tg.Graph() as g:
            for k in range(A.nt):
                update(k, k)
                T.getrf_nopiv(A[k, k].rw)
                for j in range(k + 1, A.nt):
                    update(k, j)
                    T.trsm_lower_unit(A[k, k].r, A[k, j].rw)
                for i in range(k + 1, A.mt):
                    update(i, k)
                    T.trsm_upper_right(A[k, k].r, A[i, k].rw)
        return g

    fb = tg.teach.check_lu(lu)
    assert fb.ok, str(fb)


def test_jacobi_stub_and_wrong_marks(sol):
    def stub(U, V, steps):
        with tg.Graph() as g:
            src, dst = U, V
            for _ in range(steps):
                for i in range(U.mt):
                    for j in range(U.nt):
                        c = src[i, j]
                        T.jacobi_step(c.r, c.r, c.r, c.r, c.r, dst[i, j].w)
                src, dst = dst, src
        return g

    fb = tg.teach.check_jacobi(stub)
    wrong = only(fb, "wrong-tiles")
    assert "jacobi_step(U[0,0].r, U[3,0].r, U[1,0].r, U[0,3].r, U[0,1].r, V[0,0].w)" in (
        wrong[0].hint
    )
    only(fb, "numeric")

    def rw(U, V, steps):
        with tg.Graph() as g:
            T.jacobi_step(U[0, 0].r, U[1, 0].r, U[1, 0].r, U[0, 1].r, U[0, 1].r, V[0, 0].rw)
        return g

    (f,) = only(tg.teach.check_jacobi(rw), "access")
    assert "argument 6" in f.message and "mark it .w" in f.hint


def test_other_mistakes_and_misuse():
    def raises(A):
        return A[9, 9]

    fb = tg.teach.check_lu(raises)
    (f,) = only(fb, "build")
    assert "out of range" in f.message

    def crashes(A):
        raise ZeroDivisionError("oops")

    (f,) = only(tg.teach.check_lu(crashes), "build")
    assert "ZeroDivisionError: oops" in f.message and "line" in f.message
    (f,) = only(tg.teach.check_lu(lambda A: None), "build")
    assert "return g" in f.hint

    def own_matrix(A):
        B = tg.TiledMatrix.zeros(A.shape, A.tile, name="B")
        with tg.Graph() as g:
            T.getrf_nopiv(B[0, 0].rw)
        return g

    fb = tg.teach.check_lu(own_matrix)
    assert "use the matrices your function is given" in only(fb, "build")[0].hint
    with pytest.raises(ExerciseError, match="problem"):
        fb.raise_for_errors()
    assert "<li>" in fb._repr_html_() and "hint:" in str(fb)

    with pytest.raises(TypeError, match="pass the function"):
        tg.teach.check_lu(tg.Graph())
    with pytest.raises(ValueError, match="even"):
        tg.teach.check_jacobi(lambda U, V, s: tg.Graph(), steps=3)


# -- the notebook, headless on two engines ------------------------------------------------

SOLUTION_CELL = f"""
import runpy
_sol = runpy.run_path({str(SOLUTIONS)!r})
for _check, _fn in ((tg.teach.check_lu, _sol["lu"]), (tg.teach.check_jacobi, _sol["jacobi"])):
    _fb = _check(_fn, cluster=cluster)
    print("SOLUTION", _fb)
    assert _fb.ok and _fb.ranks == 2, str(_fb)
"""


def test_notebook_is_stripped_and_generated():
    nbformat = pytest.importorskip("nbformat")
    path = NOTEBOOKS / "05-exercises.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    made = runpy.run_path(str(NOTEBOOKS / "_make_05.py"))["build"]()
    assert made == nb, "run `python notebooks/_make_05.py`"
    assert "cluster = tg.Cluster(n=2)" in nb.cells[1].source
    assert nb.cells[-1].source == "cluster.close()"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_notebook_runs_headless_with_stubs_then_solutions(tmp_path, monkeypatch):
    """Stub answers give findings (and no exception); the solutions pass on 2 engines."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    marker = uuid.uuid4().hex
    monkeypatch.setenv("TASKGRAPH_TEST_JOB", marker)  # inherited by kernel and engines
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    copy = tmp_path / "05-exercises.ipynb"
    shutil.copy(NOTEBOOKS / "05-exercises.ipynb", copy)
    nb = nbformat.read(copy, as_version=4)
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(SOLUTION_CELL))
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / "executed.ipynb")
        assert_none_left(marker)
    print(f"05-exercises with solutions: {time.perf_counter() - t0:.1f} s")
    text = ""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text += out.get("text", "") + out.get("data", {}).get("text/plain", "")
    assert "LU without pivoting:" in text and "problems to fix (" in text
    assert "[missing-task]" in text and "[wrong-tiles]" in text
    assert text.count("SOLUTION") == 2 and text.count("passed ✓") == 2, text
    assert "2 ranks" in text
