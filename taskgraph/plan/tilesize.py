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

and picks the b of least T, or rather the largest b whose T is within ``TIE_MARGIN``
of the least: the speeds are measured on a shared machine, and the two best tiles'
estimates were often within 1-4 % of each other, so the least alone flipped between
512 and 1024 from one measurement to the next. Among near-equal estimates the larger
tile has fewer tasks, messages and runs of the scheduler, which ``TASK_OVERHEAD``
only roughly counts, and it ran faster wherever both were timed (n = 8192 on the 2-core
VM, docs/performance.md: float64 1.26 s at 1024 against 1.31-1.32 s at 512 on 1 x 2,
1.36 against 1.45-1.50 on 2 x 1; float32 0.86-0.90 of the peak against 0.78), where the
model had them within 1-4 %. The figures are estimates, not predictions: they rank
the candidates, and :class:`Choice` keeps them so that the demo can say why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..dsl.options import whole

FLOPS = {"gemm": 2.0, "syrk": 1.0, "trsm": 1.0, "potrf": 1.0 / 3.0}  # x b³
TASK_OVERHEAD = 30e-6  # seconds of runtime per task (scheduling, a hop), a rough figure
# estimates this close to the least count as tied (the largest tile wins): one tile's
# estimate moved by up to ~5 % between measurements on the 2-core VM
TIE_MARGIN = 0.05


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
        if ranked and self.tile != ranked[0]:
            parts.append(f"the largest within {TIE_MARGIN:.0%} of the least")
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


def least(estimates: dict[int, float], margin: float = TIE_MARGIN) -> int:
    """The tile of least time in ``estimates`` (tile -> seconds), except that every tile
    within ``margin`` (a fraction) of the least counts as tied, and the largest of those
    wins: near-equal estimates give one answer, whichever of them is lower this time."""
    best = min(estimates.values())
    return max(b for b, t in estimates.items() if t <= best * (1 + margin))


def choose(n: int, cores: int, speeds: dict[int, dict[str, float]], peak: float) -> Choice:
    """The tile of least estimated time among ``speeds`` (tile -> kernel -> GFLOP/s on
    one core), ties within ``TIE_MARGIN`` to the largest (:func:`least`), for n x n on
    ``cores``; ``peak``: the 1-core GEMM peak (GFLOP/s), for the fractions. Tiles
    larger than n are left out (unless none is smaller)."""
    if not speeds:
        raise ValueError("choose: no measured tile sizes")
    for name, v in (("the matrix order n", n), ("cores", cores)):
        if not whole(v, 1):
            raise ValueError(f"choose: {name} must be a positive int (got {v!r})")
    fits = {b: s for b, s in speeds.items() if b <= n} or {min(speeds): speeds[min(speeds)]}
    est = {b: estimate(n, b, cores, s) for b, s in fits.items()}
    flops = n**3 / 3
    frac = {b: flops / t / 1e9 / (peak * max(1, cores)) for b, t in est.items()}
    return Choice(n, cores, least(est), est, frac)
