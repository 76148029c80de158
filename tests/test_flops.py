"""FLOPs per token, the numerator of MFU: every block call counts, a block called twice twice."""

from __future__ import annotations

import pytest

from fsdp_lab.models import build_model, model_spec

SEQ = 16


def flops(name: str, **fields) -> tuple[float, object]:
    model = build_model(model_spec(name).config(**fields), seed=0)
    return model.flops_per_token(SEQ), model


def block_params(model) -> int:
    return sum(p.numel() for p in model.layers[0].parameters())


def test_transformer_counts_matmul_parameters_and_attention():
    value, model = flops("transformer", n_layers=2)
    matmul = sum(p.numel() for p in model.parameters()) - model.tok_embeddings.weight.numel()
    assert value == 6 * matmul + 12 * 2 * model.head_dim * model.n_heads * SEQ


@pytest.mark.parametrize("name", ["transformer", "mlp_stack"])
def test_a_block_called_twice_counts_twice(name):
    once, model = flops(name, n_layers=2)
    twice, _ = flops(name, n_layers=2, layer_order=[0, 0, 1])
    attention = 12 * model.head_dim * model.n_heads * SEQ if name == "transformer" else 0
    assert twice - once == 6 * block_params(model) + attention
