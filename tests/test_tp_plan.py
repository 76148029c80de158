"""The TP plan's hidden layers: local tensors between the column- and row-wise layers where the hidden
size splits evenly (fewer DTensor ops on the host-bound step), a DTensor where it does not (only it
knows the global size of an uneven split). One process over a fake 2-rank group: the layouts are
decided when the plan is applied, and a column-wise forward needs no collective."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from fsdp_lab.models.mlp import MLPConfig
from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models import build_model, model_spec
from fsdp_lab.parallel.tp import apply_tp


@pytest.fixture
def tp_mesh(fake_group):
    fake_group(2)
    return init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))


@pytest.mark.parametrize("hidden,local", [(8, True), (7, False)], ids=["even-local", "uneven-dtensor"])
def test_hidden_layer_output_is_local_only_where_it_splits_evenly(tp_mesh, hidden, local):
    model = build_model(MLPConfig(dim=4, ffn_dim=hidden), seed=0)
    apply_tp(model, tp_mesh, model_spec("mlp").tp_plan(None, False), name="mlp", sequence_parallel=False)
    out = model.in_proj(torch.randn(3, 4))
    assert isinstance(out, DTensor) is not local
    assert out.shape == ((3, hidden // 2) if local else (3, hidden))  # a DTensor's shape is global


def test_every_block_of_the_transformer_plan_gets_local_hidden_outputs(tp_mesh):
    cfg = TransformerConfig(dim=8, n_heads=2, ffn_dim=12, n_layers=2, vocab_size=16)
    model = build_model(cfg, seed=0)
    apply_tp(model, tp_mesh, model_spec("transformer").tp_plan(cfg, False), name="transformer", sequence_parallel=False)
    x = torch.randn(1, 3, 8)
    for block in model.layers:
        for layer in (block.feed_forward.w1, block.feed_forward.w3):
            out = layer(x)
            assert not isinstance(out, DTensor) and out.shape == (1, 3, 6)
