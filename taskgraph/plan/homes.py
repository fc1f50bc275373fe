"""Home ranks of plain data (arrays and objects marked with ``tg.r/w/rw``).

A datum the user did not pin (``tg.Data(x, rank=...)``) gets the rank that holds the
fewest bytes so far, largest data first (the classic greedy for balancing sizes), so
that independent chains of tasks on different arrays spread over the ranks. Pure and
deterministic: every rank computes the same homes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import PlanError


def choose_homes(
    sizes: Sequence[int],
    pinned: Sequence[int | None],
    nranks: int,
    names: Sequence[str] | None = None,
) -> list[int]:
    """A home rank per datum.

    sizes:
        Each datum's size in bytes.
    pinned:
        Each datum's pinned rank, or None where the planner chooses.
    nranks:
        The number of ranks (at least 1).
    names:
        Each datum's name, for the error a pinned rank out of range raises
        (default ``datum <index>``).

    Pinned data keep their rank (and count towards its load); the others go, largest
    first (ties by index), to the least-loaded rank (ties: the lowest rank).
    PlanError if a pinned rank is not in ``range(nranks)``.
    """
    if len(pinned) != len(sizes):
        raise ValueError(f"{len(sizes)} sizes but {len(pinned)} pinned ranks")
    if nranks < 1:
        raise PlanError(f"cannot place data on {nranks} ranks")
    load = [0] * nranks
    homes: list[int] = [-1] * len(sizes)
    for i, rank in enumerate(pinned):
        if rank is None:
            continue
        if not 0 <= rank < nranks:
            name = names[i] if names is not None else f"datum {i}"
            raise PlanError(
                f"{name} is pinned to rank {rank}, but the run has ranks 0..{nranks - 1}"
            )
        homes[i] = rank
        load[rank] += int(sizes[i])
    free = sorted((i for i, r in enumerate(pinned) if r is None), key=lambda i: (-sizes[i], i))
    for i in free:
        rank = min(range(nranks), key=lambda r: (load[r], r))
        homes[i] = rank
        load[rank] += int(sizes[i])
    return homes
