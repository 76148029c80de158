"""SwiGLU's `silu(gate) * up` in one Triton kernel forward and one backward.

In PyTorch's ops it is silu and a product forward (the gate read twice over, silu's output written
and read) and two products and silu's backward in backward; autograd keeps silu's output besides
gate and up (at the speed benchmark's shape 88 MiB a block). The kernels read gate and up and write
the product forward, read them and the gradient and write both gradients backward, and keep only
gate and up: silu's output is computed again in backward.

The arithmetic is that of PyTorch's CUDA kernels for silu, its backward and the products, in float32
with each op's result rounded to the activations' dtype, IEEE division and the one fused multiply-add
nvcc makes in silu's backward; but exp is Triton's (the hardware's exp2), within a few float32 ulp of
CUDA's expf, which rounding to bf16 hides but for values next to a rounding boundary. (CUDA's expf,
libdevice's, does not run in Triton's CPU interpreter, where the tests run the kernels.)"""

from __future__ import annotations

import torch

from fsdp_lab.models.kernels.launch import cdiv, int64_offsets, jit, program_index, rounded, run, takes, tl

BLOCK = 2048  # elements per program


def takes_swiglu(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return takes(gate, up) and gate.shape == up.shape


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """F.silu(gate) * up, in one kernel."""
    return _SwiGLU.apply(gate, up)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        out = torch.empty_like(gate)
        run(_forward_kernel, _grid(gate), gate, up, out, gate.numel(), BLOCK=BLOCK, INT64=_int64(gate))
        return out

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad = grad.contiguous()
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        run(_backward_kernel, _grid(gate), grad, gate, up, grad_gate, grad_up, gate.numel(), BLOCK=BLOCK, INT64=_int64(gate))
        return grad_gate, grad_up


def _grid(t: torch.Tensor) -> tuple[int]:
    return (cdiv(t.numel(), BLOCK),)


def _int64(t: torch.Tensor) -> bool:
    return int64_offsets(_grid(t)[0] * BLOCK)


@jit
def _silu(gate, denominator, dtype: tl.constexpr):
    """silu(gate) rounded to dtype, as PyTorch's CUDA kernel: gate / (1 + exp(-gate)), the denominator
    given (backward's sigmoid shares it)."""
    return rounded(tl.math.div_rn(gate, denominator), dtype)

@jit
def _forward_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr, INT64: tl.constexpr):
    at = program_index(INT64) * BLOCK + tl.arange(0, BLOCK)
    mask = at < n
    gate = tl.load(gate_ptr + at, mask=mask)
    dtype = gate.dtype
    up = tl.load(up_ptr + at, mask=mask).to(tl.float32)
    gate = gate.to(tl.float32)
    out = rounded(_silu(gate, 1.0 + tl.exp(-gate), dtype) * up, dtype)
    tl.store(out_ptr + at, out.to(dtype), mask=mask)

@jit
def _backward_kernel(grad_ptr, gate_ptr, up_ptr, grad_gate_ptr, grad_up_ptr, n, BLOCK: tl.constexpr, INT64: tl.constexpr):
    at = program_index(INT64) * BLOCK + tl.arange(0, BLOCK)
    mask = at < n
    grad = tl.load(grad_ptr + at, mask=mask)
    dtype = grad.dtype
    grad = grad.to(tl.float32)
    gate = tl.load(gate_ptr + at, mask=mask).to(tl.float32)
    up = tl.load(up_ptr + at, mask=mask).to(tl.float32)
    denominator = 1.0 + tl.exp(-gate)
    grad_up = rounded(grad * _silu(gate, denominator, dtype), dtype)
    grad_silu = rounded(grad * up, dtype)
    # silu's backward as PyTorch's CUDA kernel: dy * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)),
    # where nvcc fuses 1 + x * (1 - s) into one multiply-add.
    sigmoid = tl.math.div_rn(1.0, denominator)
    grad_gate = rounded(grad_silu * sigmoid * tl.fma(gate, 1.0 - sigmoid, 1.0), dtype)
    tl.store(grad_gate_ptr + at, grad_gate.to(dtype), mask=mask)
    tl.store(grad_up_ptr + at, grad_up.to(dtype), mask=mask)
