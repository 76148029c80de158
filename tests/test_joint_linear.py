"""q and k projected in one matmul (fsdp_lab.models.joint_linear): the values and gradients of the
separate projections, frozen weights left without a gradient, and only the weights themselves kept
for backward (FSDP frees gathered weights after forward; a concatenated copy would stay), as
benchmarks/saved_tensors.py lists a lone block's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmark_scripts import load
from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models.joint_linear import joint_linear
from fsdp_lab.models.transformer import Transformer


def inputs(*requires_grad: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    return x, [torch.randn(n, 8, generator=g, dtype=torch.float64, requires_grad=r) for n, r in zip((6, 4), requires_grad)]


def test_one_matmul_gives_the_separate_projections_and_their_gradients():
    x, ws = inputs(True, True)
    joint = joint_linear(x, *ws)
    separate = torch.cat([F.linear(x, w) for w in ws], dim=-1)
    torch.testing.assert_close(joint, separate, rtol=1e-12, atol=0)
    grad = torch.randn_like(joint)
    torch.testing.assert_close(torch.autograd.grad(joint, [x, *ws], grad), torch.autograd.grad(separate, [x, *ws], grad), rtol=1e-12, atol=1e-12)


def test_a_frozen_weight_gets_no_gradient():
    x, ws = inputs(False, True)
    joint_linear(x, *ws).sum().backward()
    assert ws[0].grad is None and ws[1].grad is not None and x.grad is not None


def test_backward_keeps_the_weights_not_their_concatenation():
    cfg = TransformerConfig(dim=32, n_layers=1, n_heads=4, ffn_dim=64, vocab_size=50)
    model = Transformer(cfg)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        model(torch.randint(0, 50, (2, 8)))  # 16 tokens: no activation is weight-sized
    weight_sized = [t for t in kept if t.dim() == 2 and cfg.dim in t.shape and t.numel() >= cfg.dim**2]
    assert len(weight_sized) >= 6  # wq and wk (or their concatenation), wv, wo, w1, w3, w2, output
    assert all(t.untyped_storage().data_ptr() in params for t in weight_sized), [tuple(t.shape) for t in weight_sized]


def test_saved_tensors_lists_what_a_lone_block_keeps():
    listed = load("saved_tensors").saved_by_block(torch.float32, "cpu", batch=2, seq=8, dim=32, heads=4, ffn=64)
    shapes = [tuple(t["shape"]) for t in listed["saved"]]
    assert (2, 8, 8, 8) in shapes  # q and k rotated together: 4 heads each, in one buffer
    assert listed["saved_mib_unique_storages"] > 0
