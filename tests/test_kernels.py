"""The Triton kernels of eager blocks (models/kernels/): the rotary bit for bit as PyTorch's ops,
SwiGLU as PyTorch's ops within their rounding, forward and backward, run in Triton's CPU interpreter
in a process of its own (the interpreter is chosen when a kernel is defined, from TRITON_INTERPRET);
and the traces' fake GPU tensors take the kernels as a GPU run does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from fsdp_lab.models.kernels import rotary, swiglu
from fsdp_lab.models.kernels.launch import as_on_a_gpu, watching_launches
from autograd_saved import saved_by
from fsdp_lab.compose import compose_run
from fsdp_lab.models import build_plain
from fsdp_lab.models.transformer import FeedForward
from fsdp_lab.plan.trace import OpRecorder

# Rows (2 x 7 x 3 = 42) not a multiple of a program's, 24 lanes padded to 32, 2 x 7 x 3 x 24 SwiGLU
# elements not a multiple of a program's: the masks are exercised. Values spread over many binades,
# so products round and sums meet ties.
CHECK = r"""
import torch
import torch.nn.functional as F
from fsdp_lab.models.kernels import rotary, swiglu
from fsdp_lab.models.transformer import RotaryTables, rotate_pairs

def forward_and_grads(f, inputs, grad):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = f(*inputs)
    return (out, *torch.autograd.grad(out, inputs, grad))

for dtype in (torch.bfloat16, torch.float32):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 7, 3, 24, generator=g) * torch.logspace(-3, 3, 24)).to(dtype)
    grad = torch.randn(x.shape, generator=g).to(dtype)
    cos, sin = RotaryTables(24, broadcast=True)(2, 7, 3, x.device, dtype)
    expected = forward_and_grads(lambda t: rotate_pairs(t, cos, sin), [x], grad)
    for name, a, b in zip(("rotary", "rotary grad"), forward_and_grads(lambda t: rotary.rotate(t, cos, sin), [x], grad), expected):
        assert torch.equal(a, b), (name, dtype, (a.float() - b.float()).abs().max())

    gate, up = (torch.randn(x.shape, generator=g) * 4).to(dtype), torch.randn(x.shape, generator=g).to(dtype)
    expected = forward_and_grads(lambda a, b: F.silu(a) * b, [gate, up], grad)
    for name, a, b in zip(("swiglu", "gate grad", "up grad"), forward_and_grads(swiglu.swiglu, [gate, up], grad), expected):
        # The CPU's exp is not CUDA's expf: within one rounding of the dtype.
        torch.testing.assert_close(a, b, rtol=2 * torch.finfo(dtype).eps, atol=1e-6, msg=f"{name} {dtype}")
print("kernels checked")
"""


@pytest.mark.slow
def test_the_kernels_compute_what_pytorchs_ops_compute():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kernels checked" in result.stdout


def saved_shapes(fn, *inputs) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd keeps for backward while fn runs."""
    return [shape for shape, _ in saved_by(fn, *inputs)[0]]


def test_a_trace_that_models_a_gpu_takes_the_kernels_and_keeps_what_they_keep():
    """The estimate traces its step on fake CPU tensors standing for a GPU's (estimate/cuda_kernels.py):
    they must take the kernels and keep what the kernels keep (SwiGLU's no silu output), not what
    PyTorch's ops would; real CPU tensors never take them."""
    assert rotary.broadcast_tables(torch.device("cuda"), torch.bfloat16), "Triton installed (the test extra)"
    assert not rotary.broadcast_tables(torch.device("cuda"), torch.float16), "rounding by hand covers bf16 and fp32"
    assert not rotary.broadcast_tables(torch.device("cpu"), torch.bfloat16)

    def ffn_saves(fake: bool) -> list[tuple[int, ...]]:
        with FakeTensorMode() if fake else contextlib.nullcontext():
            return saved_shapes(FeedForward(8, 16), torch.randn(2, 3, 8, requires_grad=True))

    hidden = (2, 3, 16)
    assert ffn_saves(fake=True).count(hidden) == 3, "PyTorch's ops: silu keeps gate, the product silu's output and up"
    with as_on_a_gpu():
        assert rotary.broadcast_tables(torch.device("cpu"), torch.bfloat16)
        assert ffn_saves(fake=True).count(hidden) == 2, "the kernel keeps gate and up; silu's output is computed again"
        assert ffn_saves(fake=False).count(hidden) == 3, "real CPU tensors: PyTorch's ops"
    assert ffn_saves(fake=True).count(hidden) == 3, "outside the trace's context again"


def test_model_kernels_false_keeps_pytorchs_ops_where_the_kernels_would_run():
    """`model.kernels=false` (a user comparing numerics with PyTorch's ops, or timing the kernels apart):
    the built transformer's blocks keep silu's output and its rotary tables are laid out as the
    activations, on a GPU (here: a trace modelling one) as elsewhere."""
    hidden = (2, 3, 16)
    for kernels, kept in ((True, 2), (False, 3)):
        model = build_plain(compose_run("model.dim=8", "model.n_heads=2", "model.ffn_dim=16", f"model.kernels={kernels}").model)
        assert all(b.feed_forward.kernels is kernels for b in model.layers)
        with as_on_a_gpu(), FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.randn(2, 3, 8, requires_grad=True)
            assert saved_shapes(model.layers[0].feed_forward, x).count(hidden) == kept
            cos, _ = model.rotary(2, 3, 4, x.device, x.dtype)
        assert cos.shape == ((1, 3, 1, 4) if kernels else (2, 3, 4, 4))


def test_model_kernels_false_keeps_pytorchs_rotation_with_broadcast_tables_too():
    """A compiled model's tables broadcast over the heads; its parity reference, deep-copied before
    compiling, runs those blocks eagerly. With model.kernels=false the rotation stays PyTorch's there
    too: the flag decides, not the tables' shape."""
    for kernels in (True, False):
        model = build_plain(compose_run("model.dim=8", "model.n_heads=2", "model.ffn_dim=16", "model.compile=true",
                                        f"model.kernels={kernels}").model)
        seen = []
        with FakeTensorMode(allow_non_fake_inputs=True), as_on_a_gpu(), watching_launches(lambda name, *_: seen.append(name)):
            x = torch.randn(2, 3, 8)
            cos, sin = model.rotary(2, 3, 4, x.device, x.dtype)
            assert cos.shape == (1, 3, 1, 4)
            model.layers[0].attention(x, cos, sin)
        assert any("rotat" in name.lower() for name in seen) is kernels, seen


def test_a_trace_leaves_a_fake_dtensor_to_pytorchs_ops(fake_group):
    """A TP layer's output split unevenly stays a DTensor (tp_styles.HiddenColwise), which a GPU run
    gives PyTorch's ops: the estimate's trace must too, or it keeps no silu output where the run does."""
    fake_group(2)
    mesh = init_device_mesh("cpu", (2,))
    with FakeTensorMode(), as_on_a_gpu():
        local = torch.randn(2, 3, 8)
        sharded = DTensor.from_local(local, mesh, [Shard(2)], run_check=False)
        assert swiglu.takes_swiglu(local, local)
        assert not swiglu.takes_swiglu(sharded, sharded)


def launches(fn, *shapes) -> list[tuple[str, int, dict]]:
    """(kernel, bytes of its tensor arguments, constants) of each launch fn makes on fake bf16 tensors
    of these shapes (no memory: sizes a GPU run reaches cost nothing here)."""
    seen = []
    watch = lambda name, tensors, constants: seen.append((name, sum(t.nbytes for t in tensors), constants))  # noqa: E731
    with FakeTensorMode(), as_on_a_gpu(), watching_launches(watch):
        inputs = [torch.empty(s, dtype=torch.bfloat16, requires_grad=True) for s in shapes]
        out = fn(*inputs)
        out.backward(torch.empty_like(out))
    return seen


def test_offsets_pass_to_int64_where_int32_would_wrap():
    """Triton computes offsets in int32 (program ids, aranges); past 2^31 elements a wrapped offset
    writes before the tensor. SwiGLU at the 8B shape's hidden 14336 and 4096 tokens a sequence
    passes 2^31 elements from 37 sequences; the rotation of q and k (64 heads of 128) from 65."""
    def wide(fn, *shapes):
        return {c["INT64"] for _, _, c in launches(fn, *shapes)}

    assert wide(swiglu.swiglu, (36, 4096, 14336), (36, 4096, 14336)) == {False}
    assert wide(swiglu.swiglu, (37, 4096, 14336), (37, 4096, 14336)) == {True}
    tables = (1, 4096, 1, 128)
    assert wide(rotary.rotate, (64, 4096, 64, 128), tables, tables) == {False}
    assert wide(rotary.rotate, (65, 4096, 64, 128), tables, tables) == {True}


def test_the_plans_trace_prices_each_launch_as_one_kernel():
    """The plan prices a step from its trace's ops (plan/trace.py): a launch, which no aten op shows,
    is one kernel reading and writing its tensor arguments (one dispatch on the host), and the
    outputs it writes into are allocations that move no bytes."""
    with FakeTensorMode(), as_on_a_gpu():
        ffn = FeedForward(8, 16)
        x = torch.randn(2, 3, 8, requires_grad=True)
        recorder = OpRecorder()
        with recorder:
            ffn(x).sum().backward()
    hidden = 2 * 3 * 16 * 4  # bytes of gate, up, their product and each gradient (float32)
    elementwise = {(op.name, op.phase): op.dims[0] for op in recorder.ops if op.kind == "mem"}
    assert elementwise["swiglu._forward_kernel", "fwd"] == 3 * hidden, "reads gate and up, writes the product"
    assert elementwise["swiglu._backward_kernel", "bwd"] == 5 * hidden, "reads the gradient, gate and up, writes 2"
    assert not any(name == "empty_like" for name, _ in elementwise)
