"""The training loss of low-precision logits: the same float32 loss and gradient as upcasting all the
logits first, computed a row slice at a time, keeping no float32 copy of the logits for backward;
with model.compile=true, the compiled loss, equal to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fsdp_lab.cross_entropy as ce
from fsdp_lab.step import compiled_loss_fn, loss_fn
from fsdp_lab.worker import build_trainer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sliced_loss_and_gradient_match_the_upcast_reference(monkeypatch, dtype):
    monkeypatch.setattr(ce, "SLICE_ELEMENTS", 64)  # 5 rows of 13 classes per slice: 8 slices, the last short
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 19, 13, generator=gen)).to(dtype).requires_grad_()
    targets = torch.randint(0, 13, (2, 19), generator=gen)

    loss = loss_fn(logits, targets)
    assert loss.dtype == torch.float32
    assert all(t.dtype == dtype for t in loss.grad_fn.saved_tensors if t.is_floating_point())
    loss.backward()
    grad, logits.grad = logits.grad, None
    ref = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    ref.backward()

    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=0)


def test_float32_and_float64_logits_keep_their_precision():
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(4, 3, 5, dtype=dtype)
        assert loss_fn(logits, torch.zeros(4, 3, dtype=torch.long)).dtype == dtype


@pytest.mark.slow  # inductor compiles and loads its C++ kernels in processes of its own
def test_the_compiled_loss_matches_the_sliced_one_in_value_and_gradient():
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 19, 13, generator=gen)).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 13, (2, 19), generator=gen)
    compiled = compiled_loss_fn()(logits, targets)
    compiled.backward()
    grad, logits.grad = logits.grad, None
    sliced = loss_fn(logits, targets)
    sliced.backward()
    assert compiled.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, sliced, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=0)


@pytest.mark.parametrize("compile", [False, True])
def test_model_compile_also_compiles_the_loss(prepared, world_of_one, compile):
    run, dims = prepared("debug=cpu_tiny", "mesh=single", f"model.compile={str(compile).lower()}")
    trainer = build_trainer(run, dims, world_of_one, on_step=lambda row: None)
    assert trainer.loss is (compiled_loss_fn() if compile else loss_fn)
