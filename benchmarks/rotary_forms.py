"""Forms of the rotary embedding, forward and backward on one GPU, at the speed benchmark's shape
(batch 4, seq 2048, 16 heads of 128, bf16): milliseconds per call and whether each gives the lab's
rotation in PyTorch's ops (`rotate_pairs`) bit for bit (forward output and input gradient).

    python benchmarks/rotary_forms.py [--batch 4] [--seq 2048] [--heads 16] [--head-dim 128]

Why: in a torch profile of the eager 0.95B step, the rotary's kernels were about 10% of the GPU's
time, most of it in elementwise kernels that were not vectorized because the tables, then of shape
(seq, 1, head_dim), broadcast over batch and heads. The lab now keeps them at the activations' shape.

Measured on one H200 (torch 2.11), ms per call, forward + backward:
    form                                           b4 s2048 h16   b1 s4096 h32
    tables per seq, flip (the lab's before)            0.378          0.353
    tables per seq x heads, flip                       0.341          0.266
    tables per seq x heads, swap by matmul             0.302          0.228
    tables per batch x seq x heads, flip (PyTorch's ops) 0.268        0.266
    tables per batch x seq x heads, swap by matmul     0.248          0.227
    tables per seq x heads, addcmul (not bit for bit)  0.327          0.267
    complex64, torchtitan's (not bit for bit)          0.262          0.262
The swap by matmul is exact but not taken: selective AC (selective=op) keeps every matmul's output,
and an inf in one lane would spread over the head. Eager blocks on a GPU now rotate in one Triton
kernel (models/kernels/rotary.py), its tables per seq: at --heads 32 (q and k together, batch 4, seq
2048) 0.196 ms against PyTorch's ops' 0.504, bit for bit (one H200, torch 2.11, 2026-11-23)."""

from __future__ import annotations

import argparse

import torch

from cuda_events import fwd_bwd_ms  # benchmarks/, this script's directory
from fsdp_lab.models.kernels import rotary
from fsdp_lab.models.transformer import RotaryTables, rotate_pairs


def swap_matrix(head_dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """R with x @ R = (x2, x1) in each (even, odd) pair: a permutation, so exact in any dtype."""
    r = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    idx = torch.arange(0, head_dim, 2, device=device)
    r[idx + 1, idx] = 1
    r[idx, idx + 1] = 1
    return r


def forms(cos, sin, batch: int, heads: int):
    """name -> f(x); the tables are (1, seq, 1, head_dim), as the kernel reads them."""
    _, seq, _, hd = cos.shape
    cos_b, sin_b = (t.expand(batch, seq, heads, hd).contiguous() for t in (cos, sin))
    cos_h, sin_h = cos_b[0].contiguous(), sin_b[0].contiguous()
    r = swap_matrix(hd, cos.dtype, cos.device)
    freqs = torch.polar(torch.ones(seq, hd // 2, device=cos.device), torch.outer(
        torch.arange(seq, device=cos.device, dtype=torch.float32),
        1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=cos.device, dtype=torch.float32) / hd))))[:, None]

    def flip(x):
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)

    def complex_form(x):  # torchtitan's llama3
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)

    return {
        "tables per seq, flip (the lab's before)": lambda x: x * cos + flip(x) * sin,
        "tables per seq x heads, flip": lambda x: x * cos_h + flip(x) * sin_h,
        "tables per seq x heads, swap by matmul": lambda x: x * cos_h + (x @ r) * sin_h,
        "tables per batch x seq x heads, flip (PyTorch's ops)": lambda x: rotate_pairs(x, cos_b, sin_b),
        "tables per batch x seq x heads, swap by matmul": lambda x: x * cos_b + (x @ r) * sin_b,
        "tables per seq x heads, addcmul": lambda x: torch.addcmul(x * cos_h, flip(x), sin_h),
        "complex64 (torchtitan's)": complex_form,
        "one Triton kernel, tables per seq (the lab's)": lambda x: rotary.rotate(x, cos, sin),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("batch", 4), ("seq", 2048), ("heads", 16), ("head-dim", 128)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    x = torch.randn(a.batch, a.seq, a.heads, a.head_dim, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    cos, sin = RotaryTables(a.head_dim, broadcast=True)(a.batch, a.seq, a.heads, device, dtype)
    reference = rotate_pairs(x, cos, sin)
    (ref_grad,) = torch.autograd.grad(reference, x, grad)
    print(f"{'form':48} {'ms fwd+bwd':>11} {'bit for bit':>12}")
    for name, f in forms(cos, sin, a.batch, a.heads).items():
        out = f(x)
        (g,) = torch.autograd.grad(out, x, grad)
        same = torch.equal(out, reference) and torch.equal(g, ref_grad)
        x.grad = None
        print(f"{name:48} {fwd_bwd_ms(f, [x], grad):11.3f} {str(same):>12}", flush=True)


if __name__ == "__main__":
    main()
