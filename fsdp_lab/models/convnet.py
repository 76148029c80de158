"""The conv/batch-norm model of PyTorch's FSDP memory test: a stem, `n_layers` conv-BN-ReLU blocks,
global pooling and a linear classifier."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fsdp_lab.config import ModelConfig, bounded
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.models.blocks import call_block


@dataclass
class ConvNetConfig(ModelConfig):
    name: str = "convnet"
    dim: int = bounded(16, ge=1)
    """Channels of every conv block."""
    n_layers: int = bounded(3, ge=1)
    """Conv blocks."""
    vocab_size: int = bounded(10, ge=2)
    """Output classes."""
    image_size: int = bounded(16, ge=1)
    """Square input side in pixels."""


class BatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d whose arithmetic runs in its running statistics' dtype, under the same class name
    (wrap.classes=[BatchNorm2d] and other names users give select it as before). Under FSDP2's mixed precision
    the weight and bias come in fsdp.param_dtype while the running statistics, buffers, stay float32, and
    batch_norm takes one dtype (FSDP1's mixed precision keeps batch norms in float32 for this reason; autocast
    runs them in float32). The output keeps the input's dtype. This model's batch norms track running
    statistics with a momentum, the case written out here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = self.running_mean.dtype
        if x.dtype == stats and self.weight.dtype == stats:
            return super().forward(x)
        if self.training:
            self.num_batches_tracked.add_(1)
        return F.batch_norm(x.to(stats), self.running_mean, self.running_var, self.weight.to(stats), self.bias.to(stats),
                            self.training, self.momentum, self.eps).to(x.dtype)


class ConvNet(nn.Module):
    def __init__(self, channels: int, n_layers: int, n_classes: int, image_size: int):
        super().__init__()
        self.image_size = image_size
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), BatchNorm2d(channels), nn.ReLU())
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), BatchNorm2d(channels), nn.ReLU())
            for _ in range(n_layers)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_classes))

    @classmethod
    def from_config(cls, cfg: ConvNetConfig) -> ConvNet:
        return cls(cfg.dim, cfg.n_layers, cfg.vocab_size, cfg.image_size)

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, layer in enumerate(self.layers):
            x = call_block(self, i, layer, x)
        return self.head(x)

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        side = self.image_size
        inputs = torch.randn(batch_size, 3, side, side, generator=generator)
        n_classes = self.head[-1].out_features
        return inputs, torch.randint(0, n_classes, (batch_size,), generator=generator)

    def tokens_per_sample(self, seq_len: int) -> int:
        return 1

    def flops_per_token(self, seq_len: int) -> float:
        # Each conv weight is applied at every pixel: 2 FLOPs per MAC, x3 for forward + backward.
        pixels = self.image_size**2
        conv = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Conv2d))
        return 6.0 * (conv * pixels + self.head[-1].weight.numel())


SPEC = ModelSpec(name="convnet", config=ConvNetConfig, build=ConvNet.from_config)
