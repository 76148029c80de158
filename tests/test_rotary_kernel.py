"""The rotary's Triton kernel (models/rotary_kernel.py) computes what the rotation in PyTorch's ops
computes, bit for bit, forward and backward: run in Triton's CPU interpreter, in a process of its own
(the interpreter is chosen when the kernel is defined, from TRITON_INTERPRET)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fsdp_lab.models import rotary_kernel
from fsdp_lab.models.transformer import RotaryTables

pytestmark = pytest.mark.slow

# Rows (2 x 7 x 3 = 42) not a multiple of a program's 16, and 12 pairs padded to 16 lanes: the masks
# are exercised. Values spread over many binades, so products round and sums meet ties.
CHECK = r"""
import torch
from fsdp_lab.models import rotary_kernel
from fsdp_lab.models.transformer import RotaryTables, rotate_pairs

for dtype in (torch.bfloat16, torch.float32):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 7, 3, 24, generator=g) * torch.logspace(-3, 3, 24)).to(dtype).requires_grad_()
    cos, sin = RotaryTables(24, broadcast=True)(2, 7, 3, x.device, dtype)
    grad = torch.randn(x.shape, generator=g).to(dtype)
    expected = rotate_pairs(x, cos, sin)
    (expected_grad,) = torch.autograd.grad(expected, x, grad)
    out = rotary_kernel.rotate(x, cos, sin)
    (out_grad,) = torch.autograd.grad(out, x, grad)
    assert torch.equal(out, expected), (dtype, (out.float() - expected.float()).abs().max())
    assert torch.equal(out_grad, expected_grad), (dtype, (out_grad.float() - expected_grad.float()).abs().max())
print("bit for bit")
"""


def test_the_kernel_rotates_as_the_elementwise_ops_bit_for_bit():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bit for bit" in result.stdout


def test_the_kernel_is_taken_for_gpu_activations_but_not_for_the_traces_fake_ones():
    assert rotary_kernel.runs_on(torch.device("cuda"), torch.bfloat16), "Triton installed (the test extra)"
    assert not rotary_kernel.runs_on(torch.device("cuda"), torch.float16), "rounding by hand covers bf16 only"
    assert not rotary_kernel.runs_on(torch.device("cpu"), torch.bfloat16)
    # The estimate's and the plan's traces run the model on fake GPU tensors: they count and keep
    # PyTorch's ops, which the kernel's launch would not show them.
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 7, 3, 24, dtype=torch.bfloat16, device="cuda")
        cos = torch.empty(1, 7, 1, 24, dtype=torch.bfloat16, device="cuda")
        assert x.is_cuda and not rotary_kernel.takes(x, cos)
