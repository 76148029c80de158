"""The shape of PyTorch's test_register_fsdp_forward_method (the ViT case of pytorch#109385): the
model's forward calls `encoder.forward_features`, a method of a submodule that is not its forward.
FSDP2 unshards a unit around `forward` only, so the method is registered with
`register_fsdp_forward_method` (parallel/fsdp2.py does it for every unit naming
`fsdp_forward_methods`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fsdp_lab.config import ConfigError, ModelConfig, bounded
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.models.mlp import MLP


@dataclass
class ViTConfig(ModelConfig):
    name: str = "vit"
    dim: int = bounded(16, ge=1)
    """Patch embedding width."""
    ffn_dim: int = bounded(32, ge=1)
    """Hidden units of the encoder's MLP."""
    vocab_size: int = bounded(10, ge=2)
    """Output classes."""
    image_size: int = bounded(16, ge=4)
    """Square input side in pixels (patches of 4)."""


PATCH = 4


class PatchEncoder(nn.Module):
    fsdp_forward_methods = ("forward_features",)

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.patch_proj = nn.Conv2d(3, dim, kernel_size=PATCH, stride=PATCH)
        self.mlp = MLP(dim, hidden)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """(batch, patches, dim) embeddings of the image's patches."""
        patches = self.patch_proj(images).flatten(2).transpose(1, 2)
        return patches + self.mlp(patches)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_features(images).sum(dim=1)


class ViT(nn.Module):
    def __init__(self, dim: int, hidden: int, n_classes: int, image_size: int):
        super().__init__()
        self.image_size = image_size
        self.encoder = PatchEncoder(dim, hidden)
        self.head = nn.Linear(dim, n_classes)

    @classmethod
    def from_config(cls, cfg: ViTConfig) -> ViT:
        return cls(cfg.dim, cfg.ffn_dim, cfg.vocab_size, cfg.image_size)

    @property
    def blocks(self) -> list[nn.Module]:
        return [self.encoder, self.head]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.forward_features(images).mean(dim=1))

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        images = torch.randn(batch_size, 3, self.image_size, self.image_size, generator=generator)
        return images, torch.randint(0, self.head.out_features, (batch_size,), generator=generator)

    def tokens_per_sample(self, seq_len: int) -> int:
        return 1

    def flops_per_token(self, seq_len: int) -> float:
        patches = (self.image_size // PATCH) ** 2
        return 6.0 * patches * sum(p.numel() for p in self.encoder.parameters()) + 6.0 * self.head.weight.numel()


def check(cfg: ViTConfig, run, dims, model: nn.Module) -> None:
    if run.mesh.engine == "fsdp1":
        raise ConfigError("model.name=vit with mesh.engine=fsdp1: FSDP1 unshards a unit around forward only, not around encoder.forward_features; allowed: mesh.engine=fsdp2|ddp")
    if run.ac.mode != "none":
        raise ConfigError(f"ac.mode={run.ac.mode} with model.name=vit: its encoder runs through forward_features, which activation checkpointing does not wrap; allowed: ac=none")


SPEC = ModelSpec(name="vit", config=ViTConfig, build=ViT.from_config, manual_ac=False, check=check)
