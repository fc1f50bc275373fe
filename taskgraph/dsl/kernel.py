"""Tile kernels: functions on tiles that a graph can record as tasks.

A kernel is a plain function on NumPy arrays (usually a numba ``njit(nogil=True)``
function, or a thin wrapper around one: declare that with ``nogil=True``, since only a
numba function itself is recognised as running without the GIL) together with a
declaration of how it uses each argument::

    @tg.kernel(modes="r,rw", dims="mk,mk", flops=lambda m, k: 2 * m * k)
    def axpy(x, y):
        y += 2.0 * x

``modes`` says which arguments are read, written or both; the marks at a call site
(``A[i, j].rw``, ``tg.rw(y)``) must agree with it. An argument declared ``scalar``
(or ``int``, ``float``) takes a number or a small tuple of numbers, passed to the
function as it is: ``modes="rw,scalar"``, ``dims="mn,"``. ``dims`` names each
argument's dimensions with one letter per axis (``""`` for a scalar): equal letters
must have equal sizes, which the graph checks when the task is recorded. ``dtypes``
lists the allowed dtypes (all array arguments share one). ``flops`` gives the cost
used for priorities and GFLOP/s.

Called on NumPy arrays outside a graph, a kernel simply runs. Called on tile
accesses inside ``with tg.Graph():``, it records a task.
"""

from __future__ import annotations

import inspect
import textwrap
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..core.errors import GraphError
from . import builder as recording
from .access import Access, Mode
from .datadeps import Data
from .nested import describe
from .tasks import check_timeout


class Kernel:
    """A tile function with declared access modes, shapes, dtypes and cost.

    Made by :func:`kernel`, or directly with the same parameters. Called on marked
    tiles inside ``with tg.Graph():`` it records a task; called on NumPy arrays outside
    a graph it runs at once; called on plain arrays inside a graph it raises
    :class:`GraphError` (the call would run now and record nothing).
    """

    def __init__(
        self,
        fn: Callable,
        *,
        modes: str | Sequence,
        name: str | None = None,
        dims: str | Sequence[str] | None = None,
        dtypes: Sequence | None = None,
        flops: Callable[..., float] | None = None,
        compile: Callable[[np.dtype], None] | None = None,
        nogil: bool | None = None,
        timeout: float | None = None,
    ):
        self.fn = fn
        # whether a call runs without the GIL (then two workers of a rank overlap even
        # short tasks): said by the caller, else a numba function compiled nogil=True
        self.nogil = releases_gil(fn) if nogil is None else bool(nogil)
        self.name: str = name or str(getattr(fn, "__name__", "kernel"))
        # per argument: its Mode, or None for a scalar (then ``scalars`` says which kind)
        self.modes, self.scalars = _parse_modes(self.name, modes)
        if isinstance(dims, str):
            dims = tuple(d.strip() for d in dims.split(","))
        self.dims: tuple[str, ...] | None = tuple(dims) if dims is not None else None
        if self.dims is not None and len(self.dims) != len(self.modes):
            raise ValueError(
                f"kernel {self.name}: {len(self.modes)} modes but {len(self.dims)} dims"
            )
        for i, (kind, spec) in enumerate(zip(self.scalars, self.dims or ())):
            if kind and spec:
                raise ValueError(
                    f"kernel {self.name}: argument {i + 1} is {_AN[kind]}: its dims entry must be "
                    f"'', not {spec!r}"
                )
        self.dtypes = tuple(np.dtype(d) for d in dtypes) if dtypes else None
        self.flops_fn = flops
        # (mode, shape, dtype) per argument -> (problem or "", flops): see Graph
        self.signatures: dict[tuple, tuple[str, float]] = {}
        self._compile = compile
        # seconds a task of this kernel may run before the run fails naming it
        self.timeout = check_timeout(timeout, f"kernel {self.name}")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = self.name

    def __repr__(self) -> str:
        marks = ",".join(m.mark if m is not None else k for m, k in zip(self.modes, self.scalars))
        return f"<kernel {self.name}({marks})>"

    def __call__(self, *args):
        if args and args[0].__class__ is Access:  # the common case when recording
            return recording.current(self.name).add_kernel_task(self, args)
        for a in args:
            if isinstance(a, Access | Data) or hasattr(a, "matrix"):
                return recording.current(self.name).add_kernel_task(self, args)
        if recording.active() is not None:
            self._refuse_in_graph(args)
        return self.fn(*args)

    def _refuse_in_graph(self, args) -> None:
        shown = ", ".join(describe(a) for a in args)
        raise GraphError(
            f"kernel call {self.name}({shown}) inside `with tg.Graph():` would run at once "
            "and record no task: its arrays are not marked. Mark them (tg.r(x), tg.w(x), "
            "tg.rw(x)) or pass marked tiles (A[i, j].rw), or call the kernel outside the graph"
        )

    # -- pure checks, used when a task is recorded -------------------------------------

    def check(self, modes: Sequence[Mode | None], shapes: Sequence[tuple], dtypes: Sequence) -> str:
        """ "" if arguments of these ``modes``, ``shapes`` and ``dtypes`` (one each per
        argument) fit the declaration, else what is wrong.

        A scalar argument is given as mode None, shape ``()`` and its type as dtype
        (a scalar tuple: the tuple of its items' types); its value is not checked."""
        if len(modes) != len(self.modes):
            what = "arguments" if any(self.scalars) else "tiles"
            return f"{self.name} takes {len(self.modes)} {what}, got {len(modes)}"
        for i, (given, declared) in enumerate(zip(modes, self.modes)):
            problem = self._check_one(i, given, declared, dtypes[i])
            if problem:
                return problem
        kinds = {np.dtype(d) for d, m in zip(dtypes, modes) if m is not None}
        if len(kinds) > 1:
            names = ", ".join(str(np.dtype(d)) for d in dtypes)
            return f"{self.name} needs tiles of one dtype, got {names}"
        if self.dtypes and kinds and next(iter(kinds)) not in self.dtypes:
            allowed = " or ".join(str(d) for d in self.dtypes)
            return f"{self.name} works on {allowed}, not {next(iter(kinds))}"
        if self.dims is not None:
            return _check_dims(self.name, self.dims, shapes)
        return ""

    def _check_one(self, i: int, given: Mode | None, declared: Mode | None, kind) -> str:
        """What is wrong with argument ``i`` (mode ``given``, dtype or scalar type
        ``kind``) where ``declared`` is expected; "" if nothing."""
        if declared is None:
            scalar = self.scalars[i]
            if given is not None:
                return (
                    f"argument {i + 1} of {self.name} is {_AN[scalar]}, but a marked array or "
                    "tile was given: pass the number itself"
                )
            if not _scalar_fits(scalar, kind):
                wanted = _A[scalar]
                return f"argument {i + 1} of {self.name} must be {wanted}, not {_type_name(kind)}"
            return ""
        verb = {Mode.R: "reads", Mode.W: "writes", Mode.RW: "reads and writes"}[declared]
        if given is None:
            return (
                f"argument {i + 1} of {self.name} is data it {verb}, but {_type_name(kind)} was "
                f"given: pass a marked array or tile (tg.{declared.mark}(x), "
                f"A[i, j].{declared.mark})"
            )
        if given != declared:
            return (
                f"argument {i + 1} is marked .{given.mark} but {self.name} {verb} it: "
                f"mark it .{declared.mark}"
            )
        return ""

    def sizes(self, shapes: Sequence[tuple]) -> dict[str, int]:
        """The size of every named dimension, from the arguments' ``shapes``, e.g.
        ``{"m": 512, "k": 256}``."""
        out: dict[str, int] = {}
        for spec, shape in zip(self.dims or (), shapes):
            for letter, size in zip(spec, shape):
                out.setdefault(letter, size)
        return out

    def cost(self, shapes: Sequence[tuple]) -> float:
        """Floating-point operations of one call on tiles of these ``shapes`` (1.0 when
        undeclared)."""
        if self.flops_fn is None:
            return 1.0
        return float(self.flops_fn(**self.sizes(shapes)))

    def compile(self, dtypes: Sequence = (np.float64,)) -> float:
        """Compile the kernel for these dtypes now; return the seconds it took."""
        t0 = time.perf_counter()
        if self._compile is not None:
            for dt in dtypes:
                self._compile(np.dtype(dt))
        return time.perf_counter() - t0


_SCALAR_KINDS = ("scalar", "int", "float")
_A = {"scalar": "a number or a tuple of numbers", "int": "an int", "float": "a float"}
_AN = {"scalar": "a scalar", "int": "an int", "float": "a float"}


def _parse_modes(name: str, spec: str | Sequence) -> tuple[tuple, tuple]:
    """(a Mode or None per argument, the scalar kind or "" per argument) of ``spec``."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    modes: list[Mode | None] = []
    kinds: list[str] = []
    for p in parts:
        text = p.strip().lower() if isinstance(p, str) else p
        if text in _SCALAR_KINDS:
            modes.append(None)
            kinds.append(text)
        else:
            try:
                modes.append(p if isinstance(p, Mode) else Mode.parse(p))
            except ValueError as e:
                raise ValueError(f"kernel {name}: {e}, or 'scalar', 'int', 'float'") from None
            kinds.append("")
    return tuple(modes), tuple(kinds)


def _scalar_fits(scalar: str, kind) -> bool:
    """Whether a scalar of type ``kind`` (a tuple: of items of these types) fits a
    parameter declared ``scalar``, ``int`` or ``float``."""
    if scalar == "scalar":
        return True
    if isinstance(kind, tuple) or not isinstance(kind, type):
        return False
    if issubclass(kind, int | np.integer | np.bool_):
        return True  # (an int is a fine float)
    return scalar == "float" and issubclass(kind, float | np.floating)


def _type_name(kind) -> str:
    if isinstance(kind, tuple):
        return "a tuple of " + ", ".join(k.__name__ for k in kind)
    if isinstance(kind, type):
        return f"a {kind.__name__}"
    return f"{np.dtype(kind)} data"


def releases_gil(fn: Callable) -> bool:
    """Whether ``fn`` is a numba function compiled with ``nogil=True`` in nopython mode
    (it runs without the GIL); False for anything else, which may hold it.

    A Python function is never one, even one that ``functools.wraps`` a numba function
    (it copies the jitted function's ``targetoptions`` along with its name): its own
    code runs with the GIL, so it says so with ``nogil=True`` if its work does not."""
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return False
    options = getattr(fn, "targetoptions", None)
    return (
        isinstance(options, dict)
        and bool(options.get("nogil", False))
        and not options.get("forceobj", False)
    )


def _check_dims(name: str, dims: Sequence[str], shapes: Sequence[tuple]) -> str:
    sizes: dict[str, tuple[int, int]] = {}
    for i, (spec, shape) in enumerate(zip(dims, shapes)):
        if len(spec) != len(shape):
            return f"argument {i + 1} of {name} must have {len(spec)} dimensions, has shape {shape}"
        for letter, size in zip(spec, shape):
            if letter in sizes and sizes[letter][0] != size:
                first_size, first_arg = sizes[letter]
                return (
                    f"argument {i + 1} of {name} has shape {shape} but dimension '{letter}' is "
                    f"{first_size} from argument {first_arg}"
                )
            sizes.setdefault(letter, (size, i + 1))
    return ""


def kernel(
    fn: Callable | None = None,
    *,
    modes: str | Sequence,
    name: str | None = None,
    dims: str | Sequence[str] | None = None,
    dtypes: Sequence | None = None,
    flops: Callable[..., float] | None = None,
    compile: Callable[[np.dtype], None] | None = None,
    nogil: bool | None = None,
    timeout: float | None = None,
):
    """Declare a tile kernel; usable as ``@kernel(modes=...)`` or ``kernel(fn, modes=...)``."""

    def wrap(f: Callable) -> Kernel:
        return Kernel(
            f,
            modes=modes,
            name=name,
            dims=dims,
            dtypes=dtypes,
            flops=flops,
            compile=compile,
            nogil=nogil,
            timeout=timeout,
        )

    return wrap(fn) if fn is not None else wrap


_PARAMETERS = """
Parameters
----------
fn:
    The function on NumPy tiles (often a numba ``njit(nogil=True)`` function).
modes:
    How it uses each argument, ``"r,rw"`` or ``("r", "rw")``: read, write or both;
    ``scalar`` (or ``int``, ``float``) for a number or a small tuple of numbers,
    passed to the function as it is. The marks at a call site (``A[i, j].rw``,
    ``tg.rw(x)``) must agree.
name:
    The name in labels and traces (default: the function's).
dims:
    One letter per axis of each argument, ``"mk,nk,mn"``: equal letters must have
    equal sizes, checked when a task is recorded. A scalar's entry is ``""``.
dtypes:
    The dtypes it accepts (all tile arguments of a call share one).
flops:
    ``flops(**sizes)``, the cost of one call from the sizes named in ``dims`` (and
    nothing else: not the scalars); used for priorities and GFLOP/s (default 1.0).
compile:
    ``compile(dtype)`` compiles it ahead for a dtype (see :meth:`Kernel.compile`).
nogil:
    Whether the function runs without the GIL (default: True for a numba function
    compiled with ``nogil=True``, else False). A rank's workers share short tasks
    only when they do (see :func:`taskgraph.run.executor.short_task_limit`).
timeout:
    Seconds one of its tasks may run before the run fails naming it (None: the
    run's ``task_timeout``).
"""
# one text for both: ``tg.kernel?`` and ``tg.Kernel?`` show the same parameters
Kernel.__doc__ = (Kernel.__doc__ or "").rstrip() + "\n" + textwrap.indent(_PARAMETERS, "    ")
kernel.__doc__ = (kernel.__doc__ or "").rstrip() + "\n" + textwrap.indent(_PARAMETERS, "    ")
