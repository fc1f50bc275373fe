"""Access modes: how a task uses a piece of data.

A task reads (``.r``), writes (``.w``) or reads and writes (``.rw``) each tile it
touches. The graph infers dependencies from these marks, as in a sequential task
flow: read-after-write, write-after-read and write-after-write.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class Mode(enum.IntFlag):
    """How a task uses a piece of data: ``R`` (read), ``W`` (write), ``RW`` (both)."""

    R = 1
    W = 2
    RW = 3

    @property
    def reads(self) -> bool:
        """Whether a task in this mode reads the data (``R`` or ``RW``)."""
        return bool(self & Mode.R)

    @property
    def writes(self) -> bool:
        """Whether a task in this mode writes the data (``W`` or ``RW``)."""
        return bool(self & Mode.W)

    @property
    def mark(self) -> str:
        """The mark a call site writes for this mode: ``"r"``, ``"w"`` or ``"rw"``."""
        return {Mode.R: "r", Mode.W: "w", Mode.RW: "rw"}[self]

    @classmethod
    def parse(cls, text: str) -> Mode:
        """The mode the mark ``text`` names (``"r"``, ``"w"``, ``"rw"``, any case);
        ValueError else."""
        try:
            return {"r": cls.R, "w": cls.W, "rw": cls.RW}[text.strip().lower()]
        except KeyError:
            raise ValueError(f"unknown access mode {text!r}: use 'r', 'w' or 'rw'") from None


def parse_modes(spec: str | Sequence) -> tuple[Mode, ...]:
    """``"r,rw"`` or ``("r", "rw")`` -> ``(Mode.R, Mode.RW)``."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    return tuple(p if isinstance(p, Mode) else Mode.parse(p) for p in parts)


class Access:
    """A tile together with the way a task uses it (``A[i, j].rw``).

    ``code`` is the mode as a plain int (1, 2, 3): recording a task tests it millions
    of times, and operators on an ``IntFlag`` are Python-level calls.
    """

    __slots__ = ("tile", "mode", "code")

    def __init__(self, tile, mode: Mode, code: int | None = None):
        self.tile = tile
        self.mode = mode
        self.code = int(mode) if code is None else code

    def __repr__(self) -> str:
        return f"{self.tile!r}.{self.mode.mark}"


class Markable:
    """What a task can be marked as using: ``.r`` (read), ``.w`` (overwritten, not
    read) and ``.rw`` (read and written) give its marks, each made once (recording a
    10^6-task graph asks for them millions of times). Tiles and plain data are this."""

    __slots__ = ("_r", "_w", "_rw")

    def forget_marks(self) -> None:
        """Drop the cached marks (each refers back to this handle)."""
        self._r: Access | None = None
        self._w: Access | None = None
        self._rw: Access | None = None

    @property
    def r(self) -> Access:
        """This marked as read by the task (``A[i, j].r``, ``tg.r(x)``)."""
        a = self._r
        if a is None:
            a = self._r = Access(self, Mode.R, 1)
        return a

    @property
    def w(self) -> Access:
        """This marked as overwritten, not read, by the task (``A[i, j].w``)."""
        a = self._w
        if a is None:
            a = self._w = Access(self, Mode.W, 2)
        return a

    @property
    def rw(self) -> Access:
        """This marked as read and written by the task (``A[i, j].rw``)."""
        a = self._rw
        if a is None:
            a = self._rw = Access(self, Mode.RW, 3)
        return a
