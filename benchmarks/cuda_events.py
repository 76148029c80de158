"""Forward and backward of a function timed on one GPU by CUDA events, for the elementwise-form
benchmarks (rotary_forms.py, swiglu_kernel.py)."""

from __future__ import annotations

import torch


def fwd_bwd_ms(f, inputs, grad, iters: int = 50) -> float:
    """Milliseconds per f(*inputs).backward(grad), after 5 calls of warm-up."""
    for _ in range(5):
        f(*inputs).backward(grad)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f(*inputs).backward(grad)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
