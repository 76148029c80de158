"""The rotary embedding in one Triton kernel, forward and backward.

In PyTorch's ops (transformer.rotate_pairs) the rotation is 4 elementwise kernels forward and about
as many backward, each reading and writing the whole q/k activation: at the speed benchmark's shape
(q and k of 4 x 2048 tokens, 32 heads of 128) 0.504 ms a block forward and backward on an H200, the
kernel 0.196 ms (benchmarks/rotary_forms.py). It reads x once, writes the result once and reads the
tables at (seq, head_dim) instead of tables as large as x.

Bit for bit what the ops compute: each product and the sum rounded to x's dtype. Backward is the
rotation by the opposite angle, the same kernel with the sine's lanes exchanged; it saves nothing
of x."""

from __future__ import annotations

import torch

from fsdp_lab.models.kernels.launch import available, cdiv, int64_offsets, jit, program_index, rounded, run, takes, tl

ELEMENTS_PER_PROGRAM = 4096  # a program rotates as many whole rows of head_dim lanes as make this many


def takes_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel rotates x (batch, seq, heads, head_dim) with these tables: they must be
    (1, seq, 1, head_dim), as RotaryTables makes them where the kernels run."""
    return takes(x, cos, sin) and cos.shape == (1, x.shape[1], 1, x.shape[3])


def broadcast_tables(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether eager blocks rotating activations of `dtype` on `device` want (1, seq, 1, head_dim) tables."""
    return available(device, dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformer.rotate_pairs's result for x (batch, seq, heads, head_dim), in one kernel."""
    return _Rotate.apply(x, cos, sin)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotated(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotated(grad.contiguous(), cos, sin, backward=True), None, None


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    batch, seq, heads, head_dim = x.shape
    out = torch.empty_like(x)
    rows = batch * seq * heads
    block_dim = 1 << (head_dim - 1).bit_length()  # lanes a program reads per row: a power of 2
    block_rows = max(1, ELEMENTS_PER_PROGRAM // block_dim)
    programs = cdiv(rows, block_rows)
    run(_rotate_kernel, (programs,), x, cos, sin, out, rows, heads, seq, HEAD_DIM=head_dim, BLOCK_DIM=block_dim,
        BLOCK_ROWS=block_rows, BACKWARD=backward, INT64=int64_offsets(programs * block_rows * block_dim))
    return out


@jit
def _swapped_pairs(t, ROWS: tl.constexpr, DIM: tl.constexpr):
    """t with the lanes of each (even, odd) pair exchanged."""
    even, odd = tl.split(tl.reshape(t, [ROWS, DIM // 2, 2]))
    return tl.reshape(tl.join(odd, even), [ROWS, DIM])

@jit
def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, rows, heads, seq,
                   HEAD_DIM: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BACKWARD: tl.constexpr,
                   INT64: tl.constexpr):
    # x's rows are (batch, seq, heads) flattened, read and written whole (vectorized); the tables
    # hold cos on both lanes of a pair and sin negated on the even lane, so that
    #   forward   out = x cos + swapped(x) sin
    #   backward  out = x cos + swapped(x) swapped(sin)   (the transposed rotation)
    row = program_index(INT64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    lane = tl.arange(0, BLOCK_DIM)
    mask = (row[:, None] < rows) & (lane[None, :] < HEAD_DIM)
    at = row[:, None] * HEAD_DIM + lane[None, :]
    table_at = ((row // heads) % seq)[:, None] * HEAD_DIM + lane[None, :]
    x = tl.load(x_ptr + at, mask=mask)
    dtype = x.dtype
    x = x.to(tl.float32)
    cos = tl.load(cos_ptr + table_at, mask=mask).to(tl.float32)
    sin = tl.load(sin_ptr + table_at, mask=mask).to(tl.float32)
    if BACKWARD:
        sin = _swapped_pairs(sin, BLOCK_ROWS, BLOCK_DIM)
    # Each product and the sum in float32, rounded to x's dtype, as PyTorch's ops compute.
    out = rounded(x * cos, dtype) + rounded(_swapped_pairs(x, BLOCK_ROWS, BLOCK_DIM) * sin, dtype)
    tl.store(out_ptr + at, rounded(out, dtype).to(dtype), mask=mask)
