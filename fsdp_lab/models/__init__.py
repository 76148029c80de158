"""Model registry. Every model is an `nn.Module` with:
- `blocks`: the repeated units (the `block` wrap policy and activation checkpointing act on them),
  which its forward calls through `fsdp_lab.models.blocks.call_block` (ac.impl=manual hooks in there),
- `synthetic_batch(generator, batch_size, seq_len)`: deterministic (inputs, class targets) on CPU,
- `tokens_per_sample(seq_len)` and `flops_per_token(seq_len)` for throughput and MFU.
Every model returns logits and is trained with cross-entropy."""

from __future__ import annotations

import torch
from torch import nn

from fsdp_lab.config import ModelConfig
from fsdp_lab.models.convnet import ConvNet
from fsdp_lab.models.fine_tune import MultiTraversal, UnusedInput
from fsdp_lab.models.mlp import MLP, MLPStack
from fsdp_lab.models.transformer import Transformer
from fsdp_lab.models.vit import ViT

MODELS = {
    "mlp": MLP.from_config, "mlp_stack": MLPStack.from_config, "transformer": Transformer.from_config,
    "convnet": ConvNet.from_config, "unused_input": UnusedInput.from_config, "multi_traversal": MultiTraversal.from_config,
    "vit": ViT.from_config,
}


def build_model(cfg: ModelConfig, seed: int) -> nn.Module:
    """The model on CPU with weights drawn from `seed`, so every rank and the reference agree."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[cfg.name](cfg)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
