"""The exercises: reference graphs, NumPy references, and the checkers.

A checker calls the student's function on fresh small matrices, compares the graph
with its reference (:func:`taskgraph.teach.compare.compare`), runs it (in this
process, or on the cluster it is given), and compares the numbers with NumPy.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import numpy as np

from ..cluster.job import current_cluster
from ..core import config
from ..core.errors import GraphError, TaskgraphError
from ..dsl.graph import Graph
from ..dsl.tiled import TiledMatrix
from ..linalg import lu_nopiv
from .compare import compare
from .feedback import Feedback, Finding


def reference_lu(A, name: str = "lu-reference") -> Graph:
    """Right-looking tiled LU without pivoting of A (in place: unit L below, U above):
    :func:`taskgraph.linalg.lu_nopiv`."""
    return lu_nopiv(A, name=name)


def reference_jacobi(U, V, steps: int, name: str = "jacobi-reference") -> Graph:
    """``steps`` Jacobi sweeps on a periodic grid, U -> V -> U ... (ping-pong)."""
    from taskgraph.kernels.teaching import jacobi_step

    mt, nt = U.mt, U.nt
    with Graph(name) as g:
        src, dst = U, V
        for _ in range(steps):
            for i in range(mt):
                for j in range(nt):
                    jacobi_step(
                        src[i, j].r,
                        src[(i - 1) % mt, j].r,
                        src[(i + 1) % mt, j].r,
                        src[i, (j - 1) % nt].r,
                        src[i, (j + 1) % nt].r,
                        dst[i, j].w,
                    )
            src, dst = dst, src
    return g


def lu_nopiv_numpy(a: np.ndarray) -> np.ndarray:
    """LU without pivoting in float64, unblocked: L (unit, below) and U in one array."""
    f = np.array(a, dtype=np.float64)
    for k in range(f.shape[0] - 1):
        f[k + 1 :, k] /= f[k, k]
        f[k + 1 :, k + 1 :] -= np.outer(f[k + 1 :, k], f[k, k + 1 :])
    return f


def jacobi_numpy(u: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` Jacobi sweeps of the 5-point average on a periodic grid, in float64."""
    u = np.array(u, dtype=np.float64)
    for _ in range(steps):
        u = 0.25 * (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1))
    return u


# -- the checkers -------------------------------------------------------------------------


def check_lu(
    lu: Callable,
    *,
    n: int | None = None,
    tile: int | None = None,
    cluster=None,
    dtype=np.float64,
    seed: int = 0,
    timeout: float = 60,
) -> Feedback:
    """Check ``lu(A) -> Graph``, a tiled LU without pivoting of A in place.

    The checker makes a random diagonally dominant n x n matrix (``TASKGRAPH_QUICK=1``:
    64 with tiles of 16; else 192 with tiles of 32) on ``cluster`` (this process when
    None), builds and runs the student's graph, and compares graph and numbers with
    :func:`reference_lu` and :func:`lu_nopiv_numpy`.
    """
    _check_callable(lu, "lu")
    n, tile = _sizes(n, tile, quick=(64, 16), full=(192, 32))
    cluster = _cluster(cluster)
    rng = np.random.default_rng(seed)
    a = (rng.random((n, n)) + n * np.eye(n)).astype(dtype)
    A = TiledMatrix.from_numpy(a, tile=tile, name="A", cluster=cluster)
    fb = Feedback("LU without pivoting", ranks=cluster.size)
    g = _build(fb, lu, (A,), [A])
    if g is None:
        return fb
    fb.findings += compare(g, reference_lu(A), commuting=("gemm_nn",))
    if _run(fb, cluster, g, timeout):
        expected = lu_nopiv_numpy(a)
        _numbers(fb, A, _collect(A), expected, _tolerance(dtype, n))
    return fb


def check_jacobi(
    jacobi: Callable,
    *,
    n: int | None = None,
    tile: int | None = None,
    steps: int | None = None,
    cluster=None,
    dtype=np.float64,
    seed: int = 0,
    timeout: float = 60,
) -> Feedback:
    """Check ``jacobi(U, V, steps) -> Graph``: ``steps`` sweeps, ping-pong between U and V.

    ``steps`` is even, so the answer is back in U. The grid is periodic (it wraps
    around); ``TASKGRAPH_QUICK=1``: 64 x 64 in tiles of 16, 4 steps; else 128 x 128
    in tiles of 32, 6 steps.
    """
    _check_callable(jacobi, "jacobi")
    n, tile = _sizes(n, tile, quick=(64, 16), full=(128, 32))
    steps = steps if steps is not None else (4 if config.quick() else 6)
    if steps < 2 or steps % 2:
        raise ValueError(f"steps must be even and at least 2 (the answer is in U), not {steps}")
    cluster = _cluster(cluster)
    u = np.random.default_rng(seed).random((n, n)).astype(dtype)
    U = TiledMatrix.from_numpy(u, tile=tile, name="U", cluster=cluster)
    V = TiledMatrix.zeros((n, n), tile, dtype, name="V", cluster=cluster)
    fb = Feedback("2-D Jacobi with halo exchange", ranks=cluster.size)
    g = _build(fb, jacobi, (U, V, steps), [U, V])
    if g is None:
        return fb
    fb.findings += compare(g, reference_jacobi(U, V, steps))
    if _run(fb, cluster, g, timeout):
        _numbers(fb, U, _collect(U), jacobi_numpy(u, steps), 50 * float(np.finfo(dtype).eps))
    return fb


def _check_callable(fn, what: str) -> None:
    if not callable(fn) or isinstance(fn, Graph):
        raise TypeError(
            f"pass the function that builds the graph (check_{what}({what})), "
            f"not {type(fn).__name__}"
        )


def _sizes(n, tile, *, quick, full) -> tuple[int, int]:
    dn, dt = quick if config.quick() else full
    n, tile = n or dn, tile or dt
    if n < 1 or tile < 1:
        raise ValueError(f"n ({n}) and tile ({tile}) must be positive")
    return n, tile


def _cluster(cluster):
    return cluster if cluster is not None else current_cluster()


def _tolerance(dtype, n: int) -> float:
    return 100 * n * float(np.finfo(dtype).eps)


def _collect(M) -> np.ndarray:
    out = M.gather() if M.remote else M.to_numpy()
    assert out is not None
    return out


def _build(fb: Feedback, fn: Callable, args: tuple, matrices: list) -> Graph | None:
    """Call the student's function; turn whatever goes wrong into findings."""
    name = getattr(fn, "__name__", "your function")
    try:
        g = fn(*args)
    except GraphError as exc:
        fb.findings.append(_graph_error(str(exc)))
        return None
    except Exception as exc:  # noqa: BLE001 - a bug in an answer is feedback, not a crash
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
        fb.findings.append(
            Finding(
                "build",
                f"{name}() raised {type(exc).__name__}: {exc}{where}",
                "fix this error first; the checker calls your function on fresh matrices",
            )
        )
        return None
    if not isinstance(g, Graph):
        fb.findings.append(
            Finding(
                "build",
                f"{name}() returned {type(g).__name__}, not a tg.Graph",
                "build the tasks inside `with tg.Graph() as g:` and end with `return g`",
            )
        )
        return None
    fb.graph = g
    mine = {m.uid for m in matrices}
    others = [m.name for m in g.matrices() if m.uid not in mine]
    if others:
        given = ", ".join(m.name for m in matrices)
        fb.findings.append(
            Finding(
                "build",
                f"your graph works on matrix {', '.join(others)}, not only on {given}",
                f"use the matrices your function is given ({given}); do not make new ones",
            )
        )
    return g


def _graph_error(text: str) -> Finding:
    if "is marked ." in text:
        fix = text.rsplit(": ", 1)[-1]
        return Finding(
            "access",
            text,
            f"{fix}: a kernel declares how it uses each tile, and the marks at the call "
            "(.r, .w, .rw) must agree with it",
        )
    return Finding("build", text, "the graph could not be built: fix the call it names")


def _run(fb: Feedback, cluster, g: Graph, timeout: float) -> bool:
    """Run the student's graph unless it cannot run; False if it did not run to the end."""
    if any(f.kind in ("cycle", "build") for f in fb.findings):
        return False
    try:
        run = cluster.run(g)
    except TaskgraphError as exc:
        fb.findings.append(Finding("run", f"the graph cannot run: {exc}", "fix the graph first"))
        return False
    fb.run = run
    try:
        run.wait(timeout)
    except TimeoutError:
        run.cancel()
        fb.findings.append(Finding("run", f"the run took longer than {timeout} s", "was it stuck?"))
        return False
    except TaskgraphError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fb.findings.append(
            Finding("run", f"a task failed: {first}", "the task named here raised; see its error")
        )
        return False
    return True


def _numbers(fb: Feedback, M, got: np.ndarray, expected: np.ndarray, tol: float) -> None:
    scale = float(np.linalg.norm(expected)) or 1.0
    worst, where = -1.0, (0, 0)
    for i in range(M.mt):
        for j in range(M.nt):
            diff = M.block(got, i, j).astype(np.float64) - M.block(expected, i, j)
            e = float(np.linalg.norm(diff)) / scale
            if not np.isfinite(e):
                e = np.inf
            if e > worst:
                worst, where = e, (i, j)
    fb.error, fb.tolerance = worst, tol
    fb.worst_tile = f"{M.name}[{where[0]},{where[1]}]"
    if worst > tol:
        structural = [f for f in fb.errors() if f.kind not in ("numeric",)]
        hint = (
            "fix the findings above first: they explain the numbers"
            if structural
            else f"look at the tasks that write {fb.worst_tile}, and at the order of your loops"
        )
        fb.findings.append(
            Finding(
                "numeric",
                f"the result differs from NumPy's: relative error {worst:.2e} > {tol:.1e}, "
                f"largest in tile {fb.worst_tile}",
                hint,
            )
        )
