"""Tiled Cholesky as a batch job: the same script runs on every rank.

    mpiexec -n 4 python examples/cholesky.py --n 4096 --tile 512
    taskgraph run -n 4 examples/cholesky.py --n 4096 --tile 512
    python examples/cholesky.py                # one rank, no MPI

Inside an MPI job, tg.Cluster() is the ranks of that job; each rank builds the same
graph, plans it (deterministically) and runs its own share.
"""

import argparse

import numpy as np

import taskgraph as tg
from taskgraph.dsl.tiled import spd_dense
from taskgraph.linalg import cholesky, cholesky_residual

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=2048)
p.add_argument("--tile", type=int, default=256)
p.add_argument("--dtype", default="float64")
p.add_argument("--save", help="write the factor L to this .npy file (rank 0)")
args = p.parse_args()

cluster = tg.Cluster()
A = tg.TiledMatrix.random_spd(args.n, tile=args.tile, dtype=args.dtype)

g = cholesky(A)  # the sequential loop with access marks, in taskgraph.linalg

run = cluster.run(g)  # returns at once
run.wait()  # raises, on every rank, if any rank failed
L = A.gather(root=0)  # the whole factor on rank 0, None elsewhere

if cluster.rank == 0:
    L = np.tril(L)
    res = cholesky_residual(spd_dense(args.n, args.tile, args.dtype), L)
    gflops = args.n**3 / 3 / run.seconds / 1e9
    print(
        f"{g}: {cluster.size} ranks x {cluster.workers} workers, {run.seconds:.3f} s, "
        f"{gflops:.1f} GFLOP/s, residual {res:.1e}"
    )
    if args.save:
        np.save(args.save, L)
