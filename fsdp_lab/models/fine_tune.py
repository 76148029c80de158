"""The fine-tuning models of PyTorch's test_fsdp_fine_tune, as classifiers over `dim` features; every
linear is a block (one FSDP unit each with wrap=block), the experiment freezes one of them.

- `UnusedInput` (ModelUnusedInput): three linears, each also handed an input it ignores; with
  `layer1_frozen` frozen and inputs that need no gradient, that unit's output has no autograd graph,
  so FSDP1 reshards it in backward through its reshard-only hook, never having unsharded it there.
- `MultiTraversal` (the multi-traversal module): `layer_with_grad` runs several times per forward,
  once of each pair under no_grad, next to a frozen `layer_no_grad`: FSDP must unshard and reshard
  the same unit again and again within one forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fsdp_lab.config import ModelConfig, bounded
from fsdp_lab.models.blocks import call_block
from fsdp_lab.models.mlp import MLP
from fsdp_lab.models.spec import ModelSpec


@dataclass
class UnusedInputConfig(ModelConfig):
    name: str = "unused_input"
    dim: int = bounded(4, ge=1)
    """Features in and out of each of the three linears."""


@dataclass
class MultiTraversalConfig(ModelConfig):
    name: str = "multi_traversal"
    dim: int = bounded(5, ge=1)
    """Features in and out of each linear."""
    n_layers: int = bounded(10, ge=1)
    """Iterations of the forward's loop (each runs layer_with_grad twice)."""


class LinearUnusedInput(nn.Linear):
    def forward(self, used: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
        return super().forward(used)


class FineTuneModel(MLP):
    """MLP's batches, tokens and FLOPs, over the linears named in `block_names` (PyTorch's names, so
    the experiments' freeze patterns read as in the test); the first one reads the input."""

    block_names: tuple[str, ...]

    @property
    def blocks(self) -> list[nn.Module]:
        return [getattr(self, name) for name in self.block_names]

    @property
    def in_proj(self) -> nn.Linear:
        return self.blocks[0]


class UnusedInput(FineTuneModel):
    block_names = ("layer0", "layer1_frozen", "layer2")

    def __init__(self, dim: int):
        nn.Module.__init__(self)
        self.layer0 = LinearUnusedInput(dim, dim)
        self.layer1_frozen = LinearUnusedInput(dim, dim)
        self.layer2 = LinearUnusedInput(dim, dim)

    @classmethod
    def from_config(cls, cfg: UnusedInputConfig) -> UnusedInput:
        return cls(cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # 4 x dim logits: the three outputs and the input itself, as the test concatenates them.
        return torch.cat([*(call_block(self, i, layer, x, x) for i, layer in enumerate(self.blocks)), x], dim=-1)


class MultiTraversal(FineTuneModel):
    block_names = ("layer_0", "layer_no_grad", "layer_with_grad")

    def __init__(self, dim: int, traversals: int):
        nn.Module.__init__(self)
        self.layer_0 = nn.Linear(dim, dim)
        self.layer_no_grad = nn.Linear(dim, dim)
        self.layer_with_grad = nn.Linear(dim, dim)
        self.traversals = traversals

    @classmethod
    def from_config(cls, cfg: MultiTraversalConfig) -> MultiTraversal:
        return cls(cfg.dim, cfg.n_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = call_block(self, 0, self.layer_0, x)
        for _ in range(self.traversals):
            x = call_block(self, 1, self.layer_no_grad, call_block(self, 2, self.layer_with_grad, x))
            with torch.no_grad():
                x += call_block(self, 2, self.layer_with_grad, x)
        return x


UNUSED_INPUT_SPEC = ModelSpec(name="unused_input", config=UnusedInputConfig, build=UnusedInput.from_config)
MULTI_TRAVERSAL_SPEC = ModelSpec(name="multi_traversal", config=MultiTraversalConfig, build=MultiTraversal.from_config)
