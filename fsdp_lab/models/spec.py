"""A model as the rest of the lab sees it: a `ModelSpec` of functions and capabilities, registered
by name in fsdp_lab/models/__init__.py. Wrapping, activation checkpointing, TP, pipelining,
validation, the estimate and MFU ask the spec (or the module it builds); no model name is tested
outside the model's own files.

The module `build` returns follows the `LabModel` protocol (the lab's own models implement it;
`custom` and `hf` adapt a user's module to it, fsdp_lab/models/foreign.py). It is built with its
parameters on the meta device and its buffers real (fsdp_lab/models/init.py), then sharded, then
materialised module by module from the seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch
from torch import nn

# A tensor-parallel plan: (the root's own modules, every block's modules), path -> ParallelStyle.
TPPlan = tuple[dict[str, object], dict[str, object]]


class LabModel(Protocol):
    """What the lab calls on a built model."""

    @property
    def blocks(self) -> list[nn.Module]:
        """The repeated units: the `block` wrap policy, activation checkpointing, TP and pipeline
        stages act on them."""

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic (inputs, class targets) on CPU; forward(inputs) returns logits whose last
        dimension scores the targets (cross-entropy)."""

    def tokens_per_sample(self, seq_len: int) -> int:
        """Tokens (or 1 for a sample that is not a sequence) per sample, for throughput."""

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token, for MFU."""


def _no_check(cfg: Any, run: Any, dims: Any, model: nn.Module) -> None:
    pass


def _untied(cfg: Any) -> bool:
    return False


def _nothing_outside(cfg: Any) -> str:
    return ""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    """The value of model.name (and conf/model/NAME.yaml)."""
    config: type
    """Its config dataclass, a subclass of fsdp_lab.config.ModelConfig."""
    build: Callable[[Any], nn.Module]
    """config -> LabModel; called under fsdp_lab.models.init.meta_parameters."""
    init_module: Callable[[nn.Module, nn.Module], None] = lambda model, module: module.reset_parameters()
    """(model, module): initialise `module`'s own parameters (and buffers) in place from the global
    RNG, which the lab seeds per module; by default the module's reset_parameters()."""
    tp_plan: Optional[Callable[[Any, bool], TPPlan]] = None
    """(config, sequence_parallel) -> plan; None = no tensor parallelism."""
    sequence_parallel: bool = False
    """Its TP plan can shard activations along the sequence (mesh.sequence_parallel)."""
    pipeline_stage: Optional[type] = None
    """A fsdp_lab.parallel.stage.Stage subclass running some of its blocks; None = no pipelining."""
    manual_ac: bool = True
    """Its forward calls its blocks through fsdp_lab.models.blocks.call_block (ac.impl=manual)."""
    standalone_block: bool = False
    """A block takes the model's inputs and returns logits (train.standalone_layer)."""
    tied: Callable[[Any], bool] = _untied
    """config -> whether the input embedding and the output projection share their weight."""
    tied_key: str = "model.tie_embeddings"
    """The config key that ties them, for the messages that refuse what tying breaks."""
    check: Callable[[Any, Any, Any, nn.Module], None] = _no_check
    """(config, run, dims, model on meta) -> raise ConfigError for what this family refuses."""
    load: Optional[Callable[[Any, nn.Module], None]] = None
    """(config, materialised model, possibly sharded) -> overwrite its local shards with trained
    weights (model.pretrained); None = the seed's initialisation stands."""
    outside_config: Callable[[Any], Optional[str]] = _nothing_outside
    """config -> what defines the model beyond its config and the lab's own source, as text that
    layout=auto's kept choices are keyed on (fsdp_lab/layout_cache.py); None = code the lab cannot
    see (a user's module), whose runs always plan."""
    with_blocks: Optional[Callable[[Any, int], Any]] = None
    """(config, n) -> the same model's config with its first n blocks (mode=plan traces a few blocks);
    None = the model is built whole and its block list cut (fsdp_lab/models/depth.py)."""
