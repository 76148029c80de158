"""The transformer's rotary embedding: the same rotation of each (even, odd) pair as the textbook
pairwise form, bit for bit in the activations' dtype, with tables at the activations' shape,
computed once per run (tables for q's and k's heads, which the attention rotates together)."""

from __future__ import annotations

import pytest
import torch

from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models.transformer import RotaryTables, Transformer, apply_rotary


def pairwise_rotation(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(x1 cos - x2 sin, x1 sin + x2 cos) per pair, x: (batch, seq, heads, head_dim), angles in
    float32, products and sums in x's dtype."""
    seq, head_dim = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)[:, None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_rotary_is_the_pairwise_rotation_bit_for_bit(dtype):
    x = torch.randn(2, 37, 3, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    tables = RotaryTables(16)(2, 37, 3, x.device, dtype)
    assert all(t.shape == x.shape and t.is_contiguous() for t in tables), "laid out as x: no broadcasting"
    assert torch.equal(apply_rotary(x, *tables), pairwise_rotation(x))
    # Tables of another dtype are cast on the way in: the same result.
    assert torch.equal(apply_rotary(x, *RotaryTables(16)(2, 37, 3, x.device, torch.float32)), pairwise_rotation(x))


def test_the_tables_are_computed_once_per_length_device_and_dtype():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(dim=32, n_layers=2, n_heads=4, ffn_dim=64, vocab_size=50))
    tokens = torch.randint(0, 50, (2, 8))
    model(tokens).sum().backward()
    first = model.rotary(2, 8, 8, tokens.device, torch.float32)
    model(tokens)
    # One table for q's and k's 4 heads each, which the attention rotates together.
    assert list(model.rotary._tables) == [((2, 8, 8, 8), tokens.device, torch.float32)]
    assert all(a is b for a, b in zip(model.rotary(2, 8, 8, tokens.device, torch.float32), first))
