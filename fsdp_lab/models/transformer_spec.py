"""The lab's transformer (fsdp_lab/models/transformer.py) as a ModelSpec: its TP plan, its pipeline
stage and what it refuses."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from fsdp_lab.config import ConfigError
from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.models.blocks import call_block
from fsdp_lab.models.spec import ModelSpec, TPPlan
from fsdp_lab.models.stage import Stage
from fsdp_lab.models.tp_styles import HiddenColwise
from fsdp_lab.models.transformer import Transformer


def tp_plan(cfg: TransformerConfig, sequence_parallel: bool) -> TPPlan:
    """Megatron-style: q/k/v and w1/w3 split by output (heads, hidden units), wo and w2 by input, so
    each attention or MLP costs one all-reduce each way; the embedding is split by vocabulary rows and
    the output by vocabulary columns, its logits gathered for the loss. With sequence parallelism the
    activations between those layers stay sharded along the sequence (dim 1), norms included."""
    seq = Shard(1) if sequence_parallel else Replicate()
    root: dict[str, object] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    block: dict[str, object] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "feed_forward.w1": HiddenColwise(),
        "feed_forward.w3": HiddenColwise(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        # The attention's and the MLP's input enters as one DTensor, so that in backward autograd sums
        # the gradients of q, k and v (w1 and w3) before one all-reduce, where each column-wise layer
        # taking a plain tensor would all-reduce its own. With sequence parallelism this is the
        # all-gather of the whole sequence on the way in (cos/sin pass as they are).
        "attention": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
        "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
    }
    if sequence_parallel:
        root["norm"] = SequenceParallel()
        block.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    return root, block


class TransformerStage(Stage):
    def __init__(self, model: nn.Module, layer_ids: list[int], whole: nn.Module, first: bool, last: bool, seq_len: int):
        super().__init__(model, layer_ids, whole)
        self.tok_embeddings = model.tok_embeddings if first else None
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.rotary, self.seq_len = model.rotary, seq_len

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        # From the configured length, not h: with sequence parallelism a stage receives only its shard.
        cos, sin = self.rotary.for_block(self.blocks[0], h.shape[0], self.seq_len, h.device, h.dtype)
        for i, layer in enumerate(self.blocks):
            h = call_block(self, i, layer, h, cos, sin)
        if self.output is not None:
            h = self.output(self.norm(h))
        return h


def check(cfg: TransformerConfig, run, dims, model: nn.Module) -> None:
    if cfg.dim % cfg.n_heads:
        raise ConfigError(f"model.n_heads={cfg.n_heads}: must divide model.dim={cfg.dim}")
    if dims.tp_enabled and cfg.n_heads % dims.tp:
        raise ConfigError(
            f"mesh.tp={dims.tp}: must divide model.n_heads={cfg.n_heads} (each rank computes whole heads of "
            f"model.dim={cfg.dim} = {cfg.n_heads} heads x {cfg.dim // cfg.n_heads})"
        )


SPEC = ModelSpec(
    name="transformer", config=TransformerConfig, build=Transformer, tp_plan=tp_plan, sequence_parallel=True,
    pipeline_stage=TransformerStage, tied=lambda cfg: cfg.tie_embeddings, check=check,
    # Its forward runs model.layer_order, which a cut block list would outrun.
    with_blocks=lambda cfg, n: dataclasses.replace(cfg, n_layers=n, layer_order=None),
)
