"""The TP plan's hidden layers: local tensors between the column- and row-wise layers where the hidden
size splits evenly (fewer DTensor ops on the host-bound step), a DTensor where it does not (only it
knows the global size of an uneven split). One process over a fake 2-rank group: the layouts are
decided when the plan is applied, and a column-wise forward needs no collective. And what the plan's
collectives are: one all-reduce per attention and per MLP each way, as the plan's step time prices them."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from fsdp_lab.config import Float8Config
from fsdp_lab.models.hf import HFConfig
from fsdp_lab.models.hf_families import tiny_config
from fsdp_lab.models.mlp import MLPConfig, MLPStackConfig
from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models import build_model, model_spec
from fsdp_lab.parallel.float8 import apply_float8, float8_plan
from fsdp_lab.parallel.tp import apply_tp, block_all_reduces


def all_reduces(forward) -> tuple[int, int]:
    """(forward, backward) all-reduces CommDebugMode counts: `forward()` gives a tensor to sum and backpropagate."""
    in_forward, in_backward = CommDebugMode(), CommDebugMode()
    with in_forward:
        loss = forward().float().sum()
    with in_backward:
        loss.backward()
    op = torch.ops.c10d_functional.all_reduce
    return in_forward.get_comm_counts()[op], in_backward.get_comm_counts()[op]


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


def test_a_block_all_reduces_once_per_attention_and_mlp_each_way(tp_mesh):
    """Megatron's f and g: the row-wise outputs all-reduced in forward; in backward, the gradients of the
    attention's (and the MLP's) input summed over q, k and v (w1 and w3) before one all-reduce, not one
    per column-wise layer (at 8B, 224 all-reduces a step in the blocks instead of 128: 21 ms a step on 4xH100)."""
    cfg = TransformerConfig(dim=8, n_heads=2, ffn_dim=12, n_layers=2, vocab_size=16)
    model = build_model(cfg, seed=0)
    apply_tp(model, tp_mesh, model_spec("transformer").tp_plan(cfg, False), name="transformer", sequence_parallel=False)
    block, cos, sin = model.layers[0], *model.rotary.for_block(model.layers[0], 1, 3, torch.device("cpu"), torch.float32)
    x = torch.randn(1, 3, 8, requires_grad=True)
    assert all_reduces(lambda: block(x, cos, sin)) == (2, 2)
    assert x.grad is not None and x.grad.shape == x.shape
    assert block_all_reduces(model_spec("transformer").tp_plan(cfg, False)[1]) == (2, 2)  # what the plan prices


@pytest.mark.parametrize("family,cfg,per_block", [
    ("hf", HFConfig(model_type="llama", config=tiny_config("llama")), (2, 2)),
    ("hf", HFConfig(model_type="starcoder2", config=tiny_config("starcoder2")), (2, 2)),
    ("mlp_stack", MLPStackConfig(dim=4, ffn_dim=8, n_layers=2), (1, 1)),
], ids=["llama", "starcoder2", "mlp_stack"])
def test_a_familys_blocks_all_reduce_as_often_as_the_plan_counts(tp_mesh, family, cfg, per_block):
    """The same for other families, whole models: a transformers model under its own base_model_tp_plan
    (llama's attention (q, k, v) and MLP (gate, up) take their input replicated; starcoder2's MLP has one
    column-wise layer, which needs nothing), and a stack of MLPs (one column- and one row-wise layer a
    block). parallel/tp.block_all_reduces, which the plan's step time prices, counts the same."""
    model = build_model(cfg, seed=0)
    plan = model_spec(family).tp_plan(cfg, False)
    apply_tp(model, tp_mesh, plan, name=family, sequence_parallel=False)
    # The MLPs' input wants its gradient, as a block's input inside a model does (an embedding's output).
    inputs = torch.randint(0, 128, (1, 4)) if family == "hf" else torch.randn(3, 4, requires_grad=True)
    layers = len(model.blocks)
    assert all_reduces(lambda: model(inputs)) == (per_block[0] * layers, per_block[1] * layers)
    assert block_all_reduces(plan[1]) == per_block


@pytest.mark.parametrize("tp_scales,per_block", [("tensor", None), ("shard", (2, 2))])
def test_float8_with_shard_scales_leaves_only_the_plans_all_reduces(tp_mesh, tp_scales, per_block):
    """torchao casts a tensor-parallel shard as the whole DTensor, all-reducing its amax at every cast
    (at 8B on 2xH100, 931 all-reduces a step against bf16's 195); float8.tp_scales=shard casts the local
    shards and leaves the plan's own two each way."""
    cfg = TransformerConfig(dim=32, n_heads=2, ffn_dim=64, n_layers=1, vocab_size=16)
    model = build_model(cfg, seed=0)
    f8 = Float8Config(recipe="tensorwise", tp_scales=tp_scales)
    apply_float8(model, f8, torch.device("cpu"))
    apply_tp(model, tp_mesh, model_spec("transformer").tp_plan(cfg, False), name="transformer", sequence_parallel=False,
             styles=lambda module, p: float8_plan(module, p, f8))
    block, cos, sin = model.layers[0], *model.rotary.for_block(model.layers[0], 1, 16, torch.device("cpu"), torch.float32)
    x = torch.randn(1, 16, 32, requires_grad=True)
    counts = all_reduces(lambda: block(x, cos, sin))
    if per_block is None:
        assert counts[0] > 2 and counts[1] > 2, counts
    else:
        assert counts == per_block
    assert x.grad is not None and x.grad.shape == x.shape


def test_a_transformers_model_with_float8_shard_scales_all_reduces_as_bf16_does(tp_mesh):
    """The same through a transformers family's own plan (its column-wise inputs enter replicated via
    ReplicatedInput, its layers under PyTorch's styles): two all-reduces a block each way, as in bf16."""
    cfg = HFConfig(model_type="llama", config=tiny_config("llama"))
    model = build_model(cfg, seed=0)
    f8 = Float8Config(recipe="tensorwise", tp_scales="shard")
    apply_float8(model, f8, torch.device("cpu"))
    plan = model_spec("hf").tp_plan(cfg, False)
    apply_tp(model, tp_mesh, plan, name="hf", sequence_parallel=False, styles=lambda module, p: float8_plan(module, p, f8))
    layers = len(model.blocks)
    assert all_reduces(lambda: model(torch.randint(0, 128, (1, 16)))) == (2 * layers, 2 * layers)
