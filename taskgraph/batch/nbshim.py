"""What a script made by ``taskgraph convert`` calls at run time, imported as ``_tgnb``.

The converter (:mod:`taskgraph.batch.convert`) rewrites IPython-only lines of a notebook
into calls of these: ``display``, ``%time``, ``!cmd``, ``%%writefile``, ``%%capture``,
``%run``, and ``tg.Cluster(...)`` as the job's ranks. Rank 0 alone prints.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..cluster.job import JobCluster as job_cluster
from ..core import config
from ..run.comm import world


def _rank() -> int:
    if not config.use_mpi():
        return 0
    return world().rank


def _barrier() -> None:
    if config.use_mpi():
        world().barrier()


def JobCluster(n: int | None = None, **kwargs):
    """``tg.Cluster(...)`` of a converted notebook: :class:`taskgraph.JobCluster`, the
    job's ranks (never engines, even under a plain ``python``)."""
    return job_cluster(n, **kwargs)


def rank0_prints() -> None:
    """Point ``sys.stdout`` of every rank but 0 at ``os.devnull`` (stderr stays)."""
    if _rank() != 0:
        sys.stdout = open(os.devnull, "w")  # open for the life of the process


def display(*objs, **kwargs) -> None:
    """What a notebook shows for each object, in batch: IPython's plain-text form.

    Widgets (a run's live view among them) and None show nothing. Inside a timed
    block (``%time``) the value is shown after the times, as IPython does.
    """
    if _deferred is not None:
        _deferred.extend(objs)
        return
    for obj in objs:
        if obj is None or _is_widget(obj):
            continue
        try:
            from IPython.lib.pretty import pretty

            text = pretty(obj)
        except ImportError:
            text = repr(obj)
        print(text)


def _is_widget(obj) -> bool:
    names = {c.__name__ for c in type(obj).__mro__}
    return bool(names & {"TextView", "RunView", "Widget", "DOMWidget"})


_deferred: list | None = None  # values displayed inside a timed block


@contextmanager
def timed(label: str = "time") -> Iterator[None]:
    """``%time`` in batch: the block's CPU and wall times, printed as IPython does.

    ``%timeit`` runs its statement once: a loop of collective calls whose length
    depended on each rank's clock could hang the job.
    """
    global _deferred
    outer, _deferred = _deferred, []
    t0, wall = os.times(), time.perf_counter()
    try:
        yield
    finally:
        t1, wall = os.times(), time.perf_counter() - wall
        shown, _deferred = _deferred, outer
        user, system = t1.user - t0.user, t1.system - t0.system
        print(f"CPU times: user {_fmt(user)}, sys: {_fmt(system)}, total: {_fmt(user + system)}")
        note = "  (%timeit: one run in batch)" if label == "timeit" else ""
        print(f"Wall time: {_fmt(wall)}{note}")
    display(*shown)


def _fmt(seconds: float) -> str:
    """IPython's format: three significant digits in s, ms, µs or ns."""
    if seconds >= 60:
        return f"{int(seconds // 60)}min {seconds % 60:.0f}s"
    units = [("s", 1.0), ("ms", 1e3), ("µs", 1e6), ("ns", 1e9)]
    order = 0 if seconds >= 1 else 3
    if 0 < seconds < 1:
        order = min((2 - math.floor(math.log10(seconds))) // 3, 3)
    unit, scale = units[order]
    return f"{seconds * scale:.3g} {unit}"


def _expand(cmd: str, depth: int = 2) -> str:
    """IPython's ``$name`` and ``{expr}`` expansion, in the caller's namespace."""
    frame = sys._getframe(depth)
    ns = {**frame.f_globals, **frame.f_locals}
    try:
        from IPython.utils.text import DollarFormatter

        return DollarFormatter().vformat(cmd, args=[], kwargs=ns)
    except Exception:  # noqa: BLE001 - IPython also runs the command unexpanded then
        return cmd


def system(cmd: str, shell: str = "sh") -> int:
    """``!cmd`` in batch: run on rank 0 only, then every rank waits; its exit status."""
    import subprocess

    code = 0
    if _rank() == 0:
        cmd = _expand(cmd) if shell == "sh" and "\n" not in cmd else cmd
        sys.stdout.flush()
        code = subprocess.run([shell, "-c", cmd], check=False).returncode
    _barrier()
    return code


def getoutput(cmd: str) -> list[str]:
    """``x = !cmd`` in batch: the command's output lines, run on every rank."""
    import subprocess

    out = subprocess.run(_expand(cmd), shell=True, capture_output=True, text=True, check=False)
    return out.stdout.splitlines()


def writefile(args: str, body: str) -> None:
    """``%%writefile [-a] name`` in batch: rank 0 writes, every rank waits."""
    words = shlex.split(args)
    append = bool({"-a", "--append"} & set(words))
    name = [w for w in words if not w.startswith("-")][-1]
    if _rank() == 0:
        with open(name, "a" if append else "w") as f:
            f.write(body)
    _barrier()


@contextmanager
def capture() -> Iterator[object]:
    """``%%capture var`` in batch: the block's stdout and stderr, kept in ``var``."""
    from IPython.utils.capture import capture_output

    with capture_output(display=False) as captured:
        yield captured


def run_path(path: str) -> dict:
    """``%run script.py``: run it and return its globals (they join the notebook's)."""
    import runpy

    words = shlex.split(path)
    saved = sys.argv
    sys.argv = words
    try:
        return runpy.run_path(words[0], run_name="__main__")
    finally:
        sys.argv = saved
