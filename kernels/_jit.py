"""Numba inner functions of tile kernels, compiled once per (operation, dtype) on
first use, for the signature the caller gives (no other specialisation mid-run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class Compiled:
    """``jitted[op, dtype name]`` compiled for ``signature(op, dtype)``, on first call.

    ``ready[op]`` maps a dtype to its compiled function: the per-task path looks there
    first (``compiled.ready[op].get(dtype) or compiled(op, dtype)``)."""

    def __init__(self, jitted: dict[tuple[str, str], Any], signature: Callable,
                 dtypes: Sequence[np.dtype]):  # fmt: skip
        self.jitted, self.signature = jitted, signature
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        self.ready: dict[str, dict[np.dtype, Any]] = {op: {} for op, _ in jitted}

    def __call__(self, op: str, dtype: Any = np.float64) -> Any:
        """The compiled function of ``op`` for ``dtype`` (ValueError for another dtype)."""
        dtype = np.dtype(dtype)
        fn = self.ready[op].get(dtype)
        if fn is None:
            if dtype not in self.dtypes:
                *rest, last = [d.name for d in self.dtypes]
                allowed = f"{', '.join(rest)} or {last}" if rest else last
                raise ValueError(f"{op} works on {allowed} tiles, not {dtype}")
            fn = self.jitted[op, dtype.name]
            fn.compile(self.signature(op, dtype))
            fn.disable_compile()
            self.ready[op][dtype] = fn
        return fn
