"""Single-copy transfers between ranks of one node (MPICH's cross-memory attach).

MPICH copies a large message through shared-memory cells by default, a chunk each time
both ranks call into MPI; with CMA the receiver reads the sender's buffer in one copy.
:func:`wants_single_copy` decides (a pure function); :func:`enable_single_copy` sets it
before MPI starts in this process, and :func:`single_copy_env` is what launchers pass
to ranks they start.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from ..core import config

CMA_VARS = ("MPIR_CVAR_CH4_CMA_ENABLE", "MPICH_CH4_CMA_ENABLE")  # MPICH's names for it
YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")


def wants_single_copy(setting: bool | None, user_set: bool, yama_scope: str | None, probe) -> bool:
    """Whether to turn on MPICH's single-copy transfers (a pure decision).

    ``setting``: ``TASKGRAPH_CMA`` (None: auto); ``user_set``: the MPI variable is set
    already (then it stands); ``yama_scope``: the kernel's ptrace scope (None: no Yama);
    ``probe``: a call that says whether a process may read memory with
    ``process_vm_readv`` (a seccomp filter may forbid it), made only when needed.
    Ranks are siblings, not parent and child, so any Yama scope but 0 forbids it.
    """
    if user_set or setting is False:
        return False
    if setting is True:
        return True
    return yama_scope in (None, "0") and probe()


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def can_read_memory() -> bool:
    """Whether ``process_vm_readv`` works here: read 16 bytes of this process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return False
    readv.restype = ctypes.c_ssize_t
    src = ctypes.create_string_buffer(b"taskgraph-probe!", 16)
    dst = ctypes.create_string_buffer(16)
    local, remote = _IOVec(ctypes.addressof(dst), 16), _IOVec(ctypes.addressof(src), 16)
    n = readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return n == 16 and dst.raw == src.raw


def yama_scope() -> str | None:
    """The kernel's ptrace scope (Yama), None where there is no Yama."""
    try:
        return YAMA.read_text().strip()
    except OSError:
        return None


def single_copy_env() -> dict[str, str]:
    """The environment that gives ranks started from here single-copy transfers:
    empty where this node forbids them or the user's settings decide."""
    user_set = any(v in os.environ for v in CMA_VARS)
    if wants_single_copy(config.cma(), user_set, yama_scope(), can_read_memory):
        return {CMA_VARS[0]: "1"}
    return {}


def enable_single_copy() -> bool:
    """Before MPI starts in this process: let MPICH move large messages in one copy
    where allowed (other MPI libraries ignore the variable). True if it did."""
    env = single_copy_env()
    os.environ.update(env)
    return bool(env)
