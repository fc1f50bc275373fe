"""The tile size of a tiled Cholesky, chosen from measured kernel speeds (pure).

Small tiles give parallelism and a short critical path but slow kernels; large tiles
give fast kernels but few tasks, and the cores wait on the chain
``potrf -> trsm -> syrk -> potrf`` of each step. The model weighs both, for n x n in
tiles of b on P cores (threads running kernels), with each kernel's time from its
measured speed at b (:mod:`taskgraph.calibrate`):

    work  W(b) = nt·potrf + nt(nt−1)/2·(trsm + syrk) + nt(nt−1)(nt−2)/6·gemm
                 + every task's runtime overhead                     (nt = ⌈n / b⌉)
    path  C(b) = nt·(potrf + trsm + syrk)     (one step's chain, every step)
    time  T(b) = W/P + (1 − 1/P)·C            (Brent's bound, with the path's share
                                               that cannot overlap the work)

and picks the b of least T. The figures are estimates, not predictions: they rank
the candidates, and :class:`Choice` keeps them so that the demo can say why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FLOPS = {"gemm": 2.0, "syrk": 1.0, "trsm": 1.0, "potrf": 1.0 / 3.0}  # x b³
TASK_OVERHEAD = 30e-6  # seconds of runtime per task (scheduling, a hop), a rough figure


@dataclass(frozen=True)
class Choice:
    """The tile chosen for n on ``cores``, with every candidate's estimate (seconds)
    and the fraction of the GEMM peak it implies."""

    n: int
    cores: int
    tile: int
    estimates: dict[int, float] = field(default_factory=dict)
    fractions: dict[int, float] = field(default_factory=dict)

    def why(self) -> str:
        """One line: the choice and the runner-up."""
        ranked = sorted(self.estimates, key=self.estimates.__getitem__)
        parts = [f"tile {b}: {self.estimates[b]:.2f} s est." for b in ranked[:3]]
        return f"tile {self.tile} for n={self.n} on {self.cores} cores ({'; '.join(parts)})"


def estimate(n: int, b: int, cores: int, gflops: dict[str, float]) -> float:
    """T(b) of the module doc, in seconds; ``gflops``: each kernel's speed at b."""
    t = {k: FLOPS[k] * b**3 / (gflops[k] * 1e9) for k in FLOPS}
    nt = math.ceil(n / b)
    tasks = nt + nt * (nt - 1) + nt * (nt - 1) * (nt - 2) // 6
    work = (
        nt * t["potrf"]
        + nt * (nt - 1) / 2 * (t["trsm"] + t["syrk"])
        + nt * (nt - 1) * (nt - 2) / 6 * t["gemm"]
        + tasks * TASK_OVERHEAD
    )
    path = nt * (t["potrf"] + t["trsm"] + t["syrk"] + TASK_OVERHEAD)
    p = max(1, cores)
    return work / p + (1 - 1 / p) * path


def choose(n: int, cores: int, speeds: dict[int, dict[str, float]], peak: float) -> Choice:
    """The tile of least estimated time among ``speeds`` (tile -> kernel -> GFLOP/s on
    one core), for n x n on ``cores``; ``peak``: the 1-core GEMM peak (GFLOP/s), for
    the fractions. Tiles larger than n are left out (unless none is smaller)."""
    if not speeds:
        raise ValueError("choose: no measured tile sizes")
    fits = {b: s for b, s in speeds.items() if b <= n} or {min(speeds): speeds[min(speeds)]}
    est = {b: estimate(n, b, cores, s) for b, s in fits.items()}
    flops = n**3 / 3
    frac = {b: flops / t / 1e9 / (peak * max(1, cores)) for b, t in est.items()}
    best = min(est, key=lambda b: (est[b], -b))
    return Choice(n, cores, best, est, frac)
