"""What every kernel of this package shares: whether it may take a tensor, and its launch, which on
the fake tensors of the estimate's and the plan's traces runs nothing (the caller made the outputs),
so that the traces see the kernels' outputs and saved tensors as a GPU run has them."""

from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensor

try:
    import triton
    import triton.language as tl

    jit = triton.jit
except ImportError:  # a CPU install: no kernel runs; a trace that models a GPU takes them all the same
    triton = tl = None

    def jit(fn):
        return fn

DTYPES = (torch.bfloat16, torch.float32)  # what `rounded` rounds to
_modelling_a_gpu = False  # set by as_on_a_gpu()
_watchers: list = []  # watching_launches()'s callbacks


@contextlib.contextmanager
def as_on_a_gpu():
    """Inside, fake CPU tensors stand for a GPU's, Triton or not: the memory estimate traces its
    step so (estimate/cuda_kernels.py), and its trace then keeps what the kernels keep."""
    global _modelling_a_gpu
    before, _modelling_a_gpu = _modelling_a_gpu, True
    try:
        yield
    finally:
        _modelling_a_gpu = before


@contextlib.contextmanager
def watching_launches(watch):
    """Inside, each launch on a trace's fake tensors calls watch(kernel name, its tensor arguments,
    its constants): the plan's trace records the kernel there (plan/trace.py), which no aten op shows."""
    _watchers.append(watch)
    try:
        yield
    finally:
        _watchers.remove(watch)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels take activations of `dtype` on `device`."""
    on_a_gpu = (triton is not None and device.type == "cuda") or _modelling_a_gpu
    return on_a_gpu and dtype in DTYPES


def takes(*tensors: torch.Tensor) -> bool:
    """Whether a kernel may take these tensors: contiguous, of one supported dtype, plain tensors on a
    GPU (or a trace's fake ones), in eager code."""
    first = tensors[0]
    if not available(first.device, first.dtype) or torch.compiler.is_compiling():
        return False
    launches = first.device.type == "cuda" and triton is not None  # else only a trace that models a GPU
    # A trace's plain fake tensors only: is_fake() says yes to a DTensor holding fake ones too (a TP
    # layer's output split unevenly, tp_styles.HiddenColwise), which a GPU run gives PyTorch's ops.
    return all((isinstance(t, FakeTensor) or (launches and type(t) is torch.Tensor)) and t.is_contiguous() and t.dtype == first.dtype
               for t in tensors)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def int64_offsets(end: int) -> bool:
    """Whether a kernel's element offsets, up to `end` (one past the last program's last lane), pass
    int32's range: Triton computes them in int32 (program ids, aranges), and a wrapped offset
    addresses memory before the tensor. SwiGLU at the 8B shape's hidden 14336 passes it from 37
    sequences of 4096 tokens; below it the kernels keep int32 offsets, as measured."""
    return end > 2**31


def run(kernel, grid, *args, **constants) -> None:
    """kernel[grid](*args, **constants), except on a trace's fake tensors, which only stand for the
    outputs the caller made (watching_launches' callbacks see the launch); without fused
    multiply-adds, which would round once where PyTorch's ops round twice (a kernel writes each fma
    it wants)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not any(isinstance(t, FakeTensor) for t in tensors):
        kernel[grid](*args, **constants, enable_fp_fusion=False)
        return
    for watch in _watchers:
        watch(f"{kernel.__module__.rsplit('.', 1)[-1]}.{kernel.__name__}", tensors, constants)


@jit
def program_index(INT64: tl.constexpr):
    """tl.program_id(0), in int64 where the offsets a kernel computes from it pass int32's range
    (int64_offsets)."""
    index = tl.program_id(0)
    if INT64:
        index = index.to(tl.int64)
    return index


@jit
def rounded(value, dtype: tl.constexpr):
    """float32 `value` rounded to `dtype` (float32 or bfloat16) and kept in float32 for the next op:
    to nearest, even on ties, as PyTorch rounds, by hand on the bits (Triton's CPU interpreter,
    which the tests run, truncates in a cast); NaN stays NaN."""
    if dtype == tl.float32:
        return value
    bits = value.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(value != value, value, bits.to(tl.float32, bitcast=True))
