"""SwiGLU's `silu(gate) * up` on one GPU, forward and backward, at the speed benchmark's shape (4 x 2048
tokens, hidden 5632, bf16): PyTorch's ops against the lab's Triton kernel (models/kernels/swiglu.py),
milliseconds per call, the memory autograd keeps for backward, and how far the kernel's output and
gradients are from the ops' (elements that differ, largest difference).

    python benchmarks/swiglu_kernel.py [--tokens 8192] [--hidden 5632]"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from cuda_events import fwd_bwd_ms  # benchmarks/, this script's directory
from fsdp_lab.models.kernels.swiglu import swiglu


def kept_mib(f, inputs) -> float:
    """MiB autograd keeps for backward beyond the inputs themselves."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        f(*inputs)
    return sum(t.numel() * t.element_size() for t in kept if not any(t is i for i in inputs)) / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4 * 2048)
    p.add_argument("--hidden", type=int, default=5632)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = [(torch.randn(a.tokens, a.hidden, device="cuda", generator=g) * 3).bfloat16().requires_grad_() for _ in range(2)]
    grad = torch.randn(a.tokens, a.hidden, device="cuda", generator=g).bfloat16()
    forms = {"PyTorch's ops": lambda gate, up: F.silu(gate) * up, "one Triton kernel each way (the lab's)": swiglu}
    results = {}
    for name, f in forms.items():
        out = f(*inputs)
        results[name] = (out, *torch.autograd.grad(out, inputs, grad))
    print(f"{'form':40} {'ms fwd+bwd':>11} {'kept MiB':>9}")
    for name, f in forms.items():
        print(f"{name:40} {fwd_bwd_ms(f, inputs, grad):11.3f} {kept_mib(f, inputs):9.0f}", flush=True)
    for what, ops, kernel in zip(("output", "gate grad", "up grad"), *results.values()):
        differ = (ops != kernel).sum().item()
        print(f"{what:10} elements that differ: {differ} of {ops.numel()}, largest difference {(ops.float() - kernel.float()).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
