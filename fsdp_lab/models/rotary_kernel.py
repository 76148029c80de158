"""The rotary embedding as one Triton kernel per call, forward and backward, for eager blocks on a GPU.

The rotation in PyTorch's ops (transformer.apply_rotary) is 4 elementwise kernels forward and about as
many backward, each reading and writing the whole q/k activation: at the speed benchmark's shape (q
and k of 4 x 2048 tokens, 32 heads of 128) they took 0.504 ms a block, forward and backward, about 7%
of an eager step's GPU time. One kernel reads x once and writes the result once, and reads the
tables at (seq, head_dim) instead of tables as large as x.

It computes what those ops compute, rounding as they round: each product to x's dtype, then their sum
(no fused multiply-add), so a run takes the same numbers whichever path its blocks took. Backward is
the rotation by the opposite angle, the same kernel with the sine's lanes exchanged; it saves nothing
of x for backward.

Taken only where it can run and needs no one else's view of the ops: a plain CUDA tensor (not a
DTensor, not a fake tensor of the estimate's or the plan's trace, whose op counts and saved tensors
describe the PyTorch form) outside torch.compile (inductor fuses the PyTorch form itself), with
Triton installed."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install: the PyTorch form is the only one
    triton = None

ELEMENTS_PER_PROGRAM = 4096  # a program rotates as many whole rows of head_dim lanes as make this many


def takes(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether the kernel rotates x: see the module's docstring. `cos` must be the (1, seq, 1,
    head_dim) table in x's dtype (RotaryTables on a device the kernel runs on)."""
    return (triton is not None and type(x) is torch.Tensor and x.is_cuda and not torch.compiler.is_compiling()
            and x.dtype in (torch.bfloat16, torch.float32) and x.is_contiguous() and cos.dtype == x.dtype and cos.shape == (1, x.shape[1], 1, x.shape[3]))


def runs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether eager blocks rotate activations of `dtype` on `device` with the kernel (their tables
    then broadcast)."""
    return triton is not None and device.type == "cuda" and dtype in (torch.bfloat16, torch.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformer.apply_rotary's result for x (batch, seq, heads, head_dim), in one kernel."""
    return _Rotate.apply(x, cos, sin)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _launch(grad.contiguous(), cos, sin, backward=True), None, None


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    batch, seq, heads, head_dim = x.shape
    out = torch.empty_like(x)
    rows = batch * seq * heads
    block_dim = triton.next_power_of_2(head_dim)
    block_rows = max(1, ELEMENTS_PER_PROGRAM // block_dim)
    _rotate_kernel[(triton.cdiv(rows, block_rows),)](
        x, cos, sin, out, rows, heads, seq, HEAD_DIM=head_dim, BLOCK_DIM=block_dim, BLOCK_ROWS=block_rows,
        BACKWARD=backward, enable_fp_fusion=False)  # a fused multiply-add would round once where the ops round twice
    return out


if triton is not None:

    @triton.jit
    def _rounded(value, dtype: tl.constexpr):
        """float32 `value` rounded to `dtype` (float32 or bfloat16) and kept in float32 for the next op:
        to nearest, even on ties, as PyTorch rounds, by hand on the bits (Triton's CPU interpreter,
        which the tests run, truncates in a cast); NaN stays NaN."""
        if dtype == tl.float32:
            return value
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(value != value, value, bits.to(tl.float32, bitcast=True))

    @triton.jit
    def _swapped_pairs(t, ROWS: tl.constexpr, DIM: tl.constexpr):
        """t with the lanes of each (even, odd) pair exchanged."""
        even, odd = tl.split(tl.reshape(t, [ROWS, DIM // 2, 2]))
        return tl.reshape(tl.join(odd, even), [ROWS, DIM])

    @triton.jit
    def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, rows, heads, seq,
                       HEAD_DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BACKWARD: tl.constexpr):
        # x's rows are (batch, seq, heads) flattened, read and written whole (vectorized); the tables
        # hold cos on both lanes of a pair and sin negated on the even lane, so that
        #   forward   out = x cos + swapped(x) sin
        #   backward  out = x cos + swapped(x) swapped(sin)   (the transposed rotation)
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        lane = tl.arange(0, BLOCK_DIM)
        mask = (row[:, None] < rows) & (lane[None, :] < HEAD_DIM)
        at = row[:, None] * HEAD_DIM + lane[None, :]
        table_at = ((row // heads) % seq)[:, None] * HEAD_DIM + lane[None, :]
        x = tl.load(x_ptr + at, mask=mask)
        dtype = x.dtype
        # As PyTorch's elementwise ops compute in x's dtype: each product and the sum in float32,
        # each rounded to x's dtype.
        x = x.to(tl.float32)
        cos = tl.load(cos_ptr + table_at, mask=mask).to(tl.float32)
        sin = tl.load(sin_ptr + table_at, mask=mask).to(tl.float32)
        if BACKWARD:
            sin = _swapped_pairs(sin, BLOCK_ROWS, BLOCK_DIM)
        out = _rounded(x * cos, dtype) + _rounded(_swapped_pairs(x, BLOCK_ROWS, BLOCK_DIM) * sin, dtype)
        tl.store(out_ptr + at, _rounded(out, dtype).to(dtype), mask=mask)
