"""model=custom: any importable nn.Module, built by Hydra's instantiate from `model.build`
(`_target_` + keyword arguments), its blocks at `model.blocks`, its inputs `model.inputs`."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn

from fsdp_lab.config import ConfigError, ModelConfig, bounded, choice
from fsdp_lab.models.foreign import FeatureInputs, ForeignModel, TokenInputs, resolve_blocks
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.user_code import describe


@dataclass
class CustomConfig(ModelConfig):
    name: str = "custom"
    build: dict[str, Any] = field(default_factory=dict)
    """Hydra instantiate node: `_target_` (an importable nn.Module class or a function returning one)
    and its keyword arguments. The module maps the inputs to logits."""
    blocks: Optional[str] = None
    """Dotted attribute path to the repeated blocks (an nn.ModuleList or list of modules), e.g.
    transformer.h; null = no blocks (the root is the only FSDP unit)."""
    inputs: str = choice("tokens", "tokens", "features")
    """tokens: int ids < vocab_size of shape (batch, train.seq_len), logits (batch, seq, vocab), next-token
    targets; features: floats of shape (batch, *features), logits (batch, classes), class targets."""
    vocab_size: int = bounded(256, ge=2)
    """For inputs=tokens: the vocabulary."""
    features: list[int] = field(default_factory=lambda: [16])
    """For inputs=features: the shape of one sample."""
    classes: int = bounded(16, ge=2)
    """For inputs=features: the classes the logits score."""


def build(cfg: CustomConfig) -> ForeignModel:
    target = cfg.build.get("_target_")
    if not target:
        raise ConfigError("model.build._target_=null: name the module to build, e.g. model.build._target_=my_models.GPT")
    try:
        module = instantiate(cfg.build, _convert_="all")
    except InstantiationException as e:
        # Hydra's message ends with advice about HYDRA_FULL_ERROR; a failed call's reason is its cause.
        reason = describe(e) if str(e).startswith("Error in call") else _first_line(e).split(", set env var")[0]
        raise ConfigError(f"model.build._target_={target}: cannot be built ({reason})") from None
    if not isinstance(module, nn.Module):
        raise ConfigError(f"model.build._target_={target}: returned a {type(module).__name__}, not an nn.Module")
    try:
        resolve_blocks(module, cfg.blocks)
    except ValueError as e:
        raise ConfigError(f"model.blocks={cfg.blocks}: {e}") from None
    inputs = TokenInputs(cfg.vocab_size) if cfg.inputs == "tokens" else FeatureInputs(tuple(cfg.features), cfg.classes)
    return ForeignModel(module, cfg.blocks, inputs)


def _first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def check(cfg: CustomConfig, run, dims, model: ForeignModel) -> None:
    # The lab initialises a model built on the meta device module by module, the way PyTorch does.
    for name, module in model.inner.named_modules():
        if next(module.parameters(recurse=False), None) is not None and not hasattr(module, "reset_parameters"):
            raise ConfigError(
                f"model.build._target_={cfg.build['_target_']}: module {name or '(root)'} ({type(module).__name__}) holds "
                "parameters but has no reset_parameters(), which the lab calls to initialise it from the seed"
            )
    _check_inputs(cfg, model, run.train.seq_len)


def _check_inputs(cfg: CustomConfig, model: ForeignModel, seq_len: int) -> None:
    """One forward on the meta device (no memory, no compute) of a batch of 2 the lab would feed."""
    x, _ = model.synthetic_batch(torch.Generator().manual_seed(0), 2, seq_len)
    what = (f"token ids < model.vocab_size={cfg.vocab_size} of shape {tuple(x.shape)}" if cfg.inputs == "tokens"
            else f"features of shape {tuple(x.shape)} (model.features={list(cfg.features)})")
    try:
        with torch.no_grad():
            logits = copy.deepcopy(model).to("meta")(x.to("meta"))
    except Exception as e:
        if "meta" in str(e).lower():  # an op the meta device cannot run: the ranks will tell
            return
        raise ConfigError(f"model.inputs={cfg.inputs}: the model rejects {what}: {type(e).__name__}: {_first_line(e)}") from None
    expected = model.inputs.expected_logits(2, seq_len)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        size = f"model.vocab_size={cfg.vocab_size}" if cfg.inputs == "tokens" else f"model.classes={cfg.classes}"
        raise ConfigError(f"model.inputs={cfg.inputs}: for {what} the model returns logits {shape}; expected {expected} ({size})")


SPEC = ModelSpec(name="custom", config=CustomConfig, build=build, manual_ac=False, check=check, outside_config=lambda cfg: None)
