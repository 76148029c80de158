"""The training loss of low-precision logits: the same float32 loss and gradient as upcasting all the
logits first, computed a row slice at a time, keeping no float32 copy of the logits for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fsdp_lab.cross_entropy as ce
from fsdp_lab.step import loss_fn


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
