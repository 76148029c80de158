"""Model registry: every model family is a ModelSpec (fsdp_lab/models/spec.py), registered here by
name. A new family is one module (its config dataclass, module and spec) plus one line in SPECS.

Every model is built with its parameters on the meta device and materialised later, module by
module, from the run's seed (fsdp_lab/models/init.py); it returns logits and trains with
cross-entropy."""

from __future__ import annotations

import torch
from torch import nn

from fsdp_lab.config import ConfigError, ModelConfig
from fsdp_lab.models import convnet, custom, fine_tune, hf, mlp, transformer_spec, vit
from fsdp_lab.models.depth import cut_to_kept, kept_blocks
from fsdp_lab.models.init import Materializer, meta_parameters
from fsdp_lab.models.spec import ModelSpec

SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    transformer_spec.SPEC, mlp.MLP_SPEC, mlp.MLP_STACK_SPEC, convnet.SPEC, fine_tune.UNUSED_INPUT_SPEC,
    fine_tune.MULTI_TRAVERSAL_SPEC, vit.SPEC, custom.SPEC, hf.SPEC,
)}


def model_spec(name: str) -> ModelSpec:
    if name not in SPECS:
        raise ConfigError(f"model.name={name}: allowed are {', '.join(SPECS)}")
    return SPECS[name]


def build_plain(cfg: ModelConfig) -> nn.Module:
    """The model as its family builds it, on the default device with the family's own (unseeded)
    initialisation: for mode=estimate, whose FakeTensorMode makes every tensor fake. Inside
    fsdp_lab.models.depth.blocks_kept(n), its first n blocks only."""
    spec = model_spec(cfg.name)
    n = kept_blocks()
    if n is not None and spec.with_blocks is not None:
        return spec.build(spec.with_blocks(cfg, n))
    return cut_to_kept(spec.build(cfg))


def build_meta(cfg: ModelConfig) -> nn.Module:
    """The model with its parameters on the meta device (no memory, no initialisation)."""
    with meta_parameters():
        return build_plain(cfg)


def materializer(model: nn.Module, cfg: ModelConfig, seed: int) -> Materializer:
    """Initialises `model` (from build_meta), or any sharded or wrapped form of it, from `seed`."""
    spec = model_spec(cfg.name)
    return Materializer(model, seed, spec.init_module, load=None if spec.load is None else (lambda m: spec.load(cfg, m)))


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> nn.Module:
    """The whole model on `device`, initialised from `seed` as every sharded run of it is."""
    model = build_meta(cfg)
    materializer(model, cfg, seed).materialise(model, torch.device(device))
    return model


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def families_with(capability: str) -> str:
    """The model families that have `capability` (a ModelSpec field)."""
    return ", ".join(sorted(name for name, spec in SPECS.items() if getattr(spec, capability)))
