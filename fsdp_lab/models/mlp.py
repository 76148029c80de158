"""The MLPs of PyTorch's FSDP tests: `MLP` (in_proj -> relu -> out_proj) and `MLPStack`, a stack of
them; odd sizes are allowed, which exercises FSDP's padding of uneven shards."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
import torch.nn.functional as F

from fsdp_lab.config import ConfigError, ModelConfig, bounded
from fsdp_lab.models.blocks import call_block, repeated_block_params
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.models.stage import Stage
from fsdp_lab.models.tp_styles import mlp_pair


@dataclass
class MLPConfig(ModelConfig):
    name: str = "mlp"
    dim: int = bounded(16, ge=1)
    """Input features, which are also the output classes."""
    ffn_dim: int = bounded(64, ge=1)
    """Hidden units; odd sizes allowed (uneven shards)."""


@dataclass
class MLPStackConfig(MLPConfig):
    name: str = "mlp_stack"
    n_layers: int = bounded(3, ge=1)
    """MLPs in sequence, each a block."""
    layer_order: Optional[list[int]] = None
    """The blocks' call order in forward, repeats allowed; null = each block once, in order."""


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.in_proj = nn.Linear(dim, hidden)
        self.out_proj = nn.Linear(hidden, dim)

    @classmethod
    def from_config(cls, cfg: MLPConfig) -> MLP:
        return cls(cfg.dim, cfg.ffn_dim)

    @property
    def blocks(self) -> list[nn.Module]:
        return []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.relu(self.in_proj(x)))

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        dim = self.in_proj.in_features
        inputs = torch.randn(batch_size, dim, generator=generator)
        return inputs, torch.randint(0, dim, (batch_size,), generator=generator)

    def tokens_per_sample(self, seq_len: int) -> int:
        return 1

    def flops_per_token(self, seq_len: int) -> float:
        return 6.0 * sum(p.numel() for p in self.parameters())


class MLPStack(MLP):
    """`n_layers` MLPs in sequence; each is a block."""

    def __init__(self, dim: int, hidden: int, n_layers: int, layer_order: list[int] | None = None):
        nn.Module.__init__(self)
        self.layers = nn.ModuleList(MLP(dim, hidden) for _ in range(n_layers))
        self.layer_order = list(layer_order or range(n_layers))

    @classmethod
    def from_config(cls, cfg: MLPStackConfig) -> MLPStack:
        return cls(cfg.dim, cfg.ffn_dim, cfg.n_layers, cfg.layer_order)

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    @property
    def in_proj(self) -> nn.Linear:
        return self.layers[0].in_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.layer_order:
            x = call_block(self, i, self.layers[i], x)
        return x

    def flops_per_token(self, seq_len: int) -> float:
        return super().flops_per_token(seq_len) + 6.0 * repeated_block_params(self)


class MLPStackStage(Stage):
    def __init__(self, model: nn.Module, layer_ids: list[int], whole: nn.Module, first: bool, last: bool, seq_len: int):
        super().__init__(model, layer_ids, whole)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.blocks):
            x = call_block(self, i, layer, x)
        return x


def check_stack(cfg: MLPStackConfig, run, dims, model: nn.Module) -> None:
    if run.ac.reentrant:
        raise ConfigError(
            "ac.reentrant=true with model=mlp_stack: its first block takes the raw inputs, which need no "
            "gradient, so reentrant checkpointing would drop that block's gradients; allowed: ac.reentrant=false"
        )


MLP_SPEC = ModelSpec(name="mlp", config=MLPConfig, build=MLP.from_config, tp_plan=lambda cfg, sp: (mlp_pair(), {}))
MLP_STACK_SPEC = ModelSpec(
    name="mlp_stack", config=MLPStackConfig, build=MLPStack.from_config, tp_plan=lambda cfg, sp: ({}, mlp_pair()),
    pipeline_stage=MLPStackStage, standalone_block=True, check=check_stack,
    # Its forward walks n_layers blocks: fewer blocks are a config with fewer layers, not a cut list.
    with_blocks=lambda cfg, n: dataclasses.replace(cfg, n_layers=n, layer_order=None),
)
