"""Write notebooks/05-exercises.ipynb (outputs stripped) from the cells below.

    python notebooks/_make_05.py

Edit the cells here, not in the notebook, and run this again; the tests check that the
notebook is what this script writes.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

HERE = Path(__file__).parent
NOTEBOOK = HERE / "05-exercises.ipynb"

CELLS: list[tuple[str, str]] = [
    (
        "markdown",
        """# 05 · Exercises: tiled LU and a Jacobi stencil

You write two task graphs; a checker tells you what is wrong and how to fix it.

1. **Tiled LU without pivoting**: four kernels, three nested loops.
2. **A 2-D Jacobi stencil with halo exchange**: neighbours' edges become messages.

Each checker (`tg.teach.check_lu`, `tg.teach.check_jacobi`) calls your function on a
fresh small matrix, compares your graph with its own (the same tasks? the right marks
`.r`/`.w`/`.rw`? no missing and no needless dependencies? no cycle?), runs it on the
cluster, and compares the numbers with NumPy. It answers with findings and **hints**;
a wrong answer never raises, so you can run the whole notebook at any time.

Sizes are small when `TASKGRAPH_QUICK=1` is set (the tests run this notebook that way).""",
    ),
    (
        "code",
        """from taskgraph.kernels.teaching import (
    gemm_nn,
    getrf_nopiv,
    jacobi_step,
    trsm_lower_unit,
    trsm_upper_right,
)

import taskgraph as tg

# what each kernel declares: how it uses each tile (the marks you must write)
for kernel in (getrf_nopiv, trsm_lower_unit, trsm_upper_right, gemm_nn, jacobi_step):
    print(kernel)

cluster = tg.Cluster(n=2)  # two ipyparallel engines, two MPI ranks
cluster""",
    ),
    (
        "markdown",
        """## Exercise 1 · Tiled LU without pivoting

Cut A into tiles `A[i, j]`. Step k of the right-looking algorithm:

| task | kernel call | effect |
| --- | --- | --- |
| diagonal tile | `getrf_nopiv(A[k, k].rw)` | A_kk ← L_kk U_kk (in place) |
| row k of U, j > k | `trsm_lower_unit(A[k, k].r, A[k, j].rw)` | A_kj ← L_kk⁻¹ A_kj |
| column k of L, i > k | `trsm_upper_right(A[k, k].r, A[i, k].rw)` | A_ik ← A_ik U_kk⁻¹ |
| update, i, j > k | `gemm_nn(A[i, k].r, A[k, j].r, A[i, j].rw)` | A_ij ← A_ij − A_ik A_kj |

L is unit lower triangular (its ones are not stored), U upper triangular: both
overwrite A, as LAPACK's `getrf` does.

Write the loops in `lu(A)`. Mark every tile as the kernel uses it: `.r` when it only
reads it, `.rw` when it changes it. The dependencies follow from the marks.""",
    ),
    (
        "code",
        """def lu(A):
    with tg.Graph("lu") as g:
        for k in range(A.nt):
            getrf_nopiv(A[k, k].rw)
            # YOUR CODE HERE: row k of U (trsm_lower_unit), column k of L
            # (trsm_upper_right), then the trailing update (gemm_nn)
    return g


feedback_lu = tg.teach.check_lu(lu, cluster=cluster)
feedback_lu""",
    ),
    (
        "markdown",
        """The run of your graph on the two ranks: a lane per rank and worker, the
messages between the ranks, and the critical path. How much of the time do the ranks
wait for each other?""",
    ),
    (
        "code",
        """if feedback_lu.run is not None:
    feedback_lu.run.show()""",
    ),
    (
        "markdown",
        """## Exercise 2 · Jacobi on a periodic grid, with halo exchange

One Jacobi sweep replaces every point by the mean of its four neighbours. The grid
wraps around (a torus), so every tile `U[i, j]` has four neighbour tiles:
north `U[(i-1) % mt, j]`, south `U[(i+1) % mt, j]`, west `U[i, (j-1) % nt]` and east
`U[i, (j+1) % nt]`. The kernel reads the tile and the edge of each neighbour that
touches it (its *halo*) and writes the new tile into a second matrix:

    jacobi_step(center.r, north.r, south.r, west.r, east.r, out.w)

Sweep from U into V, then from V back into U, and so on (`steps` is even, so the
answer ends in U). When a neighbour lives on the other rank, its tile travels as a
message: that is the halo exchange.""",
    ),
    (
        "code",
        """def jacobi(U, V, steps):
    mt, nt = U.mt, U.nt
    with tg.Graph("jacobi") as g:
        src, dst = U, V
        for _ in range(steps):
            for i in range(mt):
                for j in range(nt):
                    center = src[i, j]
                    # YOUR CODE HERE: the four neighbours of src[i, j] (the grid wraps around)
                    north = south = west = east = center
                    jacobi_step(center.r, north.r, south.r, west.r, east.r, dst[i, j].w)
            src, dst = dst, src
    return g


feedback_jacobi = tg.teach.check_jacobi(jacobi, cluster=cluster)
feedback_jacobi""",
    ),
    (
        "code",
        """if feedback_jacobi.run is not None:
    feedback_jacobi.run.show()""",
    ),
    (
        "markdown",
        """## Going further

* Count the messages: `tg.make_plan(feedback_jacobi.graph, 2)` lists every one. How
  does the number change with the tile size?
* What does `g.add_dependency(a, b)` between two independent tasks do to the
  timeline? Ask the checker.

Close the cluster when you are done:""",
    ),
    ("code", "cluster.close()"),
]


def build() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    nb.cells = [make[kind](source) for kind, source in CELLS]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"ex05-{i:02d}"  # stable ids: the file only changes when a cell does
    return nb


if __name__ == "__main__":
    nbformat.write(build(), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")
