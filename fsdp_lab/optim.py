"""Optimizers. Fused kernels on GPU: one launch per step instead of one per parameter."""

from __future__ import annotations

import torch

from fsdp_lab.config import OptimConfig


def build_optimizer(params, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=cfg.foreach)
    cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    fused = device.type == "cuda" and cfg.foreach is None
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach, fused=fused or None)
