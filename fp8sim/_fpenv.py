"""Independence from the caller's floating-point environment.

fp8sim's results are bit patterns, so they must not depend on how the calling thread has set up
its FPU. On x86 that state is the MXCSR register: flush-to-zero (FTZ, bit 15) replaces subnormal
results by zero, denormals-are-zero (DAZ, bit 6) reads subnormal operands as zero, the rounding
control (bits 13-14) picks the rounding of every float operation, and the mask bits (7-12) decide
whether an exception traps. ``torch.set_flush_denormal(True)``, ``-ffast-math`` libraries loaded
into the process and ``fesetround`` change them for the calling thread, and numpy's and numba's
float arithmetic then follows them: under FTZ/DAZ ``2**-126 * 0.5`` is 0.

One mechanism keeps every computation in the IEEE default environment (round to nearest even,
subnormals kept, every exception masked), whatever the caller left, and gives the caller back its
own environment afterwards (the sticky exception flags raised meanwhile are kept):

* :func:`enter` / :func:`leave`, callable from numba code: set the default environment and
  return the previous one; put the previous one back. They read and write MXCSR with the LLVM
  intrinsics ``llvm.x86.sse.stmxcsr`` / ``llvm.x86.sse.ldmxcsr``.
* :func:`ieee_env` (a context manager) and :func:`ieee_defaults` (a decorator): the same around
  Python code on the calling thread. fp8sim's public functions are wrapped with the decorator, so
  their numpy arithmetic and their serial numba kernels run in the default environment.
* numba's worker threads have their own MXCSR (a thread copies its creator's when it is created,
  so a pool started under FTZ keeps FTZ). Every ``prange`` loop body of fp8sim that computes with
  floats therefore starts with ``fe = enter()`` and ends with ``leave(fe)``: on the calling thread
  this is free of effect (the guard has already set the default), on a worker it sets the default
  for the body and restores the worker's own state afterwards. Loops over single elements are run
  as chunks of elements, so the two register writes cost nothing measurable.

Other processors: on anything but x86 the functions do nothing (the choice is made when the code is
compiled, so importing fp8sim works everywhere). On AArch64 the flush-to-zero bit FPCR.FZ has the
same effect as FTZ/DAZ and is not cleared here: leave it off there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import llvmlite.binding as _llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "X86",
    "DEFAULT",
    "FTZ",
    "DAZ",
    "FLAGS",
    "enter",
    "leave",
    "mxcsr",
    "set_mxcsr",
    "read_mxcsr",
    "write_mxcsr",
    "ieee_env",
    "ieee_defaults",
]

#: True where the process runs on x86 (MXCSR exists); elsewhere every function here does nothing
X86: bool = _llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i486", "i586", "i686", "amd64")

#: MXCSR bits
FTZ = 1 << 15  # flush to zero: subnormal results become 0
DAZ = 1 << 6  # denormals are zero: subnormal operands read as 0
FLAGS = 0x3F  # the sticky exception flags (invalid, denormal, divide by zero, overflow, underflow, inexact)
#: the IEEE default: every exception masked, round to nearest even, FTZ and DAZ off (the value at process start)
DEFAULT = 0x1F80

_i8 = ir.IntType(8)
_i32 = ir.IntType(32)
_VOID_P = ir.FunctionType(ir.VoidType(), [_i8.as_pointer()])


def _mxcsr_call(builder, name: str, slot):
    fn = cgutils.get_or_insert_function(builder.module, _VOID_P, name)
    builder.call(fn, [builder.bitcast(slot, _i8.as_pointer())])


@intrinsic
def mxcsr(typingctx):
    """The calling thread's MXCSR (0 where there is none)."""

    def codegen(context, builder, signature, args):
        if not X86:
            return ir.Constant(_i32, 0)
        slot = cgutils.alloca_once(builder, _i32)
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
        return builder.load(slot)

    return types.uint32(), codegen


@intrinsic
def set_mxcsr(typingctx, value):
    """Write ``value`` (an integer) to the calling thread's MXCSR (nothing where there is none)."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        if X86:
            v = context.cast(builder, args[0], signature.args[0], types.uint32)
            slot = cgutils.alloca_once(builder, _i32)
            builder.store(v, slot)
            _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()

    return types.void(value), codegen


_DEFAULT = DEFAULT
_FLAGS = FLAGS
_NOT_FLAGS = 0xFFFFFFFF ^ FLAGS


@njit(inline="always")
def enter():
    """Set the IEEE default environment on the calling thread (keeping its exception flags) and
    return the previous MXCSR, for :func:`leave`. Numba code only."""
    old = mxcsr()
    set_mxcsr((old & _FLAGS) | _DEFAULT)
    return old


@njit(inline="always")
def leave(old):
    """Put back the MXCSR that :func:`enter` returned, with the exception flags raised since. Numba code only."""
    set_mxcsr((old & _NOT_FLAGS) | (mxcsr() & _FLAGS))


@njit(cache=True)
def _enter():  # pragma: no cover - compiled
    return enter()


@njit(cache=True)
def _leave(old):  # pragma: no cover - compiled
    leave(old)


@njit(cache=True)
def _read():  # pragma: no cover - compiled
    return mxcsr()


@njit(cache=True)
def _write(value):  # pragma: no cover - compiled
    set_mxcsr(value)


def read_mxcsr() -> int:
    """The calling thread's MXCSR (0 where there is none)."""
    return int(_read())


def write_mxcsr(value: int) -> None:
    """Set the calling thread's MXCSR (e.g. ``read_mxcsr() | FTZ | DAZ``); a no-op where there is none."""
    _write(int(value) & 0xFFFF)


@contextlib.contextmanager
def ieee_env() -> Iterator[None]:
    """Run the block in the IEEE default floating-point environment on the calling thread, then put
    the caller's environment back."""
    old = _enter()
    try:
        yield
    finally:
        _leave(old)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def ieee_defaults(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorator: ``fn`` runs in the IEEE default floating-point environment (see :func:`ieee_env`)."""
    if not X86:
        return fn

    @functools.wraps(fn)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        old = _enter()
        if old & _NOT_FLAGS == _DEFAULT:  # the caller was in the default already: nothing to give back
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            _leave(old)

    return guarded
